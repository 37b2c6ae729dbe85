//! mesh-certs: workload certificates from the Istio CA for the proxies (ztunnel, pilot-agent):
//! one per workload identity, fetched (`IstioCertificateService/CreateCertificate`) with an
//! ECDSA P-256 CSR, cached, shared by concurrent callers, refreshed at half-life and retried
//! with backoff.
//!
//! - [`CaClient`] is the seam: [`GrpcCaClient`] talks to istiod; tests may plug in their own.
//! - [`CertManager`] owns one background task per identity and answers
//!   [`CertManager::fetch_certificate`] from its cache.

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;
use mesh_identity::tls::{parse_certs, peer_identity};
use mesh_identity::{CertKey, CsrError, Identity, TlsError};

mod client;
mod manager;
mod x509;

pub use client::{
    grpc_channel, istiod_url, CaClientConfig, GrpcCaClient, DEFAULT_CLUSTER_ID,
    DEFAULT_ROOT_CERT_PATH, DEFAULT_SECRET_TTL, DEFAULT_TOKEN_PATH, IMPERSONATED_IDENTITY,
};
pub use manager::{
    CertDump, CertDumpEntry, CertManager, CertManagerOptions, DEFAULT_INITIAL_BACKOFF,
    DEFAULT_MAX_BACKOFF, DEFAULT_PREFETCH_CONCURRENCY,
};
pub use x509::{cert_info, rfc3339, CertInfo, CertParseError};

/// Errors obtaining a workload certificate.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot create a CSR: {0}")]
    Csr(#[from] CsrError),
    #[error("CA address {address:?} is invalid ({detail}); set CA_ADDRESS to https://<host>:<port> (e.g. https://istiod.istio-system.svc:15012)")]
    BadAddress { address: String, detail: String },
    #[error("cannot read the CA root certificate {path}: {detail}; is the istio-ca-root-cert ConfigMap mounted there?")]
    RootCert { path: String, detail: String },
    #[error("cannot build the TLS client for the CA: {0}")]
    Tls(#[source] TlsError),
    #[error("cannot read the CA token {path}: {source}; is the projected service-account token (audience istio-ca) mounted?")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} is not a valid HTTP header value; check the token file and CLUSTER_ID")]
    BadHeader { what: &'static str },
    #[error("the CA at {address} refused the request for {identity}: {code:?}: {message}; is istiod reachable, and does it accept this node's token?")]
    Rpc {
        address: String,
        identity: String,
        code: mesh_grpc::Code,
        message: String,
    },
    #[error("the CA returned no certificates for {identity}; check the CA's logs")]
    EmptyChain { identity: String },
    #[error("the CA returned an unreadable certificate chain for {identity}: {detail}")]
    BadChain { identity: String, detail: String },
    #[error("the CA issued a certificate for {issued} when {requested} was asked; is CA_ADDRESS pointing at the right CA?")]
    WrongIdentity { requested: String, issued: String },
    #[error("the certificate issued for {identity} has already expired; is the node clock right?")]
    Expired { identity: String },
    #[error("no certificate for {identity} yet; the last attempt failed ({last}), retrying in the background")]
    Unavailable {
        identity: String,
        last: Arc<CertError>,
    },
    #[error("identity {identity} was forgotten while waiting for its certificate (no pod on this node uses it any more)")]
    Forgotten { identity: String },
}

impl CertError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CertError::Csr(_) => "csr",
            CertError::BadAddress { .. } => "bad_address",
            CertError::RootCert { .. } => "root_cert",
            CertError::Tls(_) => "tls",
            CertError::Token { .. } => "token",
            CertError::BadHeader { .. } => "bad_header",
            CertError::Rpc { .. } => "rpc",
            CertError::EmptyChain { .. } => "empty_chain",
            CertError::BadChain { .. } => "bad_chain",
            CertError::WrongIdentity { .. } => "wrong_identity",
            CertError::Expired { .. } => "expired",
            CertError::Unavailable { .. } => "unavailable",
            CertError::Forgotten { .. } => "forgotten",
        }
    }
}

/// A workload certificate as issued by the CA, with its private key.
#[derive(Clone)]
pub struct WorkloadCert {
    pub identity: Identity,
    /// PEM certificates as returned by the CA: leaf first, root last.
    pub chain: Vec<String>,
    /// PKCS#8 PEM private key; never log it.
    pub key: String,
    /// The same chain and key parsed for rustls.
    pub cert_key: CertKey,
    /// The leaf's serial number (decimal).
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl std::fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("identity", &self.identity)
            .field("serial", &self.serial)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl WorkloadCert {
    /// Parses a CA response for `identity`: the leaf must carry exactly that SPIFFE id and must
    /// not have expired.
    pub fn from_response(
        identity: &Identity,
        chain: Vec<String>,
        key: String,
    ) -> Result<WorkloadCert, CertError> {
        let bad = |detail: String| CertError::BadChain {
            identity: identity.to_string(),
            detail,
        };
        let mut ders = Vec::new();
        for pem in &chain {
            ders.extend(parse_certs(pem, "CA response").map_err(|e| bad(e.to_string()))?);
        }
        let leaf = ders.first().ok_or_else(|| CertError::EmptyChain {
            identity: identity.to_string(),
        })?;
        let issued = peer_identity(leaf).map_err(|e| bad(e.to_string()))?;
        if &issued != identity {
            return Err(CertError::WrongIdentity {
                requested: identity.to_string(),
                issued: issued.to_string(),
            });
        }
        let info = cert_info(leaf.as_ref()).map_err(|e| bad(format!("leaf: {e}")))?;
        if info.not_after <= SystemTime::now() {
            return Err(CertError::Expired {
                identity: identity.to_string(),
            });
        }
        let cert_key = CertKey::from_pem(&chain, &key).map_err(|e| bad(e.to_string()))?;
        Ok(WorkloadCert {
            identity: identity.clone(),
            chain,
            key,
            cert_key,
            serial: info.serial,
            not_before: info.not_before,
            not_after: info.not_after,
        })
    }

    /// True while `now` lies within the validity period.
    pub fn is_valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }

    /// The last PEM certificate of the chain: the mesh root.
    pub fn root_pem(&self) -> Option<&str> {
        self.chain.last().map(String::as_str)
    }
}

/// Something that can issue a workload certificate (istiod's CA, or a test double).
///
/// `fetch` is an `async fn` in spirit; it returns a boxed future so that the trait can be used
/// as `Arc<dyn CaClient>`.
pub trait CaClient: Send + Sync + 'static {
    /// Asks for a fresh certificate for `identity`.
    fn fetch<'a>(
        &'a self,
        identity: &'a Identity,
    ) -> BoxFuture<'a, Result<WorkloadCert, CertError>>;
}

#[cfg(test)]
mod tests;
