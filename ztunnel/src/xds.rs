//! Workload discovery: a delta ADS client against istiod (docs/compatibility.md, workload discovery).
//!
//! [`XdsClient`] wildcard-subscribes `istio.workload.Address` and `istio.security.Authorization`,
//! hands every response to a [`Handler`] and ACKs it, or NACKs it naming the resources the
//! handler rejected. When the stream ends it reconnects with backoff and sends
//! `initial_resource_versions`, so istiod sends only what changed; while istiod is away the
//! handler's state is left as it was. Readiness fires once the first response of each type has
//! been handed to the handler.

use std::path::PathBuf;
use std::time::Duration;

mod client;

pub use client::XdsClient;

/// The types ztunnel subscribes to, in subscription order.
pub const SUBSCRIBED_TYPES: [&str; 2] = [
    mesh_proto::type_url::ADDRESS,
    mesh_proto::type_url::AUTHORIZATION,
];

/// First reconnect delay; doubles on each failure.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(10);
/// Longest reconnect delay.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(15);

/// gRPC INVALID_ARGUMENT, the code of NACKs for rejected resources.
const INVALID_ARGUMENT: i32 = 3;

/// Applies xDS resources to ztunnel's state.
pub trait Handler: Send + Sync {
    /// Applies one response of `type_url`: `updated` (name, encoded body) are added or replace
    /// what was there, `removed` names are deleted (unknown names are not an error).
    ///
    /// Returns the rejected resources as (name, reason). A rejected resource must keep its
    /// previous good state; the handler may still apply the others. The client then NACKs the
    /// whole response with a message naming every rejection.
    fn apply(
        &self,
        type_url: &str,
        updated: &[(String, Vec<u8>)],
        removed: &[String],
    ) -> Result<(), Vec<(String, String)>>;
}

/// Who this ztunnel is, as istiod identifies it from the node id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The ztunnel pod's IP.
    pub ip: String,
    pub pod_name: String,
    pub pod_namespace: String,
    /// `CLUSTER_DOMAIN`, normally `cluster.local`.
    pub cluster_domain: String,
}

impl NodeIdentity {
    /// `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.<domain>`, as istiod parses it.
    pub fn node_id(&self) -> String {
        format!(
            "ztunnel~{ip}~{pod}.{ns}~{ns}.svc.{domain}",
            ip = self.ip,
            pod = self.pod_name,
            ns = self.pod_namespace,
            domain = self.cluster_domain
        )
    }
}

/// How to reach istiod and who to say we are.
#[derive(Clone, Debug)]
pub struct XdsConfig {
    /// `https://host:port` (verified with `root_cert_path`) or `http://host:port` (tests).
    pub address: String,
    /// PEM roots for istiod's serving certificate (https only).
    pub root_cert_path: PathBuf,
    /// TLS server name to verify; `None`: the host of `address`.
    pub server_name: Option<String>,
    /// The bearer token file, re-read on every connect; `None` sends no `authorization`.
    pub token_path: Option<PathBuf>,
    pub node: NodeIdentity,
    /// Node metadata `CLUSTER_ID`.
    pub cluster_id: String,
    /// Node metadata `ISTIO_VERSION`.
    pub istio_version: String,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl XdsConfig {
    /// Istio's defaults for everything but where istiod is and who we are.
    pub fn new(address: impl Into<String>, node: NodeIdentity) -> XdsConfig {
        XdsConfig {
            address: address.into(),
            root_cert_path: PathBuf::from(crate::certs::DEFAULT_ROOT_CERT_PATH),
            server_name: None,
            token_path: Some(PathBuf::from(crate::certs::DEFAULT_TOKEN_PATH)),
            node,
            cluster_id: crate::certs::DEFAULT_CLUSTER_ID.to_string(),
            istio_version: env!("CARGO_PKG_VERSION").to_string(),
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
        }
    }
}

/// Errors of the xDS client. Setup errors come from [`XdsClient::new`]; the others end one
/// stream and are followed by a reconnect.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("XDS_ADDRESS {address:?} is invalid ({detail}); set it to https://<host>:<port> (e.g. https://istiod.istio-system.svc:15012)")]
    BadAddress { address: String, detail: String },
    #[error("cannot read istiod's root certificate {path}: {detail}; is the istio-ca-root-cert ConfigMap mounted there?")]
    RootCert { path: String, detail: String },
    #[error("cannot set up TLS to istiod at {address}: {source}; check the root certificate and server name")]
    Tls {
        address: String,
        #[source]
        source: mesh_identity::TlsError,
    },
    #[error("cannot read the xDS token {path}: {source}; is the projected service-account token (audience istio-ca) mounted?")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the xDS token in {path} is not a valid HTTP header value; check the token file")]
    BadToken { path: String },
    #[error("istiod at {address} refused the delta ADS stream: {code:?}: {message}; is istiod reachable on 15012, and does it accept this node's token?")]
    Open {
        address: String,
        code: mesh_grpc::Code,
        message: String,
    },
    #[error("the delta ADS stream from {address} failed: {code:?}: {message}; istiod restarted or the connection broke (will reconnect)")]
    Receive {
        address: String,
        code: mesh_grpc::Code,
        message: String,
    },
    #[error("istiod at {address} closed the delta ADS stream (will reconnect)")]
    Closed { address: String },
}

impl XdsError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            XdsError::BadAddress { .. } => "bad_address",
            XdsError::RootCert { .. } => "root_cert",
            XdsError::Tls { .. } => "tls",
            XdsError::Token { .. } => "token",
            XdsError::BadToken { .. } => "bad_token",
            XdsError::Open { .. } => "open",
            XdsError::Receive { .. } => "receive",
            XdsError::Closed { .. } => "closed",
        }
    }
}

/// The NACK message for rejected resources: every name and why.
fn rejection_message(type_url: &str, rejected: &[(String, String)]) -> String {
    let list: Vec<String> = rejected
        .iter()
        .map(|(name, reason)| format!("{name}: {reason}"))
        .collect();
    format!(
        "ztunnel rejected {} {} resource(s): {}",
        rejected.len(),
        mesh_xds::metric_type(type_url),
        list.join("; ")
    )
}

#[cfg(test)]
mod tests;
