//! One delta ADS connection: a task that selects over the client's requests and snapshot
//! changes, and answers through a small bounded channel. A client that stops reading blocks only
//! its own task; meanwhile the watch channel keeps only the newest snapshot, so when it resumes it
//! gets one coalesced delta.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mesh_proto::discovery::DeltaDiscoveryRequest;
use mesh_xds::SharedResponse;
use mesh_xds::{metric_type, RequestKind, RequestOutcome, Scoped, XdsSnapshot};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::Status;

use super::metrics::XdsMetrics;
use super::node::{NodeId, ProxyKind};
use super::registry::{ConnectionEntry, NodeInfo, RegistryGuard};
use super::{PushBytes, XdsError};

/// A response at least this large counts as a full push and holds a throttle permit.
const FULL_PUSH_RESOURCES: usize = 64;
/// How long a full push may hold its permit without an answer from the client.
const PERMIT_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// What a full push holds until its client answers: a throttle permit and its share of the
/// byte budget.
pub(crate) struct PushPermit {
    _count: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// A full push waiting for the client's ACK/NACK.
pub(crate) struct InFlight {
    type_url: String,
    deadline: Instant,
    _permit: PushPermit,
}

/// Responses still share the snapshot's resources; the body that sends them encodes them.
pub(crate) type ResponseSender = mpsc::Sender<Result<SharedResponse, Status>>;

pub(crate) struct Connection<S: XdsSnapshot> {
    pub entry: Arc<ConnectionEntry>,
    pub guard: RegistryGuard,
    pub snapshots: watch::Receiver<Arc<S>>,
    /// The snapshot every answer is computed against; moves forward on watch changes only.
    pub current: Arc<S>,
    pub tx: ResponseSender,
    pub metrics: XdsMetrics,
    /// Bounds the full-state responses in flight across all connections.
    pub throttle: Arc<Semaphore>,
    /// Bounds the bytes of those responses.
    pub push_bytes: PushBytes,
    pub inflight: Vec<InFlight>,
    /// What part of each snapshot this proxy is served (empty: everything), from its node.
    pub scope: String,
    /// Who opened the stream, when the port authenticates callers (15012).
    pub caller: Option<crate::auth::Caller>,
}

/// The scope of gateway proxies that may not be served their configuration: nothing.
const REFUSED_ROUTER_SCOPE: &str = "router:refused";

/// Whether a gateway proxy (`node`) may be served its configuration, which holds its TLS
/// private keys: only over an authenticated stream whose caller is a workload of the
/// proxy's namespace.
pub(crate) fn router_allowed(caller: Option<&crate::auth::Caller>, node: &NodeId) -> bool {
    caller.is_some_and(|c| c.identity.namespace() == node.namespace)
}

impl<S: XdsSnapshot> Connection<S> {
    /// Serves the connection until the client goes away or a fatal error; logs how it ended.
    pub async fn run<I>(mut self, inbound: I)
    where
        I: futures::Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Unpin,
    {
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

    async fn serve<I>(&mut self, mut inbound: I) -> Result<(), XdsError>
    where
        I: futures::Stream<Item = Result<DeltaDiscoveryRequest, Status>> + Unpin,
    {
        loop {
            let permit_deadline = self.next_permit_deadline();
            let holding = !self.inflight.is_empty();
            tokio::select! {
                msg = futures::StreamExt::next(&mut inbound) => match msg {
                    Some(Ok(req)) => self.on_request(req).await?,
                    None => return Ok(()),
                    Some(Err(status)) => return Err(XdsError::Receive(status)),
                },
                changed = self.snapshots.changed() => match changed {
                    Ok(()) => self.on_snapshot().await?,
                    Err(_) => return Err(XdsError::SnapshotsClosed),
                },
                _ = tokio::time::sleep_until(permit_deadline), if holding => {
                    let now = Instant::now();
                    self.inflight.retain(|f| f.deadline > now);
                }
            }
        }
    }

    fn next_permit_deadline(&self) -> Instant {
        self.inflight
            .iter()
            .map(|f| f.deadline)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Waits for a full-push permit (`PILOT_PUSH_THROTTLE`), then, for a push of at least
    /// [`FULL_PUSH_RESOURCES`], for its `(resources, bytes)` size in the byte budget. A
    /// connection that already holds one goes ahead without waiting: it could not read the ACK
    /// that frees its own permit while it waits, and enough such connections would deadlock the
    /// server.
    async fn permit(&self, (resources, bytes): (usize, usize)) -> Option<PushPermit> {
        if !self.inflight.is_empty() {
            return None;
        }
        let count = Arc::clone(&self.throttle).acquire_owned().await.ok()?;
        let bytes = if resources >= FULL_PUSH_RESOURCES {
            self.push_bytes.acquire(bytes).await
        } else {
            None
        };
        Some(PushPermit {
            _count: count,
            _bytes: bytes,
        })
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
        if self
            .current
            .scoped_resources(&self.scope, type_url)
            .is_none()
        {
            tracing::warn!(conn = %self.entry.id, type_url, "request for a type this istiod does not serve (or no type_url); ignoring it, the stream stays up");
            return Ok(());
        }
        if !req.response_nonce.is_empty() {
            // The client answered (ACK or NACK): its full pushes of this type are done.
            self.inflight.retain(|f| f.type_url != type_url);
        }
        let view = Scoped {
            snapshot: &*self.current,
            scope: &self.scope,
        };
        let full_size = {
            let mut stream = self.entry.stream();
            let outcome = stream.handle_request(&req)?;
            self.observe(&req, &outcome);
            if !outcome.respond {
                return Ok(());
            }
            matches!(
                outcome.kind,
                RequestKind::Initial | RequestKind::Reconnect { .. }
            )
            .then(|| stream.full_size(type_url, &view))
        };
        let permit = match full_size {
            Some(size) => self.permit(size).await,
            None => None,
        };
        let response = self.entry.stream().respond_shared(type_url, &view, None);
        match response {
            Some(resp) => self.send(resp, false, permit).await,
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
        self.scope = self.current.scope_of(&node);
        if let Some(n) = parsed.as_ref().filter(|n| n.kind == ProxyKind::Router) {
            if !router_allowed(self.caller.as_ref(), n) {
                let caller = self.caller.as_ref().map(|c| c.identity.to_string());
                tracing::warn!(conn = %self.entry.id, node = %node.id, ?caller, "gateway proxy not authenticated as a workload of its namespace {}; it is served nothing (its configuration holds TLS keys)", n.namespace);
                self.scope = REFUSED_ROUTER_SCOPE.to_string();
            }
        }
        tracing::info!(conn = %self.entry.id, node = %node.id, peer = ?self.entry.peer, version = %version, scope = %self.scope, "xDS stream connected");
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
        let changes = newest.scoped_changes_since(&self.scope, from);
        let view = Scoped {
            snapshot: &*newest,
            scope: &self.scope,
        };
        let mut permit = match changes {
            None => {
                let size = {
                    let stream = self.entry.stream();
                    stream
                        .type_urls()
                        .map(|t| stream.full_size(t, &view))
                        .fold((0, 0), |(n, b), (tn, tb)| (n + tn, b + tb))
                };
                self.permit(size).await
            }
            Some(_) => None,
        };
        let responses = self.entry.stream().push_shared(&view, changes.as_ref());
        tracing::debug!(conn = %self.entry.id, from, to = newest.version(), full = changes.is_none(), responses = responses.len(), "snapshot change");
        self.current = newest;
        self.entry
            .pushed_version
            .store(self.current.version(), Ordering::Relaxed);
        for resp in responses {
            self.send(resp, true, permit.take()).await?;
        }
        Ok(())
    }

    /// Queues `resp` for the client; waits while the client is slow (only this task waits).
    async fn send(
        &mut self,
        resp: SharedResponse,
        push: bool,
        permit: Option<PushPermit>,
    ) -> Result<(), XdsError> {
        let kind = metric_type(&resp.type_url).to_string();
        if let Some(p) = permit.filter(|_| resp.resources.len() >= FULL_PUSH_RESOURCES) {
            self.inflight.push(InFlight {
                type_url: resp.type_url.clone(),
                deadline: Instant::now() + PERMIT_HOLD,
                _permit: p,
            });
        }
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

#[cfg(test)]
mod tests;
