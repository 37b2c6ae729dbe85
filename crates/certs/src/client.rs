//! The gRPC client of Istio's CA: `CreateCertificate` with a fresh ECDSA P-256 CSR, a bearer
//! token re-read from its file on every request (projected tokens rotate), `clusterid`, and in
//! shared mode the `ImpersonatedIdentity` metadata.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Uri;
use hyper_util::rt::TokioIo;
use mesh_grpc::{keepalive, SetupError, TokenError};
use mesh_identity::{generate_csr, Identity};
use mesh_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use super::{CaClient, CertError, WorkloadCert};

/// Requested certificate lifetime (`SECRET_TTL`).
pub const DEFAULT_SECRET_TTL: Duration = Duration::from_secs(24 * 3600);
/// The mesh root certificate that verifies the CA's serving certificate.
pub const DEFAULT_ROOT_CERT_PATH: &str = "./var/run/secrets/istio/root-cert.pem";
/// The projected service-account token (audience `istio-ca`).
pub const DEFAULT_TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";
/// `CLUSTER_ID` default.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// The request metadata key naming the workload a shared-mode ztunnel asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach and authenticate to the CA.
#[derive(Clone, Debug)]
pub struct CaClientConfig {
    /// `https://host:port` (TLS verified with `root_cert_path`) or `http://host:port` (tests).
    pub address: String,
    /// PEM roots for the CA's serving certificate (https only).
    pub root_cert_path: PathBuf,
    /// The bearer token file, read on every request; `None` sends no `authorization`.
    pub token_path: Option<PathBuf>,
    /// Sent as the `clusterid` header.
    pub cluster_id: String,
    /// Requested lifetime (`validity_duration`).
    pub secret_ttl: Duration,
    /// Shared mode: send `ImpersonatedIdentity` (ztunnel asks on behalf of workloads).
    pub impersonate: bool,
}

impl CaClientConfig {
    /// Istio's defaults for a shared-mode ztunnel talking to `address`.
    pub fn new(address: impl Into<String>) -> CaClientConfig {
        CaClientConfig {
            address: address.into(),
            root_cert_path: PathBuf::from(DEFAULT_ROOT_CERT_PATH),
            token_path: Some(PathBuf::from(DEFAULT_TOKEN_PATH)),
            cluster_id: DEFAULT_CLUSTER_ID.to_string(),
            secret_ttl: DEFAULT_SECRET_TTL,
            impersonate: true,
        }
    }
}

/// [`CaClient`] over gRPC to istiod (or any Istio-compatible CA).
#[derive(Clone, Debug)]
pub struct GrpcCaClient {
    config: CaClientConfig,
    channel: mesh_grpc::Channel,
}

impl GrpcCaClient {
    /// Prepares a lazily-connecting channel; reads the root certificate now for https.
    pub fn new(config: CaClientConfig) -> Result<GrpcCaClient, CertError> {
        let channel = mesh_grpc::Endpoint::new(&config.address, &config.root_cert_path, None)
            .map_err(|e| setup_error(&config.address, e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .channel();
        Ok(GrpcCaClient { config, channel })
    }

    /// The configuration in use.
    pub fn config(&self) -> &CaClientConfig {
        &self.config
    }

    async fn create(&self, identity: &Identity) -> Result<WorkloadCert, CertError> {
        let csr = generate_csr(identity)?;
        let request = IstioCertificateRequest {
            csr: csr.csr_pem,
            validity_duration: i64::try_from(self.config.secret_ttl.as_secs()).unwrap_or(i64::MAX),
            metadata: self.config.impersonate.then(|| impersonation(identity)),
        };
        let metadata = self.metadata().await?;
        let response: IstioCertificateResponse = self
            .channel
            .unary(
                mesh_proto::CREATE_CERTIFICATE_PATH,
                &metadata,
                &request,
                Some(REQUEST_TIMEOUT),
            )
            .await
            .map_err(|status| CertError::Rpc {
                address: self.config.address.clone(),
                identity: identity.to_string(),
                code: status.code(),
                message: status.message().to_string(),
            })?;
        WorkloadCert::from_response(identity, response.cert_chain, csr.key_pem)
    }

    /// `authorization` (the token, read now: projected tokens rotate) and `clusterid`.
    async fn metadata(&self) -> Result<http::HeaderMap, CertError> {
        let mut metadata = http::HeaderMap::new();
        if let Some(path) = &self.config.token_path {
            let value = mesh_grpc::bearer_token(path).await.map_err(|e| match e {
                TokenError::Read { path, source } => CertError::Token { path, source },
                TokenError::NotAHeader { .. } => CertError::BadHeader { what: "token" },
            })?;
            metadata.insert(http::header::AUTHORIZATION, value);
        }
        let cluster = http::HeaderValue::try_from(self.config.cluster_id.as_str())
            .map_err(|_| CertError::BadHeader { what: "cluster id" })?;
        metadata.insert("clusterid", cluster);
        Ok(metadata)
    }
}

impl CaClient for GrpcCaClient {
    fn fetch<'a>(
        &'a self,
        identity: &'a Identity,
    ) -> BoxFuture<'a, Result<WorkloadCert, CertError>> {
        Box::pin(self.create(identity))
    }
}

/// istiod's address as proxies are given it: `host:port` (as Istio's charts and values write
/// it) means `https://host:port`; an address with a scheme is kept.
pub fn istiod_url(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("https://{address}")
    }
}

/// A lazily connecting gRPC channel to istiod: `http://host:port` (h2c, tests) or
/// `https://host:port`, whose serving certificate is verified by host name against the PEM
/// roots at `root_cert_path` (read now).
pub fn grpc_channel(address: &str, root_cert_path: &std::path::Path) -> Result<Channel, CertError> {
    let bad = |detail: String| CertError::BadAddress {
        address: address.to_string(),
        detail,
    };
    let uri: Uri = address.parse().map_err(|e| bad(format!("{e}")))?;
    let authority = uri
        .authority()
        .ok_or_else(|| bad("no host:port".to_string()))?
        .clone();
    match uri.scheme_str() {
        Some("http") => Ok(endpoint(&format!("http://{authority}"), address)?.connect_lazy()),
        Some("https") => {
            let connector = TlsConnect(
                mesh_grpc::TlsConnector::from_root_file(address, root_cert_path, authority.host())
                    .map_err(|e| setup_error(address, e))?,
            );
            // tonic would insist on its own TLS for an https endpoint: dial "http" with our
            // rustls connector and keep `https` as the request origin.
            Ok(endpoint(&format!("http://{authority}"), address)?
                .origin(uri.clone())
                .connect_with_connector_lazy(connector))
        }
        other => Err(bad(format!("unsupported scheme {other:?}"))),
    }
}

fn endpoint(uri: &str, address: &str) -> Result<Endpoint, CertError> {
    let endpoint = Endpoint::from_shared(uri.to_string()).map_err(|e| CertError::BadAddress {
        address: address.to_string(),
        detail: e.to_string(),
    })?;
    // The keepalive of ztunnel's own client (mesh_grpc::keepalive): PINGs only while a call is
    // open, TCP keepalive on the socket (tonic sets it for `http`; `https` dials through ours).
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(keepalive::PING_INTERVAL)
        .keep_alive_timeout(keepalive::PING_TIMEOUT)
        .keep_alive_while_idle(false)
        .tcp_keepalive(Some(keepalive::TCP_IDLE))
        .tcp_keepalive_interval(Some(keepalive::TCP_PROBE_INTERVAL))
        .tcp_keepalive_retries(Some(keepalive::TCP_PROBES)))
}

/// The channel's setup errors, as the CA client names them.
fn setup_error(address: &str, error: SetupError) -> CertError {
    match error {
        SetupError::BadAddress { detail, .. } => CertError::BadAddress {
            address: address.to_string(),
            detail,
        },
        SetupError::RootCert { path, detail } => CertError::RootCert { path, detail },
        SetupError::Tls(e) => CertError::Tls(e),
    }
}

fn impersonation(identity: &Identity) -> prost_types::Struct {
    let value = prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
    };
    prost_types::Struct {
        fields: BTreeMap::from([(IMPERSONATED_IDENTITY.to_string(), value)]),
    }
}

/// Dials TCP and runs a TLS 1.3 handshake verifying the CA by DNS name against the root file
/// (the connector of ztunnel's own gRPC client), for tonic.
#[derive(Clone)]
struct TlsConnect(mesh_grpc::TlsConnector);

type TlsIo = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;

impl tonic::codegen::Service<Uri> for TlsConnect {
    type Response = TlsIo;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<TlsIo, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.0.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default();
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = keepalive::dial_tcp(&host, port).await?;
            let tls = connector.connect(tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}
