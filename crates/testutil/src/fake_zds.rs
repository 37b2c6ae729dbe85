//! A fake node agent (istio-cni) for ztunnel's in-pod mode: it listens on a `SOCK_SEQPACKET`
//! unix socket, accepts ztunnel's connections (the newest one wins), checks `ZdsHello{V1}`,
//! sends its snapshot (`AddWorkload` with the pod's netns fd as `SCM_RIGHTS`, or
//! `KeepWorkload`) then `SnapshotSent`, waiting for each `Ack`. Afterwards the test sends live
//! `Add`/`Del` requests, or raw bytes, and gets the ack back. Every ack is awaited for at most
//! [`ACK_DEADLINE`], as the real node agent does.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use mesh_proto::workload::zds::{
    workload_request::Payload, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo,
    WorkloadRequest,
};
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

/// How long the fake waits for each hello/ack (the node agent's deadline).
pub const ACK_DEADLINE: Duration = Duration::from_secs(5);

/// How long [`FakeZds::add`] and friends wait for ztunnel to connect and take the snapshot.
pub const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// What went wrong talking to ztunnel (a NACK is not an error: it is the `Err` inside `Ok`).
#[derive(Debug, thiserror::Error)]
pub enum FakeZdsError {
    #[error(
        "cannot listen on {path}: {source}; is the directory writable and the old fake stopped?"
    )]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("ZDS {op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no {what} from ztunnel within {ACK_DEADLINE:?}")]
    Timeout { what: &'static str },
    #[error("ztunnel did not connect and take the snapshot within {CONNECT_WAIT:?}; is the manager running with INPOD_UDS pointing here?")]
    NotConnected,
    #[error("ztunnel closed the connection")]
    Closed,
    #[error("bad {what} from ztunnel: {source}")]
    Malformed {
        what: &'static str,
        #[source]
        source: mesh_zds::DecodeError,
    },
}

impl FakeZdsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            FakeZdsError::Bind { .. } => "bind",
            FakeZdsError::Io { .. } => "io",
            FakeZdsError::Timeout { .. } => "timeout",
            FakeZdsError::NotConnected => "not_connected",
            FakeZdsError::Closed => "closed",
            FakeZdsError::Malformed { .. } => "protocol",
        }
    }
}

/// The result of one request: `Ok(())` = ACK, `Err(nack)` = NACK with ztunnel's error text.
pub type AckResult = mesh_zds::AckResult;

/// One pod of the snapshot.
#[derive(Clone, Debug)]
pub enum SnapshotItem {
    /// `AddWorkload` with the pod's netns fd.
    Add {
        uid: String,
        info: WorkloadInfo,
        netns: Arc<OwnedFd>,
    },
    /// `KeepWorkload` (no fd).
    Keep { uid: String },
}

impl SnapshotItem {
    /// An `Add` passing a duplicate of `netns`.
    pub fn add(uid: &str, info: WorkloadInfo, netns: impl AsFd) -> io::Result<SnapshotItem> {
        Ok(SnapshotItem::Add {
            uid: uid.to_string(),
            info,
            netns: Arc::new(netns.as_fd().try_clone_to_owned()?),
        })
    }

    /// An `Add` passing the netns file at `path` (`/proc/<pid>/ns/net`, `/var/run/netns/x`).
    pub fn add_path(uid: &str, info: WorkloadInfo, path: &Path) -> io::Result<SnapshotItem> {
        let file = std::fs::File::open(path)?;
        SnapshotItem::add(uid, info, file)
    }

    /// A `Keep`.
    pub fn keep(uid: &str) -> SnapshotItem {
        SnapshotItem::Keep {
            uid: uid.to_string(),
        }
    }
}

/// `WorkloadInfo` of a pod.
pub fn workload_info(name: &str, namespace: &str, service_account: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.to_string(),
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
    }
}

struct Shared {
    snapshot: StdMutex<Vec<SnapshotItem>>,
    /// The connection that completed its snapshot last (the newest wins).
    current: Mutex<Option<UnixStream>>,
    /// Acks of the last snapshot, in order (`SnapshotSent` last).
    snapshot_acks: StdMutex<Vec<AckResult>>,
    /// Connections whose snapshot completed.
    snapshots: watch::Sender<u64>,
    /// Connections that failed before completing their snapshot, with why.
    failures: StdMutex<Vec<String>>,
}

/// The fake node agent.
pub struct FakeZds {
    path: PathBuf,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FakeZds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FakeZds({})", self.path.display())
    }
}

impl FakeZds {
    /// Listens at `path` (replacing a stale socket file) and serves `snapshot` to every
    /// ztunnel that connects. Must be called within a Tokio runtime.
    pub fn start(path: &Path, snapshot: Vec<SnapshotItem>) -> Result<FakeZds, FakeZdsError> {
        let listener = mesh_zds::listen(path).map_err(|source| FakeZdsError::Bind {
            path: path.to_path_buf(),
            source,
        })?;
        let shared = Arc::new(Shared {
            snapshot: StdMutex::new(snapshot),
            current: Mutex::new(None),
            snapshot_acks: StdMutex::new(Vec::new()),
            snapshots: watch::Sender::new(0),
            failures: StdMutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(FakeZds {
            path: path.to_path_buf(),
            shared,
            accept,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The snapshot sent to connections from now on.
    pub fn set_snapshot(&self, snapshot: Vec<SnapshotItem>) {
        *lock(&self.shared.snapshot) = snapshot;
    }

    /// Waits until `n` connections (in this fake's life) have completed their snapshot.
    pub async fn wait_snapshots(&self, n: u64) -> Result<(), FakeZdsError> {
        let mut rx = self.shared.snapshots.subscribe();
        let waited = tokio::time::timeout(CONNECT_WAIT, rx.wait_for(|c| *c >= n)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(FakeZdsError::Closed),
            Err(_) => Err(FakeZdsError::NotConnected),
        }
    }

    /// Acks of the last completed snapshot, in order (`SnapshotSent`'s last).
    pub fn snapshot_acks(&self) -> Vec<AckResult> {
        lock(&self.shared.snapshot_acks).clone()
    }

    /// Why connections failed before completing their snapshot.
    pub fn failures(&self) -> Vec<String> {
        lock(&self.shared.failures).clone()
    }

    /// Sends a live `AddWorkload` with (a duplicate of) `netns`.
    pub async fn add(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: impl AsFd,
    ) -> Result<AckResult, FakeZdsError> {
        let req = Payload::Add(AddWorkload {
            uid: uid.to_string(),
            workload_info: Some(info),
        });
        self.request(&request(req), Some(netns.as_fd())).await
    }

    /// Sends a live `DelWorkload`.
    pub async fn del(&self, uid: &str) -> Result<AckResult, FakeZdsError> {
        let req = Payload::Del(DelWorkload {
            uid: uid.to_string(),
        });
        self.request(&request(req), None).await
    }

    /// Sends `bytes` (and `fd`, if any) as one datagram and returns the ack.
    pub async fn send_raw(
        &self,
        bytes: &[u8],
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<AckResult, FakeZdsError> {
        self.request(bytes, fd).await
    }

    async fn request(
        &self,
        bytes: &[u8],
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<AckResult, FakeZdsError> {
        self.wait_snapshots(1).await?;
        let current = self.shared.current.lock().await;
        let conn = current.as_ref().ok_or(FakeZdsError::NotConnected)?;
        send(conn, bytes, fd).await?;
        recv_ack(conn).await
    }

    /// Stops listening, closes the connection and removes the socket file.
    pub async fn stop(mut self) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
        self.shared.current.lock().await.take();
    }
}

impl Drop for FakeZds {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut current) = self.shared.current.try_lock() {
            current.take();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn request(payload: Payload) -> Vec<u8> {
    WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec()
}

async fn accept_loop(listener: UnixStream, shared: Arc<Shared>) {
    loop {
        let conn = match mesh_zds::accept(&listener).await {
            Ok(conn) => conn,
            Err(e) => {
                lock(&shared.failures).push(format!("accept: {e}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // The newest connection wins: drop the old one before the handshake.
        let mut current = shared.current.lock().await;
        current.take();
        let snapshot = lock(&shared.snapshot).clone();
        match handshake(&conn, &snapshot).await {
            Ok(acks) => {
                *lock(&shared.snapshot_acks) = acks;
                *current = Some(conn);
                drop(current);
                shared.snapshots.send_modify(|c| *c += 1);
            }
            Err(e) => lock(&shared.failures).push(e.to_string()),
        }
    }
}

/// Checks the hello, sends the snapshot and `SnapshotSent`, returning every ack.
async fn handshake(
    conn: &UnixStream,
    snapshot: &[SnapshotItem],
) -> Result<Vec<AckResult>, FakeZdsError> {
    let hello = recv_datagram(conn, "hello").await?;
    mesh_zds::decode_hello(&hello).map_err(|source| FakeZdsError::Malformed {
        what: "hello",
        source,
    })?;
    let mut acks = Vec::new();
    for item in snapshot {
        let (payload, fd) = match item {
            SnapshotItem::Add { uid, info, netns } => (
                Payload::Add(AddWorkload {
                    uid: uid.clone(),
                    workload_info: Some(info.clone()),
                }),
                Some(netns.as_fd()),
            ),
            SnapshotItem::Keep { uid } => (Payload::Keep(KeepWorkload { uid: uid.clone() }), None),
        };
        send(conn, &request(payload), fd).await?;
        acks.push(recv_ack(conn).await?);
    }
    send(conn, &request(Payload::SnapshotSent(SnapshotSent {})), None).await?;
    acks.push(recv_ack(conn).await?);
    Ok(acks)
}

async fn send(
    conn: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), FakeZdsError> {
    tokio::time::timeout(ACK_DEADLINE, mesh_zds::send(conn, bytes, fd))
        .await
        .map_err(|_| FakeZdsError::Timeout { what: "send" })?
        .map_err(|source| FakeZdsError::Io { op: "send", source })
}

async fn recv_datagram(conn: &UnixStream, what: &'static str) -> Result<Vec<u8>, FakeZdsError> {
    let buf = tokio::time::timeout(ACK_DEADLINE, mesh_zds::recv(conn, 4096))
        .await
        .map_err(|_| FakeZdsError::Timeout { what })?
        .map_err(|source| FakeZdsError::Io { op: what, source })?;
    match buf.is_empty() {
        true => Err(FakeZdsError::Closed),
        false => Ok(buf),
    }
}

async fn recv_ack(conn: &UnixStream) -> Result<AckResult, FakeZdsError> {
    let buf = recv_datagram(conn, "ack").await?;
    mesh_zds::decode_ack(&buf).map_err(|source| FakeZdsError::Malformed {
        what: "ack",
        source,
    })
}
