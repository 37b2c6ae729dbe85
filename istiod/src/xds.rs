//! The ADS server: delta xDS (`DeltaAggregatedResources`) of whatever the current snapshot
//! serves (WDS `istio.workload.Address`, `istio.security.Authorization`, ...).
//!
//! One task per connection owns its stream state ([`mesh_xds::DeltaStream`]) and selects over
//! the client's requests and snapshot changes (a `watch` channel: slow connections coalesce to
//! the newest snapshot). On a change it asks the snapshot what changed since the version it last
//! pushed and sends only that. State-of-the-world ADS (`StreamAggregatedResources`) runs on
//! the same machinery through [`sotw`].
//!
//! Mount [`XdsServer::into_service`] on 15010 (plaintext) and 15012 (TLS); serve
//! [`XdsServer::syncz`] at `/debug/syncz`; register [`XdsMetrics`].

mod connection;
pub mod framed;
mod metrics;
mod node;
mod registry;
pub mod sotw;

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::Stream;
use mesh_proto::discovery::aggregated_discovery_service_server::AggregatedDiscoveryService;
use mesh_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mesh_xds::{DeltaStream, SharedResponse, StreamError, XdsSnapshot};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use metrics::{TypeLabels, VersionLabels, XdsMetrics};
pub use node::{NodeId, NodeIdError, ProxyKind};

use connection::Connection;
use registry::{ConnectionEntry, Registry};

/// Istio's default `ISTIO_GPRC_MAXRECVMSGSIZE`: 4 MiB.
pub const MAX_RECV_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// Responses queued per connection before its task waits for the client to read.
const RESPONSE_QUEUE: usize = 4;

/// Why an xDS connection ended.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error(
        "could not read a DeltaDiscoveryRequest ({0}); is the client speaking \
         envoy.service.discovery.v3 delta ADS, with messages under 4 MiB?"
    )]
    Receive(Status),
    #[error("invalid request: {0}")]
    Request(#[from] StreamError),
    #[error("the client stopped receiving responses (stream closed)")]
    ClientGone,
    #[error("the snapshot source stopped; istiod is shutting down or its model task died")]
    SnapshotsClosed,
}

impl XdsError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            XdsError::Receive(_) => "receive",
            XdsError::Request(e) => e.reason(),
            XdsError::ClientGone => "client_gone",
            XdsError::SnapshotsClosed => "snapshots_closed",
        }
    }

    /// The status to end the stream with, if the client may still be listening.
    fn to_status(&self) -> Option<Status> {
        match self {
            XdsError::Receive(s) if s.code() == tonic::Code::Cancelled => None,
            XdsError::Receive(_) | XdsError::Request(_) => {
                Some(Status::invalid_argument(self.to_string()))
            }
            XdsError::ClientGone => None,
            XdsError::SnapshotsClosed => Some(Status::unavailable(self.to_string())),
        }
    }
}

/// The delta ADS server over snapshots of type `S`. Cloning shares the connections and metrics.
pub struct XdsServer<S: XdsSnapshot> {
    snapshots: watch::Receiver<Arc<S>>,
    registry: Arc<Registry>,
    metrics: XdsMetrics,
    next_id: Arc<AtomicU64>,
    throttle: Arc<Semaphore>,
    push_bytes: PushBytes,
}

/// Istio's `PILOT_PUSH_THROTTLE` default: `min(15 + 5 x cores, 100)` full pushes in flight.
pub fn default_push_throttle() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (15 + 5 * cores).min(100)
}

/// The default budget of full-push bytes in flight (see [`XdsServer::with_push_bytes`]).
pub const DEFAULT_PUSH_BYTES: usize = 32 << 20;

/// A budget of bytes of full-state responses in flight, counted in KiB permits.
#[derive(Clone)]
pub(crate) struct PushBytes {
    permits: Arc<Semaphore>,
    kib: u32,
}

impl PushBytes {
    fn new(bytes: usize) -> PushBytes {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .max(1);
        PushBytes {
            permits: Arc::new(Semaphore::new(kib as usize)),
            kib,
        }
    }

    /// Waits until `bytes` fit in the budget (a response larger than all of it waits for all
    /// of it, then goes alone).
    pub(crate) async fn acquire(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let want = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        Arc::clone(&self.permits)
            .acquire_many_owned(want.clamp(1, self.kib))
            .await
            .ok()
    }
}

impl<S: XdsSnapshot> Clone for XdsServer<S> {
    fn clone(&self) -> Self {
        XdsServer {
            snapshots: self.snapshots.clone(),
            registry: Arc::clone(&self.registry),
            metrics: self.metrics.clone(),
            next_id: Arc::clone(&self.next_id),
            throttle: Arc::clone(&self.throttle),
            push_bytes: self.push_bytes.clone(),
        }
    }
}

impl<S: XdsSnapshot> std::fmt::Debug for XdsServer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsServer")
            .field("connections", &self.registry.len())
            .finish()
    }
}

impl<S: XdsSnapshot> XdsServer<S> {
    /// A server that serves the snapshots published on `snapshots` (unregistered metrics).
    pub fn new(snapshots: watch::Receiver<Arc<S>>) -> XdsServer<S> {
        XdsServer {
            snapshots,
            registry: Arc::default(),
            metrics: XdsMetrics::default(),
            next_id: Arc::new(AtomicU64::new(1)),
            throttle: Arc::new(Semaphore::new(default_push_throttle())),
            push_bytes: PushBytes::new(DEFAULT_PUSH_BYTES),
        }
    }

    /// At most `n` full-state responses in flight at once (`PILOT_PUSH_THROTTLE`): each holds a
    /// permit until the client answers it, which bounds istiod's memory when many proxies
    /// connect at once. Small deltas are never throttled.
    pub fn with_push_throttle(self, n: usize) -> XdsServer<S> {
        XdsServer {
            throttle: Arc::new(Semaphore::new(n.max(1))),
            ..self
        }
    }

    /// At most about `bytes` of full-state responses in flight at once, whatever their number:
    /// each full push reserves its estimated size before it is built and keeps it until the
    /// client answers (as the [throttle permit](Self::with_push_throttle) does). A response
    /// lives twice while it goes out (built, then encoded in the HTTP/2 send buffer), so this
    /// bounds the transient memory of many proxies connecting at once to about twice `bytes`.
    pub fn with_push_bytes(self, bytes: usize) -> XdsServer<S> {
        XdsServer {
            push_bytes: PushBytes::new(bytes),
            ..self
        }
    }

    /// Uses `metrics` (see [`XdsMetrics::register`]).
    pub fn with_metrics(self, metrics: XdsMetrics) -> XdsServer<S> {
        XdsServer { metrics, ..self }
    }

    /// The tonic service to mount (max receive message size 4 MiB, as Istio). Delta ADS
    /// responses are framed per message (see [`framed`]), so no stream keeps a buffer the size of
    /// its largest response.
    pub fn into_service(self) -> framed::AdsService<S> {
        framed::AdsService::new(self)
    }

    /// UNAVAILABLE until the first synced snapshot, like upstream istiod: answering from an
    /// empty snapshot would tell a reconnecting proxy that everything is gone.
    pub(crate) fn check_ready(&self) -> Result<(), Status> {
        if self.snapshots.borrow().version() == 0 {
            return Err(Status::unavailable(
                "istiod is not ready to serve discovery information: configuration not synced yet; retry",
            ));
        }
        Ok(())
    }

    /// The number of live connections.
    pub fn connections(&self) -> usize {
        self.registry.len()
    }

    /// `/debug/syncz`: every connection with its per-type subscription, nonces, NACKs and
    /// snapshot versions.
    pub fn syncz(&self) -> serde_json::Value {
        self.registry.syncz()
    }

    /// Registers a connection; returns its task and the receiver of its responses.
    pub(crate) fn open(
        &self,
        peer: Option<std::net::SocketAddr>,
        caller: Option<crate::auth::Caller>,
    ) -> (
        Connection<S>,
        mpsc::Receiver<Result<SharedResponse, Status>>,
    ) {
        let id = format!("conn-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut snapshots = self.snapshots.clone();
        let current = Arc::clone(&snapshots.borrow_and_update());
        let entry = Arc::new(ConnectionEntry {
            id,
            peer,
            connected_at: SystemTime::now(),
            node: Mutex::new(None),
            stream: Mutex::new(DeltaStream::new()),
            pushed_version: AtomicU64::new(current.version()),
        });
        let guard = self.registry.insert(Arc::clone(&entry));
        let (tx, rx) = mpsc::channel(RESPONSE_QUEUE);
        let conn = Connection {
            entry,
            guard,
            snapshots,
            current,
            tx,
            metrics: self.metrics.clone(),
            throttle: Arc::clone(&self.throttle),
            push_bytes: self.push_bytes.clone(),
            inflight: Vec::new(),
            scope: String::new(),
            caller,
        };
        (conn, rx)
    }
}

type DeltaResponseStream =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;
type SotwResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: XdsSnapshot> AggregatedDiscoveryService for XdsServer<S> {
    type StreamAggregatedResourcesStream = SotwResponseStream;
    type DeltaAggregatedResourcesStream = DeltaResponseStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwResponseStream>, Status> {
        use futures::StreamExt;
        self.check_ready()?;
        let caller = request.extensions().get::<crate::auth::Caller>().cloned();
        let (conn, rx) = self.open(request.remote_addr(), caller);
        let mut requests = sotw::RequestTranslator::default();
        let inbound = request
            .into_inner()
            .map(move |r| r.map(|req| requests.translate(req)));
        tokio::spawn(conn.run(Box::pin(inbound)));
        let mut responses = sotw::ResponseTranslator::default();
        let out = ReceiverStream::new(rx)
            .map(move |r| r.map(|resp| responses.translate(resp.into_proto())));
        Ok(Response::new(Box::pin(out)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponseStream>, Status> {
        self.check_ready()?;
        let caller = request.extensions().get::<crate::auth::Caller>().cloned();
        let (conn, rx) = self.open(request.remote_addr(), caller);
        let responses: DeltaResponseStream =
            Box::pin(futures::StreamExt::map(ReceiverStream::new(rx), |r| {
                r.map(SharedResponse::into_proto)
            }));
        tokio::spawn(conn.run(request.into_inner()));
        Ok(Response::new(responses))
    }
}
