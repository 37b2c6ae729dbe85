//! The ZDS server: the node agent's side of the ztunnel <-> istio-cni protocol (docs/compatibility.md, ZDS).
//!
//! The agent listens on a `SOCK_SEQPACKET` unix socket ([`DEFAULT_ZDS_SOCKET`]); ztunnel
//! connects and sends `ZdsHello{V1}` (anything else is logged and that connection closed).
//! Each connection then gets the snapshot: every cached pod as `AddWorkload` with its netns fd
//! (`SCM_RIGHTS`, opened again from the recorded netns path), or `KeepWorkload` when the path
//! cannot be opened, each waiting for its `Ack` ([`ACK_DEADLINE`]), then `SnapshotSent`.
//! Afterwards live requests go one at a time, each acked before the next.
//!
//! Several ztunnels may be connected at once (during a ztunnel upgrade the old one stays
//! until it is terminated). As upstream: the **newest** connection gets every `Add`, every
//! connection gets `Del`, and older connections are kept open rather than closed: a closed
//! ztunnel reconnects at once, becomes the newest, and the two would take turns forever.
//!
//! The cache of pods is kept whether or not a ztunnel is connected: pods added while none is
//! go into the next snapshot. Accepts are limited to 5 a second, as upstream.

mod conn;

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mesh_proto::workload::zds::{
    workload_request::Payload, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo,
    WorkloadRequest,
};
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use conn::ConnError;

/// Where ztunnel connects (hostPath `/var/run/ztunnel` in both DaemonSets).
pub const DEFAULT_ZDS_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";
/// Deadline of each read and write on a ztunnel connection (hello, request, ack).
pub const ACK_DEADLINE: Duration = Duration::from_secs(5);
/// Minimum time between two accepted connections (at most 5 a second, as upstream).
pub const ACCEPT_INTERVAL: Duration = Duration::from_millis(200);

/// Why a ZDS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("cannot listen for ztunnel on {path}: {source}; is the directory writable and no other node agent running?")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no ztunnel connection: is ztunnel running on this node, with INPOD_UDS pointing at this agent's socket?")]
    NoConnection,
    #[error("cannot open the network namespace {path} of pod {uid}: {source}; is the pod still running?")]
    Netns {
        uid: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ztunnel rejected pod {uid}: {source}")]
    Nack {
        uid: String,
        #[source]
        source: mesh_zds::Nack,
    },
    #[error("the ztunnel connection failed before it acked pod {uid}: {detail}")]
    ConnectionLost { uid: String, detail: String },
}

impl ZdsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ZdsError::Bind { .. } => "bind",
            ZdsError::NoConnection => "no_connection",
            ZdsError::Netns { .. } => "netns",
            ZdsError::Nack { .. } => "nack",
            ZdsError::ConnectionLost { .. } => "connection_lost",
        }
    }
}

/// A pod as the snapshot sends it.
#[derive(Clone, Debug)]
struct CachedPod {
    info: WorkloadInfo,
    netns: PathBuf,
}

/// What happened to one request.
#[derive(Debug)]
enum Outcome {
    Ack,
    Nack(mesh_zds::Nack),
    Failed(String),
}

/// One live request for a connection task.
struct Job {
    uid: String,
    payload: Payload,
    fd: Option<OwnedFd>,
    reply: oneshot::Sender<Outcome>,
}

/// A connection that said hello; the last one is the newest.
struct Slot {
    id: u64,
    jobs: mpsc::UnboundedSender<Job>,
    snapshot_sent: bool,
}

#[derive(Default)]
struct Inner {
    pods: BTreeMap<String, CachedPod>,
    conns: Vec<Slot>,
}

struct Shared {
    inner: Mutex<Inner>,
    connected: watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The cache stays consistent even if a holder panicked: keep using it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `connected` = some connection has taken its snapshot.
    fn update_connected(&self, inner: &Inner) {
        let connected = inner.conns.iter().any(|s| s.snapshot_sent);
        self.connected
            .send_if_modified(|c| std::mem::replace(c, connected) != connected);
    }
}

/// The listening socket; [`ZdsServer::run`] serves it.
pub struct ZdsServer {
    path: PathBuf,
    listener: UnixStream,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ZdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZdsServer({})", self.path.display())
    }
}

/// Sends pods to ztunnel; cheap to clone.
#[derive(Clone)]
pub struct ZdsHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ZdsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ZdsHandle")
    }
}

impl ZdsServer {
    /// Listens at `path` (creating its directory, replacing a stale socket file). Must be
    /// called within a Tokio runtime.
    pub fn bind(path: &Path) -> Result<ZdsServer, ZdsError> {
        let listener = conn::listen(path).map_err(|source| ZdsError::Bind {
            path: path.to_path_buf(),
            source,
        })?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            connected: watch::Sender::new(false),
        });
        Ok(ZdsServer {
            path: path.to_path_buf(),
            listener,
            shared,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle to add and delete pods.
    pub fn handle(&self) -> ZdsHandle {
        ZdsHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Accepts ztunnel connections until `shutdown` resolves; then closes every connection
    /// and removes the socket file. The pod cache survives (handles keep it).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tasks = JoinSet::new();
        let mut next_id = 0u64;
        info!(path = %self.path.display(), "ZDS server listening for ztunnel");
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
                accepted = conn::accept(&self.listener) => accepted,
            };
            match accepted {
                Ok(stream) => {
                    next_id += 1;
                    let shared = Arc::clone(&self.shared);
                    tasks.spawn(serve_connection(next_id, stream, shared));
                }
                Err(e) => warn!(error = %e, "accepting a ztunnel connection failed"),
            }
            // At most 5 connections a second: a ztunnel stuck in a reconnect loop cannot
            // make us spin.
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(ACCEPT_INTERVAL) => {}
            }
        }
        tasks.shutdown().await;
        {
            let mut inner = self.shared.lock();
            inner.conns.clear();
            self.shared.update_connected(&inner);
        }
        let _ = std::fs::remove_file(&self.path);
        info!(path = %self.path.display(), "ZDS server stopped");
    }
}

impl ZdsHandle {
    /// Caches the pod and sends `AddWorkload` with its netns fd to the newest ztunnel,
    /// returning once it acked. With no ztunnel connected the pod stays cached (it goes in
    /// the next snapshot) and [`ZdsError::NoConnection`] is returned.
    pub async fn add(&self, uid: &str, info: WorkloadInfo, netns: &Path) -> Result<(), ZdsError> {
        let fd: OwnedFd = std::fs::File::open(netns)
            .map_err(|source| ZdsError::Netns {
                uid: uid.to_string(),
                path: netns.to_path_buf(),
                source,
            })?
            .into();
        let payload = Payload::Add(AddWorkload {
            uid: uid.to_string(),
            workload_info: Some(info.clone()),
        });
        let reply = {
            let mut inner = self.shared.lock();
            let pod = CachedPod {
                info,
                netns: netns.to_path_buf(),
            };
            inner.pods.insert(uid.to_string(), pod);
            let slot = inner.conns.last().ok_or(ZdsError::NoConnection)?;
            let (tx, rx) = oneshot::channel();
            let job = Job {
                uid: uid.to_string(),
                payload,
                fd: Some(fd),
                reply: tx,
            };
            slot.jobs.send(job).map_err(|_| ZdsError::NoConnection)?;
            rx
        };
        outcome(uid, reply.await)
    }

    /// Forgets the pod and sends `DelWorkload` to every connected ztunnel. With none
    /// connected this only updates the cache (the next snapshot leaves the pod out).
    pub async fn del(&self, uid: &str) -> Result<(), ZdsError> {
        let replies: Vec<oneshot::Receiver<Outcome>> = {
            let mut inner = self.shared.lock();
            inner.pods.remove(uid);
            inner
                .conns
                .iter()
                .filter_map(|slot| {
                    let (tx, rx) = oneshot::channel();
                    let job = Job {
                        uid: uid.to_string(),
                        payload: Payload::Del(DelWorkload {
                            uid: uid.to_string(),
                        }),
                        fd: None,
                        reply: tx,
                    };
                    slot.jobs.send(job).ok().map(|()| rx)
                })
                .collect()
        };
        let mut result = Ok(());
        for reply in replies {
            if let Err(e) = outcome(uid, reply.await) {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// Caches a pod for the next snapshot without sending it now (used at start, before
    /// ztunnel connects, for pods enrolled before a restart).
    pub fn remember(&self, uid: &str, info: WorkloadInfo, netns: &Path) {
        let pod = CachedPod {
            info,
            netns: netns.to_path_buf(),
        };
        self.shared.lock().pods.insert(uid.to_string(), pod);
    }

    /// The uids in the cache.
    pub fn cached(&self) -> Vec<String> {
        self.shared.lock().pods.keys().cloned().collect()
    }

    /// True while some ztunnel is connected and has taken its snapshot.
    pub fn connected(&self) -> watch::Receiver<bool> {
        self.shared.connected.subscribe()
    }
}

fn outcome(uid: &str, reply: Result<Outcome, oneshot::error::RecvError>) -> Result<(), ZdsError> {
    match reply {
        Ok(Outcome::Ack) => Ok(()),
        Ok(Outcome::Nack(source)) => Err(ZdsError::Nack {
            uid: uid.to_string(),
            source,
        }),
        Ok(Outcome::Failed(detail)) => Err(ZdsError::ConnectionLost {
            uid: uid.to_string(),
            detail,
        }),
        Err(_) => Err(ZdsError::ConnectionLost {
            uid: uid.to_string(),
            detail: "the connection closed".to_string(),
        }),
    }
}

fn encode(payload: Payload) -> Vec<u8> {
    WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec()
}

/// Runs one connection and removes it from the set when it ends.
async fn serve_connection(id: u64, stream: UnixStream, shared: Arc<Shared>) {
    debug!(conn = id, "ztunnel connection accepted");
    let result = session(id, &stream, &shared).await;
    {
        let mut inner = shared.lock();
        inner.conns.retain(|s| s.id != id);
        shared.update_connected(&inner);
    }
    match result {
        Ok(()) => info!(conn = id, "ztunnel disconnected"),
        Err(e) => warn!(conn = id, error = %e, reason = e.reason(), "ztunnel connection closed"),
    }
}

/// Hello, snapshot, then live requests until the peer or the server goes away.
async fn session(id: u64, stream: &UnixStream, shared: &Shared) -> Result<(), ConnError> {
    conn::read_hello(stream).await?;
    let (tx, mut jobs) = mpsc::unbounded_channel();
    // Registering and reading the cache under one lock: a pod added concurrently is either
    // in this snapshot or queued for this connection, never lost.
    let snapshot: Vec<(String, CachedPod)> = {
        let mut inner = shared.lock();
        inner.conns.push(Slot {
            id,
            jobs: tx,
            snapshot_sent: false,
        });
        inner
            .pods
            .iter()
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect()
    };
    info!(
        conn = id,
        pods = snapshot.len(),
        "ztunnel said hello; sending the snapshot"
    );
    send_snapshot(id, stream, snapshot).await?;
    {
        let mut inner = shared.lock();
        if let Some(slot) = inner.conns.iter_mut().find(|s| s.id == id) {
            slot.snapshot_sent = true;
        }
        shared.update_connected(&inner);
    }
    loop {
        tokio::select! {
            job = jobs.recv() => {
                let Some(job) = job else { return Ok(()) };
                run_job(id, stream, job).await?;
            }
            // ztunnel only ever answers: anything it sends unasked is a protocol error, and
            // end-of-file means it went away.
            received = conn::recv(stream, "read") => {
                let bytes = received?;
                return Err(ConnError::Protocol {
                    what: "message",
                    detail: format!("{} unexpected bytes while idle", bytes.len()),
                });
            }
        }
    }
}

async fn send_snapshot(
    id: u64,
    stream: &UnixStream,
    snapshot: Vec<(String, CachedPod)>,
) -> Result<(), ConnError> {
    for (uid, pod) in snapshot {
        let (payload, fd): (Payload, Option<OwnedFd>) = match std::fs::File::open(&pod.netns) {
            Ok(file) => (
                Payload::Add(AddWorkload {
                    uid: uid.clone(),
                    workload_info: Some(pod.info),
                }),
                Some(file.into()),
            ),
            Err(e) => {
                debug!(conn = id, uid, netns = %pod.netns.display(), error = %e,
                    "netns cannot be opened; sending Keep");
                (Payload::Keep(KeepWorkload { uid: uid.clone() }), None)
            }
        };
        let ack = conn::exchange(stream, &encode(payload), fd.as_ref().map(|f| f.as_fd())).await?;
        if let Err(error) = ack {
            warn!(conn = id, uid, %error, "ztunnel NACKed a snapshot pod");
        }
    }
    let payload = Payload::SnapshotSent(SnapshotSent {});
    if let Err(error) = conn::exchange(stream, &encode(payload), None).await? {
        warn!(conn = id, %error, "ztunnel NACKed SnapshotSent");
    }
    info!(conn = id, "snapshot sent to ztunnel");
    Ok(())
}

/// Sends one live request and reports its outcome; a connection failure ends the session.
async fn run_job(id: u64, stream: &UnixStream, job: Job) -> Result<(), ConnError> {
    let Job {
        uid,
        payload,
        fd,
        reply,
    } = job;
    let kind = match payload {
        Payload::Add(_) => "add",
        Payload::Del(_) => "del",
        _ => "request",
    };
    let exchanged = conn::exchange(stream, &encode(payload), fd.as_ref().map(|f| f.as_fd())).await;
    match exchanged {
        Ok(Ok(())) => {
            debug!(conn = id, uid, kind, "ztunnel acked");
            let _ = reply.send(Outcome::Ack);
            Ok(())
        }
        Ok(Err(error)) => {
            warn!(conn = id, uid, kind, %error, "ztunnel NACKed");
            let _ = reply.send(Outcome::Nack(error));
            Ok(())
        }
        Err(e) => {
            let _ = reply.send(Outcome::Failed(e.to_string()));
            Err(e)
        }
    }
}
