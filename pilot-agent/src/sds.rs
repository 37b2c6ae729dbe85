//! SDS for Envoy over the workload unix socket: `default` (the proxy's certificate chain and
//! key) and `ROOTCA` (the mesh roots), pushed again whenever the certificate rotates.
//!
//! Envoy's SDS clients speak state-of-the-world `StreamSecrets`: each request names the secrets
//! wanted; a request carrying the last nonce is an ACK (or, with `error_detail`, a NACK, which
//! is logged). A name the agent does not serve is answered without it, so Envoy keeps waiting
//! for it rather than failing the whole stream.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use mesh_certs::WorkloadCert;
use mesh_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::{data_source, DataSource};
use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, TlsCertificate,
};
use mesh_proto::envoy::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use mesh_proto::envoy::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub const SECRET_DEFAULT: &str = "default";
pub const SECRET_ROOTCA: &str = "ROOTCA";

/// The current certificate (`None` until the CA has issued one).
pub type CertWatch = watch::Receiver<Option<Arc<WorkloadCert>>>;

#[derive(Clone)]
pub struct SdsServer {
    certs: CertWatch,
}

impl std::fmt::Debug for SdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SdsServer")
    }
}

impl SdsServer {
    pub fn new(certs: CertWatch) -> SdsServer {
        SdsServer { certs }
    }

    pub fn into_service(self) -> SecretDiscoveryServiceServer<SdsServer> {
        SecretDiscoveryServiceServer::new(self)
    }
}

fn inline(bytes: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(
            bytes.as_bytes().to_vec(),
        )),
        ..DataSource::default()
    }
}

/// The named secret from `cert`, if the agent serves that name.
pub fn secret(name: &str, cert: &WorkloadCert) -> Option<Secret> {
    let r#type = match name {
        SECRET_DEFAULT => {
            // Leaf and intermediates; the root is served as ROOTCA.
            let n = cert.chain.len().saturating_sub(1).max(1);
            let chain: String = cert
                .chain
                .iter()
                .take(n)
                .map(|p| p.trim_end().to_string() + "\n")
                .collect();
            secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: Some(inline(&chain)),
                private_key: Some(inline(&cert.key)),
                ..TlsCertificate::default()
            })
        }
        SECRET_ROOTCA => secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(inline(cert.root_pem()?)),
            ..CertificateValidationContext::default()
        }),
        _ => return None,
    };
    Some(Secret {
        name: name.to_string(),
        r#type: Some(r#type),
    })
}

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

fn response(names: &[String], cert: &WorkloadCert, nonce: u64) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: cert.serial.clone(),
        resources: names
            .iter()
            .filter_map(|n| secret(n, cert))
            .map(|s| Any {
                type_url: SECRET_TYPE.to_string(),
                value: s.encode_to_vec(),
            })
            .collect(),
        type_url: SECRET_TYPE.to_string(),
        nonce: nonce.to_string(),
        ..DiscoveryResponse::default()
    }
}

type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// One Envoy SDS stream: answers new subscriptions and pushes on rotation.
async fn serve_stream(
    mut inbound: Streaming<DiscoveryRequest>,
    mut certs: CertWatch,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let mut names: Vec<String> = Vec::new();
    let mut nonce = 0u64;
    let mut pending = false;
    loop {
        if pending {
            let cert = certs.borrow_and_update().clone();
            if let Some(cert) = cert {
                nonce += 1;
                if tx.send(Ok(response(&names, &cert, nonce))).await.is_err() {
                    return;
                }
                pending = false;
            }
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(req)) => {
                    if let Some(e) = &req.error_detail {
                        tracing::warn!(names = ?req.resource_names, code = e.code, message = %e.message, "Envoy rejected a secret (SDS NACK)");
                        continue;
                    }
                    let mut wanted = req.resource_names.clone();
                    wanted.sort();
                    if wanted != names || req.response_nonce.is_empty() {
                        for n in wanted.iter().filter(|n| n.as_str() != SECRET_DEFAULT && n.as_str() != SECRET_ROOTCA) {
                            tracing::warn!(name = %n, "Envoy asked for a secret this agent does not serve (only default and ROOTCA)");
                        }
                        names = wanted;
                        pending = true;
                    }
                }
                Ok(None) | Err(_) => return,
            },
            changed = certs.changed() => {
                if changed.is_err() {
                    return;
                }
                pending = !names.is_empty();
            }
        }
    }
}

#[tonic::async_trait]
impl SecretDiscoveryService for SdsServer {
    type DeltaSecretsStream = DeltaStream;
    type StreamSecretsStream = SotwStream;

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Err(Status::unimplemented(
            "this agent serves SDS as state-of-the-world StreamSecrets (sds_config api_type GRPC)",
        ))
    }

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(serve_stream(request.into_inner(), self.certs.clone(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let cert = self
            .certs
            .borrow()
            .clone()
            .ok_or_else(|| Status::unavailable("no certificate from the CA yet; retry"))?;
        Ok(Response::new(response(
            &request.into_inner().resource_names,
            &cert,
            0,
        )))
    }
}
