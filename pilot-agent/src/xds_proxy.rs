//! The xDS relay: Envoy's ADS stream on the agent's `XDS` unix socket is forwarded to istiod
//! over TLS with the pod's token, message for message in both directions. The relay watches the
//! requests going up: the first ACK of CDS and of LDS marks the proxy configured (readiness).
//!
//! One upstream stream per Envoy stream: when either side ends, so does the other, and Envoy
//! reconnects (its own backoff), which opens a new upstream stream.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use mesh_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use mesh_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use mesh_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mesh_proto::type_url;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// Istio's `ISTIO_GPRC_MAXRECVMSGSIZE`.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// What the relay has seen the proxy accept.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct XdsStatus {
    pub cds_acked: bool,
    pub lds_acked: bool,
    /// The last NACK's message, if the proxy rejected something.
    pub last_nack: Option<String>,
}

impl XdsStatus {
    pub fn configured(&self) -> bool {
        self.cds_acked && self.lds_acked
    }
}

#[derive(Clone)]
pub struct XdsProxy {
    upstream: Channel,
    token_path: std::path::PathBuf,
    cluster_id: String,
    status: Arc<watch::Sender<XdsStatus>>,
}

impl std::fmt::Debug for XdsProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("XdsProxy")
    }
}

impl XdsProxy {
    pub fn new(
        upstream: Channel,
        token_path: std::path::PathBuf,
        cluster_id: String,
    ) -> (XdsProxy, watch::Receiver<XdsStatus>) {
        let (tx, rx) = watch::channel(XdsStatus::default());
        (
            XdsProxy {
                upstream,
                token_path,
                cluster_id,
                status: Arc::new(tx),
            },
            rx,
        )
    }

    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<XdsProxy> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// A request to istiod carrying the token (re-read: projected tokens rotate).
    async fn upstream_request<T>(&self, body: T) -> Result<Request<T>, Status> {
        let mut req = Request::new(body);
        match mesh_grpc::bearer_token(&self.token_path).await {
            Ok(value) => {
                let value = value
                    .to_str()
                    .ok()
                    .and_then(|v| MetadataValue::try_from(v).ok())
                    .ok_or_else(|| {
                        Status::internal("the istio-token file is not a valid header value")
                    })?;
                req.metadata_mut().insert("authorization", value);
            }
            Err(e @ mesh_grpc::TokenError::NotAHeader { .. }) => {
                return Err(Status::internal(e.to_string()));
            }
            Err(e) => {
                tracing::debug!(path = %self.token_path.display(), error = %e, "no token for istiod; connecting without one");
            }
        }
        if let Ok(v) = MetadataValue::try_from(self.cluster_id.as_str()) {
            req.metadata_mut().insert("clusterid", v);
        }
        Ok(req)
    }

    fn observe(&self, req: &DeltaDiscoveryRequest) {
        if req.response_nonce.is_empty() {
            return;
        }
        if let Some(e) = &req.error_detail {
            tracing::warn!(type_url = %req.type_url, nonce = %req.response_nonce, message = %e.message, "Envoy rejected configuration from istiod (NACK)");
            self.status
                .send_modify(|s| s.last_nack = Some(format!("{}: {}", req.type_url, e.message)));
            return;
        }
        let t = req.type_url.as_str();
        self.status.send_if_modified(|s| {
            let before = s.clone();
            if t == type_url::CLUSTER {
                s.cds_acked = true;
            }
            if t == type_url::LISTENER {
                s.lds_acked = true;
            }
            *s != before
        });
    }
}

type DeltaOut = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;
type SotwOut = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsProxy {
    type StreamAggregatedResourcesStream = SotwOut;
    type DeltaAggregatedResourcesStream = DeltaOut;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwOut>, Status> {
        let mut inbound = request.into_inner();
        let (up_tx, up_rx) = mpsc::channel::<DiscoveryRequest>(16);
        let mut client = AggregatedDiscoveryServiceClient::new(self.upstream.clone())
            .max_decoding_message_size(MAX_MESSAGE);
        let req = self.upstream_request(ReceiverStream::new(up_rx)).await?;
        tokio::spawn(async move {
            while let Some(Ok(msg)) = inbound.next().await {
                if up_tx.send(msg).await.is_err() {
                    break;
                }
            }
        });
        let responses = client.stream_aggregated_resources(req).await?.into_inner();
        Ok(Response::new(Box::pin(responses)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaOut>, Status> {
        let mut inbound = request.into_inner();
        let (up_tx, up_rx) = mpsc::channel::<DeltaDiscoveryRequest>(16);
        let mut client = AggregatedDiscoveryServiceClient::new(self.upstream.clone())
            .max_decoding_message_size(MAX_MESSAGE);
        let req = self.upstream_request(ReceiverStream::new(up_rx)).await?;
        let relay = self.clone();
        tokio::spawn(async move {
            while let Some(msg) = inbound.next().await {
                match msg {
                    Ok(msg) => {
                        relay.observe(&msg);
                        if up_tx.send(msg).await.is_err() {
                            break;
                        }
                    }
                    Err(status) => {
                        tracing::debug!(%status, "Envoy's xDS stream ended");
                        break;
                    }
                }
            }
        });
        let responses = client
            .delta_aggregated_resources(req)
            .await
            .inspect_err(|s| {
                tracing::warn!(code = ?s.code(), message = %s.message(), "istiod refused the xDS stream");
            })?
            .into_inner();
        Ok(Response::new(Box::pin(responses)))
    }
}
