//! One delta ADS connection: a task that selects over the client's requests and snapshot
//! changes, and answers through a small bounded channel. A client that stops reading blocks only
//! its own task; meanwhile the watch channel keeps only the newest snapshot, so when it resumes it
//! gets one coalesced delta.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_xds::{metric_type, RequestKind, RequestOutcome, XdsSnapshot};
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::metrics::XdsMetrics;
use super::node::NodeId;
use super::registry::{ConnectionEntry, NodeInfo, RegistryGuard};
use super::XdsError;

pub(crate) type ResponseSender = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

pub(crate) struct Connection<S: XdsSnapshot> {
    pub entry: Arc<ConnectionEntry>,
    pub guard: RegistryGuard,
    pub snapshots: watch::Receiver<Arc<S>>,
    /// The snapshot every answer is computed against; moves forward on watch changes only.
    pub current: Arc<S>,
    pub tx: ResponseSender,
    pub metrics: XdsMetrics,
}

impl<S: XdsSnapshot> Connection<S> {
    /// Serves the connection until the client goes away or a fatal error; logs how it ended.
    pub async fn run(mut self, inbound: Streaming<DeltaDiscoveryRequest>) {
        let id = self.entry.id.clone();
        match self.serve(inbound).await {
            Ok(()) => {
                tracing::info!(conn = %id, node = %self.node_id(), "xDS stream closed by client")
            }
            Err(e) => {
                tracing::warn!(conn = %id, node = %self.node_id(), reason = e.reason(), error = %e, "xDS stream ended");
                if let Some(status) = e.to_status() {
                    // Best effort: the client may already be gone.
                    let _ = self.tx.try_send(Err(status));
                }
            }
        }
    }

    async fn serve(
        &mut self,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
    ) -> Result<(), XdsError> {
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => self.on_request(req).await?,
                    Ok(None) => return Ok(()),
                    Err(status) => return Err(XdsError::Receive(status)),
                },
                changed = self.snapshots.changed() => match changed {
                    Ok(()) => self.on_snapshot().await?,
                    Err(_) => return Err(XdsError::SnapshotsClosed),
                },
            }
        }
    }

    fn node_id(&self) -> String {
        self.entry
            .node()
            .as_ref()
            .map_or_else(String::new, |n| n.raw.clone())
    }

    async fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Result<(), XdsError> {
        if self.entry.node().is_none() {
            self.identify(&req);
        }
        let type_url = req.type_url.as_str();
        if self.current.resources(type_url).is_none() {
            tracing::warn!(conn = %self.entry.id, type_url, "request for a type this istiod does not serve (or no type_url); ignoring it, the stream stays up");
            return Ok(());
        }
        let response = {
            let mut stream = self.entry.stream();
            let outcome = stream.handle_request(&req)?;
            self.observe(&req, &outcome);
            if outcome.respond {
                stream.respond(type_url, &*self.current, None)
            } else {
                None
            }
        };
        match response {
            Some(resp) => self.send(resp, false).await,
            None => Ok(()),
        }
    }

    /// Records the proxy's identity from its first request.
    fn identify(&mut self, req: &DeltaDiscoveryRequest) {
        let node = req.node.clone().unwrap_or_default();
        let parsed = match NodeId::parse(&node.id) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(conn = %self.entry.id, node = %node.id, reason = e.reason(), error = %e, "malformed node id; serving the connection with the raw id");
                None
            }
        };
        let version = istio_version(&node).unwrap_or_else(|| "unknown".to_string());
        tracing::info!(conn = %self.entry.id, node = %node.id, peer = ?self.entry.peer, version = %version, "xDS stream connected");
        self.guard.count_in(self.metrics.connected(&version));
        *self.entry.node() = Some(NodeInfo {
            raw: node.id,
            parsed,
            version,
        });
    }

    fn observe(&self, req: &DeltaDiscoveryRequest, outcome: &RequestOutcome) {
        let conn = &self.entry.id;
        let type_url = req.type_url.as_str();
        match &outcome.kind {
            RequestKind::Nack { code, message } => {
                self.metrics.rejected(metric_type(type_url));
                tracing::warn!(%conn, type_url, nonce = %req.response_nonce, code, message = %message, "NACK");
            }
            RequestKind::StaleNonce { nonce } => {
                self.metrics.expired_nonce(metric_type(type_url));
                tracing::debug!(%conn, type_url, nonce = %nonce, "expired nonce ignored");
            }
            kind => {
                tracing::debug!(%conn, type_url, ?kind, subscribe = req.resource_names_subscribe.len(), unsubscribe = req.resource_names_unsubscribe.len(), "request")
            }
        }
    }

    async fn on_snapshot(&mut self) -> Result<(), XdsError> {
        let newest = Arc::clone(&self.snapshots.borrow_and_update());
        let from = self.current.version();
        if newest.version() == from {
            return Ok(());
        }
        let changes = newest.changes_since(from);
        let responses = self.entry.stream().push(&*newest, changes.as_ref());
        tracing::debug!(conn = %self.entry.id, from, to = newest.version(), full = changes.is_none(), responses = responses.len(), "snapshot change");
        self.current = newest;
        self.entry
            .pushed_version
            .store(self.current.version(), Ordering::Relaxed);
        for resp in responses {
            self.send(resp, true).await?;
        }
        Ok(())
    }

    /// Queues `resp` for the client; waits while the client is slow (only this task waits).
    async fn send(&self, resp: DeltaDiscoveryResponse, push: bool) -> Result<(), XdsError> {
        let kind = metric_type(&resp.type_url).to_string();
        let (resources, removed) = (resp.resources.len(), resp.removed_resources.len());
        let nonce = resp.nonce.clone();
        self.tx
            .send(Ok(resp))
            .await
            .map_err(|_| XdsError::ClientGone)?;
        self.metrics.pushed(&kind);
        if push {
            if let Some(created) = self.current.created_at() {
                self.metrics.converged(created.elapsed());
            }
        }
        tracing::debug!(conn = %self.entry.id, r#type = %kind, resources, removed, nonce = %nonce, version = self.current.version(), push, "sent");
        Ok(())
    }
}

/// `ISTIO_VERSION` from the node metadata, as Envoy and ztunnel send it.
fn istio_version(node: &mesh_proto::envoy::pb::envoy::config::core::v3::Node) -> Option<String> {
    use mesh_proto::envoy::pb::google::protobuf::value::Kind;
    let value = node.metadata.as_ref()?.fields.get("ISTIO_VERSION")?;
    match &value.kind {
        Some(Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}
