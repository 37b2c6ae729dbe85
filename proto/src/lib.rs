//! Istio's wire protocols, compiled from the protos under `proto/istio/`.
//!
//! Package, message and field numbering follow Istio exactly, so that upstream ztunnel can talk
//! to our istiod (and our ztunnel to upstream istiod) byte for byte. Envoy's xDS types come from
//! the `envoy-types` crate and are re-exported as [`envoy`].

#![allow(clippy::all, missing_docs)]

/// `istio.workload`: Address, Workload, Service (WDS).
pub mod workload {
    tonic::include_proto!("istio.workload");

    /// `istio.workload.zds`: the node agent <-> ztunnel protocol.
    pub mod zds {
        tonic::include_proto!("istio.workload.zds");
    }
}

/// `istio.security`: L4 Authorization.
pub mod security {
    tonic::include_proto!("istio.security");
}

/// `istio.v1.auth`: the certificate service (CA).
pub mod ca {
    tonic::include_proto!("istio.v1.auth");
}

pub use envoy_types as envoy;
pub use envoy_types::pb::envoy::service::discovery::v3 as discovery;

/// The gRPC path of the delta ADS method, `DeltaAggregatedResources`.
pub const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The gRPC path of the CA's `CreateCertificate`.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";

/// Type URLs, exactly as Istio sends them.
pub mod type_url {
    /// Workload discovery: `istio.workload.Address` (delta only).
    pub const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
    /// L4 authorization: `istio.security.Authorization` (delta only).
    pub const AUTHORIZATION: &str = "type.googleapis.com/istio.security.Authorization";
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
}

#[cfg(test)]
mod tests;
