//! A fake istiod for ztunnel's xDS client: a real tonic delta ADS server on 127.0.0.1:0 built on
//! [`mesh_xds::DeltaStream`], serving an in-memory snapshot the test edits with
//! [`FakeAds::set`] / [`FakeAds::remove`] (each edit is a new snapshot version with its change
//! set, pushed to every open stream).
//!
//! It records every request (node, subscriptions, nonce, NACK `error_detail`,
//! `initial_resource_versions`, bearer token) and every response, can require a bearer token,
//! and can be stopped and restarted on the same port so reconnects can be tested. Only
//! `ADDRESS` and `AUTHORIZATION` are served; state-of-the-world ADS is refused.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mesh_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use mesh_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mesh_xds::{DeltaStream, Resource, XdsSnapshot};

use crate::MemorySnapshot;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

/// How long [`FakeAds::wait_for`] waits by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// How long [`FakeAds::stop`] waits for a graceful shutdown before aborting the server.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Errors starting the fake ADS server.
#[derive(Debug, thiserror::Error)]
pub enum FakeAdsError {
    #[error("cannot bind the fake ADS server on {addr}: {source}; is loopback up (and, on restart, is the old server stopped)?")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl FakeAdsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            FakeAdsError::Bind { .. } => "bind",
        }
    }
}

/// One delta request as the fake server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedDeltaRequest {
    /// Which stream it came on (1, 2, ... in connection order across restarts).
    pub connection: u64,
    pub type_url: String,
    /// `node.id`, when the request carried a node.
    pub node_id: Option<String>,
    /// `node.metadata` string fields, when the request carried a node.
    pub node_metadata: BTreeMap<String, String>,
    pub subscribe: Vec<String>,
    pub unsubscribe: Vec<String>,
    pub initial_resource_versions: BTreeMap<String, String>,
    pub response_nonce: String,
    /// `(code, message)` of a NACK.
    pub error_detail: Option<(i32, String)>,
    /// The token of the stream's `authorization: Bearer <token>` header.
    pub bearer_token: Option<String>,
}

impl RecordedDeltaRequest {
    /// True for a NACK.
    pub fn is_nack(&self) -> bool {
        self.error_detail.is_some()
    }

    /// True for an ACK (a nonce and no error).
    pub fn is_ack(&self) -> bool {
        !self.response_nonce.is_empty() && self.error_detail.is_none()
    }
}

/// One response the fake server sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedDeltaResponse {
    pub connection: u64,
    pub type_url: String,
    pub nonce: String,
    /// Names of the resources carried.
    pub resources: Vec<String>,
    pub removed: Vec<String>,
}

/// The next version of `snap` with `name` of `type_url` set to `body` (or removed for `None`).
fn next(
    snap: &MemorySnapshot,
    type_url: &str,
    name: &str,
    body: Option<Vec<u8>>,
) -> MemorySnapshot {
    match body {
        Some(value) => {
            let resource = Resource::from_encoded(type_url, name, Vec::new(), value);
            snap.next(&[Arc::new(resource)], &[])
        }
        None => snap.next(&[], &[(type_url, name)]),
    }
}

#[derive(Default)]
struct Records {
    requests: Vec<RecordedDeltaRequest>,
    responses: Vec<RecordedDeltaResponse>,
    connections: u64,
    required_token: Option<String>,
}

/// State shared by the fake's handle, its service and its connection tasks.
struct Shared {
    snapshots: watch::Sender<Arc<MemorySnapshot>>,
    records: Mutex<Records>,
}

impl Shared {
    fn records(&self) -> MutexGuard<'_, Records> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Clone)]
struct Service {
    shared: Arc<Shared>,
    /// Flips to true when the server stops: connection tasks then end their streams.
    stopping: watch::Receiver<bool>,
}

/// A running server instance.
struct Running {
    stop: watch::Sender<bool>,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// A fake delta ADS server; stops when dropped.
pub struct FakeAds {
    addr: SocketAddr,
    shared: Arc<Shared>,
    running: Option<Running>,
}

impl std::fmt::Debug for FakeAds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeAds")
            .field("addr", &self.addr)
            .field("running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl FakeAds {
    /// Starts a plaintext (h2c) server on 127.0.0.1 with an empty snapshot.
    pub async fn start() -> Result<FakeAds, FakeAdsError> {
        let (snapshots, _) = watch::channel(Arc::new(MemorySnapshot::new(&[])));
        let shared = Arc::new(Shared {
            snapshots,
            records: Mutex::new(Records::default()),
        });
        let mut ads = FakeAds {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            shared,
            running: None,
        };
        ads.serve().await?;
        Ok(ads)
    }

    /// The listening address (127.0.0.1:<port>), stable across restarts.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Rejects streams whose `authorization` is not `Bearer <token>` (`None`: accept all).
    pub fn require_token(&self, token: Option<&str>) {
        self.shared.records().required_token = token.map(str::to_string);
    }

    /// Adds or replaces `name` of `type_url` with the encoded `body`: a new snapshot version.
    pub fn set(&self, type_url: &str, name: &str, body: impl Into<Vec<u8>>) {
        let body = body.into();
        self.shared
            .snapshots
            .send_modify(|s| *s = Arc::new(next(s, type_url, name, Some(body))));
    }

    /// Removes `name` of `type_url`: a new snapshot version.
    pub fn remove(&self, type_url: &str, name: &str) {
        self.shared
            .snapshots
            .send_modify(|s| *s = Arc::new(next(s, type_url, name, None)));
    }

    /// The current snapshot's resources of `type_url`: name -> version.
    pub fn versions(&self, type_url: &str) -> BTreeMap<String, String> {
        let snapshot = self.shared.snapshots.borrow();
        snapshot
            .resources(type_url)
            .map(|m| {
                m.iter()
                    .map(|(k, r)| (k.clone(), r.version.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedDeltaRequest> {
        self.shared.records().requests.clone()
    }

    /// Every response sent so far, oldest first.
    pub fn responses(&self) -> Vec<RecordedDeltaResponse> {
        self.shared.records().responses.clone()
    }

    /// How many streams were accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.records().connections
    }

    /// Polls the requests until `done` holds; panics (naming `what`) after [`DEFAULT_WAIT`].
    pub async fn wait_for(&self, what: &str, done: impl Fn(&[RecordedDeltaRequest]) -> bool) {
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        loop {
            if done(&self.shared.records().requests) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "fake ADS: timed out waiting for {what}; requests: {:#?}",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops serving: open streams end, the port is released. The snapshot and records stay.
    pub async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(true);
            let _ = running.shutdown.send(());
            let mut task = running.task;
            match tokio::time::timeout(STOP_GRACE, &mut task).await {
                Ok(Err(e)) => tracing::warn!(error = %e, "fake ADS server task failed"),
                Ok(Ok(())) => {}
                Err(_) => {
                    tracing::warn!("fake ADS server did not stop gracefully; aborting it");
                    task.abort();
                    let _ = task.await;
                }
            }
        }
    }

    /// Serves again on the same port (after [`FakeAds::stop`]).
    pub async fn restart(&mut self) -> Result<(), FakeAdsError> {
        self.stop().await;
        self.serve().await
    }

    async fn serve(&mut self) -> Result<(), FakeAdsError> {
        let addr = self.addr;
        let bind = |source| FakeAdsError::Bind { addr, source };
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind)?;
        self.addr = listener.local_addr().map_err(bind)?;
        let (stop, stopping) = watch::channel(false);
        let service = Service {
            shared: Arc::clone(&self.shared),
            stopping,
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        let router = Server::builder().add_service(AggregatedDiscoveryServiceServer::new(service));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::warn!(error = %e, "fake ADS server stopped with an error");
            }
        });
        self.running = Some(Running {
            stop,
            shutdown,
            task,
        });
        Ok(())
    }
}

impl Drop for FakeAds {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop.send(true);
            let _ = running.shutdown.send(());
            running.task.abort();
        }
    }
}

fn bearer_token<T>(request: &Request<T>) -> Option<String> {
    let value = request.metadata().get("authorization")?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(str::to_string)
}

type ResponseStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;
type SotwStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = ResponseStream;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(Status::unimplemented(
            "the fake ADS server speaks delta ADS only (DeltaAggregatedResources)",
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let token = bearer_token(&request);
        let connection = {
            let mut records = self.shared.records();
            if let Some(required) = &records.required_token {
                if token.as_ref() != Some(required) {
                    return Err(Status::unauthenticated(
                        "fake ADS: missing or wrong bearer token",
                    ));
                }
            }
            records.connections += 1;
            records.connections
        };
        let (tx, rx) = mpsc::channel(16);
        let conn = Connection {
            id: connection,
            token,
            shared: Arc::clone(&self.shared),
            snapshots: self.shared.snapshots.subscribe(),
            stream: DeltaStream::new(),
            tx,
        };
        tokio::spawn(conn.run(request.into_inner(), self.stopping.clone()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One stream: requests and snapshot changes in, responses out.
struct Connection {
    id: u64,
    token: Option<String>,
    shared: Arc<Shared>,
    snapshots: watch::Receiver<Arc<MemorySnapshot>>,
    stream: DeltaStream,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
}

impl Connection {
    async fn run(
        mut self,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
        mut stopping: watch::Receiver<bool>,
    ) {
        let mut current = Arc::clone(&self.snapshots.borrow_and_update());
        loop {
            tokio::select! {
                () = stopped(&mut stopping) => {
                    let _ = self.tx.send(Err(Status::unavailable("fake ADS stopping"))).await;
                    return;
                }
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        if !self.on_request(&req, &current).await {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => return,
                },
                changed = self.snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let newest = Arc::clone(&self.snapshots.borrow_and_update());
                    let changes = newest.changes_since(current.version());
                    let responses = self.stream.push(&*newest, changes.as_ref());
                    current = newest;
                    for resp in responses {
                        if !self.send(resp).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Records and answers one request; false if the stream is over.
    async fn on_request(&mut self, req: &DeltaDiscoveryRequest, current: &MemorySnapshot) -> bool {
        self.record(req);
        if current.resources(&req.type_url).is_none() {
            tracing::warn!(type_url = %req.type_url, "fake ADS: request for an unserved type");
            return true;
        }
        let outcome = match self.stream.handle_request(req) {
            Ok(outcome) => outcome,
            Err(e) => {
                let _ = self
                    .tx
                    .send(Err(Status::invalid_argument(e.to_string())))
                    .await;
                return false;
            }
        };
        if !outcome.respond {
            return true;
        }
        match self.stream.respond(&req.type_url, current, None) {
            Some(resp) => self.send(resp).await,
            None => true,
        }
    }

    async fn send(&mut self, resp: DeltaDiscoveryResponse) -> bool {
        let recorded = RecordedDeltaResponse {
            connection: self.id,
            type_url: resp.type_url.clone(),
            nonce: resp.nonce.clone(),
            resources: resp.resources.iter().map(|r| r.name.clone()).collect(),
            removed: resp.removed_resources.clone(),
        };
        self.shared.records().responses.push(recorded);
        self.tx.send(Ok(resp)).await.is_ok()
    }

    fn record(&self, req: &DeltaDiscoveryRequest) {
        let node_metadata = req
            .node
            .as_ref()
            .and_then(|n| n.metadata.as_ref())
            .map(string_fields)
            .unwrap_or_default();
        let initial: HashMap<_, _> = req.initial_resource_versions.clone();
        let recorded = RecordedDeltaRequest {
            connection: self.id,
            type_url: req.type_url.clone(),
            node_id: req.node.as_ref().map(|n| n.id.clone()),
            node_metadata,
            subscribe: req.resource_names_subscribe.clone(),
            unsubscribe: req.resource_names_unsubscribe.clone(),
            initial_resource_versions: initial.into_iter().collect(),
            response_nonce: req.response_nonce.clone(),
            error_detail: req
                .error_detail
                .as_ref()
                .map(|s| (s.code, s.message.clone())),
            bearer_token: self.token.clone(),
        };
        self.shared.records().requests.push(recorded);
    }
}

/// Resolves once the server is stopping (or gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

fn string_fields(
    metadata: &mesh_proto::envoy::pb::google::protobuf::Struct,
) -> BTreeMap<String, String> {
    use mesh_proto::envoy::pb::google::protobuf::value::Kind;
    metadata
        .fields
        .iter()
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
