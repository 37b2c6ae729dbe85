//! A fake Istio CA: a real tonic `IstioCertificateService` on 127.0.0.1:0 backed by a real
//! self-signed [`CertificateAuthority`] in a temporary directory.
//!
//! It records every request (identity asked, `ImpersonatedIdentity`, bearer token, cluster id,
//! requested lifetime) and can be told to fail requests with `UNAVAILABLE`, to issue with a fixed
//! TTL, to answer slowly, or to issue for a different identity than the one asked (a misbehaving
//! CA). It performs no authentication: it exists so ztunnel can be tested without istiod.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mesh_identity::{generate_csr, CaOptions, CertificateAuthority, Identity};
use mesh_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use mesh_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use tokio::sync::oneshot;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// The metadata key ztunnel uses in shared mode to name the workload it asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// Errors starting the fake CA.
#[derive(Debug, thiserror::Error)]
pub enum FakeCaError {
    #[error("cannot create a temporary directory for the fake CA: {0}; is TMPDIR writable?")]
    TempDir(#[source] std::io::Error),
    #[error("cannot create the fake CA's signing root: {0}")]
    Ca(#[from] mesh_identity::CaError),
    #[error("cannot bind the fake CA on 127.0.0.1:0: {0}; is loopback up?")]
    Bind(#[source] std::io::Error),
}

impl FakeCaError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            FakeCaError::TempDir(_) => "temp_dir",
            FakeCaError::Ca(_) => "ca",
            FakeCaError::Bind(_) => "bind",
        }
    }
}

/// One `CreateCertificate` call as the fake CA saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// The identity asked for: `ImpersonatedIdentity` when present, else the CSR's URI SAN.
    pub identity: Option<Identity>,
    /// The raw `ImpersonatedIdentity` metadata value.
    pub impersonated_identity: Option<String>,
    /// The token of the `authorization: Bearer <token>` header.
    pub bearer_token: Option<String>,
    /// The `clusterid` header.
    pub cluster_id: Option<String>,
    /// `validity_duration` in seconds, as sent.
    pub validity_duration: i64,
    /// When the request arrived.
    pub received_at: Instant,
}

#[derive(Default)]
struct Behaviour {
    requests: Vec<RecordedRequest>,
    fail_next: usize,
    failing: HashSet<Identity>,
    ttl: Option<Duration>,
    delay: Option<Duration>,
    issue_for: Option<Identity>,
}

#[derive(Clone)]
struct Service {
    ca: Arc<CertificateAuthority>,
    behaviour: Arc<Mutex<Behaviour>>,
}

/// A running fake CA; stops when dropped.
pub struct FakeCa {
    addr: SocketAddr,
    tls: bool,
    root_pem: String,
    behaviour: Arc<Mutex<Behaviour>>,
    shutdown: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for FakeCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCa")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl FakeCa {
    /// Starts a plaintext (h2c) fake CA for trust domain `cluster.local`.
    pub async fn start() -> Result<FakeCa, FakeCaError> {
        Self::start_inner(false).await
    }

    /// Starts a fake CA serving TLS with a certificate for `localhost` and 127.0.0.1, issued by
    /// the same root as the workload certificates (as istiod does on 15012).
    pub async fn start_tls() -> Result<FakeCa, FakeCaError> {
        Self::start_inner(true).await
    }

    async fn start_inner(tls: bool) -> Result<FakeCa, FakeCaError> {
        let dir = tempfile::tempdir().map_err(FakeCaError::TempDir)?;
        let ca = CertificateAuthority::self_signed(dir.path(), CaOptions::default())?;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(FakeCaError::Bind)?;
        let addr = listener.local_addr().map_err(FakeCaError::Bind)?;
        let mut builder = Server::builder();
        if tls {
            let serving = ca.serving_cert(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
            let identity =
                tonic::transport::Identity::from_pem(serving.chain_pem.join(""), serving.key_pem);
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(identity))
                .map_err(|e| FakeCaError::Bind(std::io::Error::other(e)))?;
        }
        let root_pem = ca.root_cert_pem().to_string();
        let behaviour = Arc::new(Mutex::new(Behaviour::default()));
        let service = Service {
            ca: Arc::new(ca),
            behaviour: behaviour.clone(),
        };
        let (shutdown, stop) = oneshot::channel::<()>();
        let router = builder.add_service(IstioCertificateServiceServer::new(service));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(async move {
            let stopped = async {
                let _ = stop.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::warn!(error = %e, "fake CA stopped with an error");
            }
        });
        Ok(FakeCa {
            addr,
            tls,
            root_pem,
            behaviour,
            shutdown: Some(shutdown),
            _dir: dir,
        })
    }

    /// The listening address (127.0.0.1:<port>).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, or `https://localhost:<port>` for [`FakeCa::start_tls`].
    pub fn url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// The mesh root certificate (PEM) that issued certificates chain to.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// Fails the next `n` requests with `UNAVAILABLE` (added to any still pending).
    pub fn fail_next(&self, n: usize) {
        self.lock().fail_next += n;
    }

    /// Fails every request for `identity` with `UNAVAILABLE` until [`FakeCa::heal`].
    pub fn fail_identity(&self, identity: &Identity) {
        self.lock().failing.insert(identity.clone());
    }

    /// Stops failing requests for `identity`.
    pub fn heal(&self, identity: &Identity) {
        self.lock().failing.remove(identity);
    }

    /// Issues certificates with this lifetime whatever the request asks (`None`: as asked).
    pub fn set_ttl(&self, ttl: Option<Duration>) {
        self.lock().ttl = ttl;
    }

    /// Waits this long before answering each request.
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Misbehaves: answers with a certificate for `identity` whatever was asked.
    pub fn set_issue_for(&self, identity: Option<Identity>) {
        self.lock().issue_for = identity;
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// How many requests asked for `identity`.
    pub fn requests_for(&self, identity: &Identity) -> usize {
        let behaviour = self.lock();
        let asked = |r: &&RecordedRequest| r.identity.as_ref() == Some(identity);
        behaviour.requests.iter().filter(asked).count()
    }

    fn lock(&self) -> MutexGuard<'_, Behaviour> {
        lock(&self.behaviour)
    }
}

impl Drop for FakeCa {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

fn lock(behaviour: &Mutex<Behaviour>) -> MutexGuard<'_, Behaviour> {
    behaviour
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn header(request: &Request<IstioCertificateRequest>, name: &str) -> Option<String> {
    let value = request.metadata().get(name)?;
    value.to_str().ok().map(str::to_string)
}

fn impersonated(request: &IstioCertificateRequest) -> Option<String> {
    let fields = &request.metadata.as_ref()?.fields;
    match fields.get(IMPERSONATED_IDENTITY)?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// The URI SAN of a PEM CSR, if it parses.
fn csr_identity(csr_pem: &str) -> Option<Identity> {
    let params = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).ok()?;
    params
        .params
        .subject_alt_names
        .iter()
        .find_map(|san| match san {
            rcgen::SanType::URI(uri) => Identity::parse(uri.as_str()).ok(),
            _ => None,
        })
}

fn record(request: &Request<IstioCertificateRequest>) -> RecordedRequest {
    let body = request.get_ref();
    let impersonated_identity = impersonated(body);
    let identity = match &impersonated_identity {
        Some(id) => Identity::parse(id).ok(),
        None => csr_identity(&body.csr),
    };
    let bearer_token = header(request, "authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::to_string));
    RecordedRequest {
        identity,
        impersonated_identity,
        bearer_token,
        cluster_id: header(request, "clusterid"),
        validity_duration: body.validity_duration,
        received_at: Instant::now(),
    }
}

/// What to do with one request, decided under the lock.
struct Plan {
    fail: bool,
    delay: Option<Duration>,
    ttl: Option<Duration>,
    issue_for: Option<Identity>,
}

impl Service {
    fn plan(&self, recorded: RecordedRequest) -> Plan {
        let mut b = lock(&self.behaviour);
        let mut fail = recorded
            .identity
            .as_ref()
            .is_some_and(|id| b.failing.contains(id));
        if !fail && b.fail_next > 0 {
            b.fail_next -= 1;
            fail = true;
        }
        let requested = u64::try_from(recorded.validity_duration).unwrap_or(0);
        let plan = Plan {
            fail,
            delay: b.delay,
            ttl: b.ttl.or(Some(Duration::from_secs(requested))),
            issue_for: b.issue_for.clone(),
        };
        b.requests.push(recorded);
        plan
    }

    fn sign(
        &self,
        csr_pem: &str,
        asked: Option<Identity>,
        plan: Plan,
    ) -> Result<Vec<String>, Status> {
        let (csr, identity) = match (plan.issue_for, asked) {
            (Some(other), _) => {
                let csr = generate_csr(&other).map_err(|e| Status::internal(e.to_string()))?;
                (csr.csr_pem, other)
            }
            (None, Some(asked)) => (csr_pem.to_string(), asked),
            (None, None) => {
                return Err(Status::invalid_argument(
                    "no identity: send ImpersonatedIdentity or a CSR with a spiffe:// URI SAN",
                ))
            }
        };
        self.ca
            .sign_csr(&csr, &identity, plan.ttl)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

#[tonic::async_trait]
impl IstioCertificateService for Service {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let recorded = record(&request);
        let asked = recorded.identity.clone();
        let plan = self.plan(recorded);
        if let Some(delay) = plan.delay {
            tokio::time::sleep(delay).await;
        }
        if plan.fail {
            return Err(Status::unavailable("fake CA told to fail this request"));
        }
        let cert_chain = self.sign(&request.get_ref().csr, asked, plan)?;
        Ok(Response::new(IstioCertificateResponse { cert_chain }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;

    #[tokio::test]
    async fn issues_records_and_fails_on_demand() {
        let ca = FakeCa::start().await.expect("start fake CA");
        let id = Identity::parse("spiffe://cluster.local/ns/a/sa/b").expect("id");
        let csr = generate_csr(&id).expect("csr");
        let mut client = IstioCertificateServiceClient::connect(ca.url())
            .await
            .expect("connect");
        let mut request = Request::new(IstioCertificateRequest {
            csr: csr.csr_pem.clone(),
            validity_duration: 3600,
            metadata: None,
        });
        request
            .metadata_mut()
            .insert("authorization", "Bearer tok".parse().expect("header"));
        ca.fail_next(1);
        let err = client
            .create_certificate(request)
            .await
            .expect_err("told to fail");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        let response = client
            .create_certificate(IstioCertificateRequest {
                csr: csr.csr_pem,
                validity_duration: 3600,
                metadata: None,
            })
            .await
            .expect("issued");
        let chain = response.into_inner().cert_chain;
        assert_eq!(chain.len(), 2);
        assert_eq!(chain.last().map(String::as_str), Some(ca.root_pem()));
        let requests = ca.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].identity.as_ref(), Some(&id));
        assert_eq!(requests[0].bearer_token.as_deref(), Some("tok"));
        assert_eq!(requests[1].bearer_token, None);
        assert_eq!(ca.requests_for(&id), 2);
    }
}
