//! Envoy configuration for waypoints: pure generators from [`WaypointInputs`] (the services bound
//! to one waypoint, their endpoints, routes and policies) to pre-encoded CDS, EDS and LDS
//! resources that a standard Envoy 1.40 accepts.
//!
//! The shape follows istiod's waypoint configuration (see `docs/waypoints.md`):
//! - listener `connect_terminate` on `0.0.0.0:15008` terminates HBONE (mTLS with the
//!   waypoint's certificate from SDS, HTTP/2 CONNECT), records the CONNECT authority and the
//!   peer's identity in filter state and hands the stream to `main_internal`;
//! - internal listener `main_internal` restores the original destination (the service VIP and
//!   port from the authority) and picks a filter chain per VIP and port: an HTTP connection
//!   manager with an inline route configuration, or a TCP proxy;
//! - clusters `inbound-vip|<port>|<http|tcp>|<fqdn>` (EDS) whose endpoints are internal
//!   addresses of `connect_originate`, each carrying the pod's `ip:targetPort`;
//! - internal listener `connect_originate` tunnels to the pod's ztunnel on `ip:15008` with the
//!   waypoint's own certificate (cluster `connect_originate`, ORIGINAL_DST).
//!
//! Istio's own filters (`istio.stats`, peer metadata, `istio.hashable_string`) are not in a
//! standard Envoy build; their plain equivalents are used instead (`envoy.hashable_string`
//! filter state, Envoy's native stats and access logs).

mod any;
mod clusters;
mod destination_rule;
mod grpc_route;
mod inputs;
mod jwt;
mod listeners;
mod rbac;
mod routes;
pub mod sidecar;
mod tcp_route;
mod telemetry;
mod tls;
mod virtual_service;

use std::collections::BTreeMap;
use std::sync::Arc;

use mesh_proto::type_url;
use mesh_xds::{Resource, ResourceMap};

pub use inputs::{
    Attached, BoundService, Endpoint, Flavor, Protocol, ServicePort, WaypointInputs, WaypointKey,
    WaypointPolicy, WaypointRequestAuthn,
};
pub use jwt::{validate as validate_request_authentication, AuthnError};
pub use rbac::PolicyError;
pub use routes::RouteError;

/// The HBONE port a waypoint listens on and dials pods at.
pub const HBONE_PORT: u16 = mesh_capture::HBONE_PORT;
/// Listener and cluster names, as istiod names them (tools and dashboards look for them).
pub use telemetry::ISTIO_TEXT_FORMAT;
pub use virtual_service::{host_names as vs_host_names, resolve_host as vs_resolve_host};

pub mod names {
    pub const CONNECT_TERMINATE: &str = "connect_terminate";
    pub const MAIN_INTERNAL: &str = "main_internal";
    pub const CONNECT_ORIGINATE: &str = "connect_originate";
    pub const ENCAP: &str = "encap";
    /// The SDS secret of the proxy's own certificate, and of the mesh roots.
    pub const SECRET_DEFAULT: &str = "default";
    pub const SECRET_ROOTCA: &str = "ROOTCA";
    /// The bootstrap's static cluster that serves SDS (pilot-agent's unix socket).
    pub const SDS_CLUSTER: &str = "sds-grpc";
    /// Filter-state keys: the original destination for `main_internal`, and Istio's own keys.
    pub const FS_ORIGINAL_DST_LOCAL: &str = "envoy.filters.listener.original_dst.local_ip";
    pub const FS_ORIGINAL_DST_REMOTE: &str = "envoy.filters.listener.original_dst.remote_ip";
    pub const FS_CONNECT_AUTHORITY: &str = "io.istio.connect_authority";
    pub const FS_PEER_PRINCIPAL: &str = "io.istio.peer_principal";
    pub const FS_LOCAL_PRINCIPAL: &str = "io.istio.local_principal";
    /// Endpoint metadata namespace read by `original_dst` on internal listeners.
    pub const ORIGINAL_DST_METADATA: &str = "envoy.filters.listener.original_dst";
    /// Endpoint metadata Istio attaches (`istio.workload`), and the identity beside it.
    pub const ISTIO_METADATA: &str = "istio";
    pub const WORKLOAD_METADATA_KEY: &str = "workload";
    pub const PRINCIPAL_METADATA_KEY: &str = "principal";
    /// A sidecar's transport socket matches: endpoint metadata
    /// `envoy.transport_socket_match: {tlsMode: istio|disabled}` picks Istio mutual TLS or plain.
    pub const TRANSPORT_SOCKET_MATCH_METADATA: &str = "envoy.transport_socket_match";
    pub const TLS_MODE_KEY: &str = "tlsMode";
    pub const TLS_MODE_ISTIO: &str = "istio";
    pub const TLS_MODE_DISABLED: &str = "disabled";
    pub const TLS_MODE_ISTIO_MATCH: &str = "tlsMode-istio";
    /// Endpoints a sidecar reaches through HBONE: `envoy.transport_socket_match: {tunnel: http}`.
    pub const HBONE_MATCH: &str = "hbone";
    pub const TUNNEL_KEY: &str = "tunnel";
    pub const TUNNEL_HTTP: &str = "http";
    pub const TLS_MODE_DISABLED_MATCH: &str = "tlsMode-disabled";
    /// The pod label Istio's injector sets on pods with a sidecar.
    pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
    /// A sidecar's special clusters and listeners, as Istio names them.
    pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
    pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
    pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
    pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
    pub const VIRTUAL_INBOUND: &str = "virtualInbound";
    /// The bootstrap's static cluster of pilot-agent's access log service (request metrics).
    pub const TELEMETRY_CLUSTER: &str = "agent-telemetry";
    /// The access log name and custom tags the agent reads.
    pub const TELEMETRY_LOG_NAME: &str = "waypoint";
    pub const TAG_DESTINATION_SERVICE: &str = "destination_service";
    pub const TAG_DESTINATION_WORKLOAD: &str = "destination_workload";
    pub const TAG_DESTINATION_PRINCIPAL: &str = "destination_principal";
    /// Which side a sidecar chain reports (`source`, `destination`) and its security policy.
    pub const TAG_REPORTER: &str = "reporter";
    pub const TAG_SECURITY_POLICY: &str = "connection_security_policy";

    /// `inbound-vip|<port>|<http|tcp>|<hostname>`.
    pub fn vip_cluster(port: u16, protocol: &str, hostname: &str) -> String {
        format!("inbound-vip|{port}|{protocol}|{hostname}")
    }

    /// `outbound|<port>|<subset>|<hostname>`: a sidecar's cluster of a service port (the subset
    /// empty for the whole service).
    pub fn outbound_cluster(port: u16, subset: &str, hostname: &str) -> String {
        format!("outbound|{port}|{subset}|{hostname}")
    }

    /// `inbound|<port>||`: a sidecar's cluster of its own workload's port.
    pub fn inbound_cluster(port: u16) -> String {
        format!("inbound|{port}||")
    }

    /// `inbound-vip|<port>|<http|tcp>/<subset>|<hostname>`: a DestinationRule subset.
    pub fn vip_subset_cluster(port: u16, protocol: &str, subset: &str, hostname: &str) -> String {
        format!("inbound-vip|{port}|{protocol}/{subset}|{hostname}")
    }
}

/// Everything one proxy is served, by type URL. Built once per change of the proxy's scope and
/// shared by every connection of that proxy (all replicas of a waypoint).
#[derive(Debug, Clone, Default)]
pub struct ProxyResources {
    /// The snapshot version in which these resources last changed.
    pub changed_in: u64,
    pub by_type: BTreeMap<&'static str, ResourceMap>,
    /// Problems found while generating (the offending part is left out).
    pub errors: Vec<RouteError>,
}

impl ProxyResources {
    /// The resources of one type (an empty map for types this proxy gets none of).
    pub fn get(&self, type_url: &str) -> Option<&ResourceMap> {
        self.by_type.get(type_url)
    }

    /// Whether the encoded resources equal `other`'s (versions are content hashes).
    pub fn same_content(&self, other: &ProxyResources) -> bool {
        self.by_type.len() == other.by_type.len()
            && self.by_type.iter().all(|(t, map)| {
                other.by_type.get(t).is_some_and(|o| {
                    o.len() == map.len()
                        && map
                            .iter()
                            .zip(o.iter())
                            .all(|((a, ra), (b, rb))| a == b && ra.version == rb.version)
                })
            })
            && self.errors == other.errors
    }
}

/// The Envoy types a waypoint is served, in istiod's push order.
pub const WAYPOINT_TYPES: [&str; 4] = [
    type_url::CLUSTER,
    type_url::ENDPOINT,
    type_url::LISTENER,
    type_url::ROUTE,
];

/// Generates a waypoint's configuration.
pub fn generate_waypoint(inputs: &WaypointInputs, version: u64) -> ProxyResources {
    let mut errors = Vec::new();
    let hashes = destination_rule::hash_policy_index(inputs);
    let services: Vec<routes::ServiceRoutes> = inputs
        .services
        .iter()
        .map(|svc| routes::ServiceRoutes::build(inputs, svc, &hashes, &mut errors))
        .collect();
    let mut by_type: BTreeMap<&'static str, ResourceMap> = WAYPOINT_TYPES
        .iter()
        .map(|t| (*t, ResourceMap::new()))
        .collect();
    let mut put = |type_url: &'static str, name: String, body: Vec<u8>| {
        let res = Resource::from_encoded(type_url, name.clone(), Vec::new(), body);
        if let Some(map) = by_type.get_mut(type_url) {
            map.insert(name, Arc::new(res));
        }
    };
    for cluster in clusters::waypoint_clusters(inputs, &mut errors) {
        put(
            type_url::CLUSTER,
            cluster.name.clone(),
            any::encode(&cluster),
        );
    }
    for cla in clusters::waypoint_endpoints(inputs) {
        put(
            type_url::ENDPOINT,
            cla.cluster_name.clone(),
            any::encode(&cla),
        );
    }
    for listener in listeners::waypoint_listeners(inputs, &services) {
        put(
            type_url::LISTENER,
            listener.name.clone(),
            any::encode(&listener),
        );
    }
    ProxyResources {
        changed_in: version,
        by_type,
        errors,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod traffic_tests;
