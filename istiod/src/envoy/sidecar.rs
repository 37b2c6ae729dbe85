//! Envoy configuration for sidecars, in the shape of istiod's (see `docs/sidecars.md`):
//!
//! - the outbound side, shared by the sidecars of one namespace: listener `virtualOutbound` on
//!   15001 (original destination; unknown destinations pass through, 15001 itself is a black
//!   hole), a listener per HTTP port `0.0.0.0_<port>` whose routes (RDS `<port>`) have a virtual
//!   host per service, a listener per TCP service address `<vip>_<port>`, and a cluster
//!   `outbound|<port>|<subset>|<host>` per service port (EDS, Istio mutual TLS to endpoints
//!   with a sidecar);
//! - the inbound side, per workload: listener `virtualInbound` on 15006 with a filter chain per
//!   port as its PeerAuthentication says (STRICT, PERMISSIVE, DISABLE), the workload's
//!   AuthorizationPolicies and RequestAuthentications, and clusters `inbound|<port>||` that
//!   hand the connection to the application from 127.0.0.6.

mod gateway;
mod inbound;
mod outbound;
mod scope;

use std::collections::BTreeMap;
use std::sync::Arc;

use mesh_proto::type_url;
use mesh_xds::{Resource, ResourceMap};
use serde::Serialize;

pub use gateway::{binds as vs_binds_gateway, BoundServer, Credential, GatewayInputs};
pub use inbound::{InboundEndpoint, InboundPort, PeerMode, SidecarInputs};
pub use scope::{validate_sidecar, IngressEndpoint, IngressPort, SidecarScope};

use super::inputs::WaypointInputs;
use super::routes::RouteError;
use super::ProxyResources;

/// The Envoy types a sidecar is served, in istiod's push order.
pub const SIDECAR_TYPES: [&str; 4] = [
    type_url::CLUSTER,
    type_url::ENDPOINT,
    type_url::LISTENER,
    type_url::ROUTE,
];

/// A sidecar: its pod's namespace and name.
pub type SidecarKey = super::WaypointKey;

/// Problems in a sidecar's inbound configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SidecarError {
    #[error("PeerAuthentication {policy}: portLevelMtls names port {port}, which workload {workload} does not serve; the setting has no effect")]
    UnknownMtlsPort {
        policy: String,
        port: u16,
        workload: String,
    },
    #[error("Gateway {gateway}: {field}: {problem}")]
    Gateway {
        gateway: String,
        field: String,
        problem: String,
    },
    #[error("Sidecar {sidecar}: {field}: {problem}")]
    Resource {
        sidecar: String,
        field: String,
        problem: String,
    },
}

/// What a sidecar whose pod is not known is served: nothing of each type.
pub fn empty() -> ProxyResources {
    Builder::new().finish(0, Vec::new())
}

/// Generates the outbound side for the sidecars of one namespace from `inputs` (flavor
/// [`super::Flavor::Sidecar`], every service the namespace may call).
pub fn generate_outbound(inputs: &WaypointInputs, version: u64) -> ProxyResources {
    let mut errors = Vec::new();
    let mut out = Builder::new();
    outbound::generate(inputs, &mut out, &mut errors);
    out.finish(version, errors)
}

/// One sidecar's configuration: `outbound` (its namespace's, shared) with its own inbound side.
pub fn generate_sidecar(
    outbound: &ProxyResources,
    inputs: &SidecarInputs,
    version: u64,
) -> ProxyResources {
    let mut errors = outbound.errors.clone();
    let mut out = Builder::from(outbound);
    inbound::generate(inputs, &mut out, &mut errors);
    out.finish(version, errors)
}

/// A gateway proxy's configuration: the clusters and endpoints of `outbound` (a sidecar's
/// outbound side for its namespace) with the listeners and routes of its Gateways' servers.
pub fn generate_gateway(
    outbound: &ProxyResources,
    inputs: &GatewayInputs,
    version: u64,
) -> ProxyResources {
    let mut errors = Vec::new();
    let mut out = Builder::from(outbound);
    out.by_type.insert(type_url::SECRET, ResourceMap::new());
    gateway::outbound_part(&mut out);
    gateway::generate(inputs, &mut out, &mut errors);
    out.finish(version, errors)
}

/// Resources by type, as they are generated.
struct Builder {
    by_type: BTreeMap<&'static str, ResourceMap>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            by_type: SIDECAR_TYPES
                .iter()
                .map(|t| (*t, ResourceMap::new()))
                .collect(),
        }
    }

    /// Starts from `base`'s resources (shared, structurally).
    fn from(base: &ProxyResources) -> Builder {
        let mut b = Builder::new();
        for (t, map) in &base.by_type {
            b.by_type.insert(t, map.clone());
        }
        b
    }

    fn put<M: prost::Message>(&mut self, type_url: &'static str, name: &str, message: &M) {
        let res = Resource::from_encoded(
            type_url,
            name.to_string(),
            Vec::new(),
            super::any::encode(message),
        );
        if let Some(map) = self.by_type.get_mut(type_url) {
            map.insert(name.to_string(), Arc::new(res));
        }
    }

    /// Keeps the resources of `type_url` whose name `keep` accepts.
    fn retain(&mut self, type_url: &'static str, keep: impl Fn(&str) -> bool) {
        if let Some(map) = self.by_type.get_mut(type_url) {
            let drop: Vec<String> = map.keys().filter(|n| !keep(n)).cloned().collect();
            for name in drop {
                map.remove(&name);
            }
        }
    }

    fn finish(self, version: u64, errors: Vec<RouteError>) -> ProxyResources {
        ProxyResources {
            changed_in: version,
            by_type: self.by_type,
            errors,
        }
    }
}

#[cfg(test)]
mod tests;
