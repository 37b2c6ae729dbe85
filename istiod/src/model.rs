//! The ambient domain model: cluster objects -> WDS `Address` and `Authorization` resources.
//!
//! [`Model`] owns the cluster state (objects plus indexes), converts it incrementally into
//! pre-encoded xDS resources and hands out immutable, versioned [`Snapshot`]s. Conversions are
//! pure functions (see `workload`, `service`, `authz`, `peer_auth`) so that they can be
//! table-tested; the model only decides *what* to recompute after a change:
//!
//! - a Pod / WorkloadEntry change recomputes that workload (and frees or claims its IPs);
//! - a Service / ServiceEntry change recomputes it and the workloads its old or new selector
//!   matched in its namespace;
//! - a Namespace label change recomputes that namespace's workloads and services;
//! - an AuthorizationPolicy / PeerAuthentication change recomputes it and the workloads its old
//!   or new selector matched.
//!
//! Each build also works out the status conditions of Services, ServiceEntries and
//! AuthorizationPolicies (`status`), which istiod writes back on Kubernetes.
//!
//! No kube or tonic types appear here: input is `mesh_api::Object`, output `mesh_xds` resources.

mod authz;
mod build;
mod claims;
mod debug;
mod endpoint_slice;
mod peer_auth;
mod routers;
mod service;
mod sidecar_scope;
mod sidecars;
mod snapshot;
mod state;
pub mod status;
mod waypoints;
mod workload;

use std::net::IpAddr;

use serde::Serialize;

pub use authz::{convert_authorization_policy, PolicyConversion};
pub use build::Model;
pub use endpoint_slice::slice_to_workloads;
pub use peer_auth::{static_strict_policy, STATIC_STRICT_POLICY_NAME};
pub use service::{service_entry_to_services, service_to_service};
pub use snapshot::{Snapshot, CHANGE_LOG_LEN};
pub use state::PodFacts;
pub use workload::{pod_to_workload, pod_uid, workload_entry_uid, WorkloadInputs};

/// Static settings of the model (Istio's mesh config and cluster identity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelConfig {
    /// Cluster id, first part of workload uids (`Kubernetes` in Istio).
    pub cluster_id: String,
    /// SPIFFE trust domain of workload identities.
    pub trust_domain: String,
    /// DNS suffix of service hostnames (`<name>.<ns>.svc.<suffix>`).
    pub domain_suffix: String,
    /// Istio's root namespace: policies without a selector there are mesh-wide.
    pub root_namespace: String,
    /// Default network of workloads and services (`topology.istio.io/network` overrides).
    pub network: String,
    /// Where waypoints write an access log line per request (mesh config `accessLogFile`);
    /// empty for none.
    pub access_log_file: String,
    /// Sidecars reach endpoints that take HBONE through HBONE (`PILOT_ENABLE_SENDING_HBONE`).
    pub sending_hbone: bool,
    /// Sidecars of pods labelled `networking.istio.io/tunnel: http` accept HBONE on 15008
    /// (`PILOT_ENABLE_SIDECAR_LISTENING_HBONE`).
    pub sidecar_listening_hbone: bool,
    /// Sidecars send destinations outside the registry to the black hole (mesh config
    /// `outboundTrafficPolicy.mode: REGISTRY_ONLY`; Istio's default is ALLOW_ANY).
    pub outbound_registry_only: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            domain_suffix: "cluster.local".into(),
            root_namespace: "istio-system".into(),
            network: String::new(),
            access_log_file: String::new(),
            sending_hbone: true,
            sidecar_listening_hbone: true,
            outbound_registry_only: false,
        }
    }
}

/// A problem with the cluster's configuration. Kept in the model while it lasts (see
/// [`Snapshot::errors`]) and logged once when it appears. None of them stops the model: the
/// offending object (or only its bad part) is left out, failing closed for policies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ModelError {
    /// Two workloads claim one IP on one network; the first keeps it.
    #[error(
        "{loser} is left out of workload discovery: IP {ip} (network {network:?}) already belongs to {owner}; \
         delete or fix one of them (the address is freed when {owner} goes away)"
    )]
    IpConflict {
        network: String,
        ip: IpAddr,
        owner: String,
        loser: String,
    },
    /// Two objects produce a resource of the same name; the first keeps it.
    #[error("{loser} produces {name}, which {owner} already serves; rename one of them")]
    DuplicateName {
        name: String,
        owner: String,
        loser: String,
    },
    /// A field that must hold an IP (or CIDR) does not.
    #[error(
        "{object}: {field} = {value:?} is not a valid IP address or CIDR; that address is ignored"
    )]
    InvalidAddress {
        object: String,
        field: String,
        value: String,
    },
    /// An AuthorizationPolicy value (CIDR, port) that cannot be parsed; `effect` says how the
    /// policy fails closed.
    #[error("AuthorizationPolicy {policy}: {field} = {value:?} is invalid; {effect}")]
    InvalidPolicyValue {
        policy: String,
        field: String,
        value: String,
        effect: String,
    },
    /// CUSTOM / AUDIT policies cannot be enforced by ztunnel.
    #[error(
        "AuthorizationPolicy {policy}: action {action} is not supported by ztunnel and is ignored; \
         attach it to a waypoint with targetRefs"
    )]
    UnsupportedAction { policy: String, action: String },
    /// HTTP attributes in a policy that ztunnel (L4) enforces.
    #[error(
        "AuthorizationPolicy {policy}: ztunnel does not support HTTP attributes ({fields}); {effect}. \
         Use a waypoint proxy to enforce HTTP rules"
    )]
    HttpAttributes {
        policy: String,
        fields: String,
        effect: String,
    },
}

impl ModelError {
    /// Short label value for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ModelError::IpConflict { .. } => "ip_conflict",
            ModelError::DuplicateName { .. } => "duplicate_name",
            ModelError::InvalidAddress { .. } => "invalid_address",
            ModelError::InvalidPolicyValue { .. } => "invalid_policy_value",
            ModelError::UnsupportedAction { .. } => "unsupported_action",
            ModelError::HttpAttributes { .. } => "http_attributes",
        }
    }
}

/// Counters of the work done by [`Model::build`], for the push stats and for tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BuildStats {
    /// Source objects whose resources were recomputed.
    pub recomputed: u64,
    /// Resource names added, updated or removed.
    pub changed: u64,
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
