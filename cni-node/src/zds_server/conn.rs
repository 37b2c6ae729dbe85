//! One ztunnel connection on the `SOCK_SEQPACKET` socket: whole-datagram sends (with an
//! optional netns fd as `SCM_RIGHTS`) and receives, each bounded by [`ACK_DEADLINE`].

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use tokio::net::UnixStream;

use super::ACK_DEADLINE;

/// Longest datagram ztunnel sends (it reads requests into 1024 bytes; acks are far smaller).
const MAX_DATAGRAM: usize = 1024;

/// Why a connection ended or a request could not be exchanged on it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("ZDS {op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no {what} from ztunnel within {ACK_DEADLINE:?}")]
    Timeout { what: &'static str },
    #[error("ztunnel closed the connection")]
    Closed,
    #[error("bad {what} from ztunnel: {source}")]
    Malformed {
        what: &'static str,
        #[source]
        source: mesh_zds::DecodeError,
    },
    #[error("bad {what} from ztunnel: {detail}")]
    Protocol { what: &'static str, detail: String },
}

impl ConnError {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            ConnError::Io { .. } => "io",
            ConnError::Timeout { .. } => "timeout",
            ConnError::Closed => "closed",
            ConnError::Malformed { .. } | ConnError::Protocol { .. } => "protocol",
        }
    }
}

/// Creates the listening socket at `path`, replacing a stale socket file.
pub(crate) fn listen(path: &Path) -> io::Result<UnixStream> {
    mesh_zds::listen(path)
}

/// Accepts one connection (waits until there is one).
pub(crate) async fn accept(listener: &UnixStream) -> io::Result<UnixStream> {
    mesh_zds::accept(listener).await
}

/// Sends `bytes` (and `fd`) as one datagram.
pub(crate) async fn send(
    conn: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ConnError> {
    tokio::time::timeout(ACK_DEADLINE, mesh_zds::send(conn, bytes, fd))
        .await
        .map_err(|_| ConnError::Timeout { what: "send" })?
        .map_err(|source| ConnError::Io { op: "send", source })
}

/// Reads one datagram. Cancel-safe: nothing is consumed unless it returns.
pub(crate) async fn recv(conn: &UnixStream, what: &'static str) -> Result<Vec<u8>, ConnError> {
    let buf = mesh_zds::recv(conn, MAX_DATAGRAM)
        .await
        .map_err(|source| ConnError::Io { op: what, source })?;
    match buf.is_empty() {
        true => Err(ConnError::Closed),
        false => Ok(buf),
    }
}

/// Reads one datagram within [`ACK_DEADLINE`].
pub(crate) async fn recv_deadline(
    conn: &UnixStream,
    what: &'static str,
) -> Result<Vec<u8>, ConnError> {
    tokio::time::timeout(ACK_DEADLINE, recv(conn, what))
        .await
        .map_err(|_| ConnError::Timeout { what })?
}

/// Reads and checks `ZdsHello{V1}`.
pub(crate) async fn read_hello(conn: &UnixStream) -> Result<(), ConnError> {
    let bytes = recv_deadline(conn, "hello").await?;
    mesh_zds::decode_hello(&bytes).map_err(|source| ConnError::Malformed {
        what: "hello",
        source,
    })
}

/// Sends one request and waits for its ack: `Ok(Ok(()))` = ACK, `Ok(Err(nack))` = NACK.
pub(crate) async fn exchange(
    conn: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<mesh_zds::AckResult, ConnError> {
    send(conn, bytes, fd).await?;
    let buf = recv_deadline(conn, "ack").await?;
    mesh_zds::decode_ack(&buf).map_err(|source| ConnError::Malformed {
        what: "ack",
        source,
    })
}
