//! One ztunnel connection on the `SOCK_SEQPACKET` socket: whole-datagram sends (with an
//! optional netns fd as `SCM_RIGHTS`) and receives, each bounded by [`ACK_DEADLINE`].

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use mesh_proto::workload::zds::{workload_response, Version, WorkloadResponse, ZdsHello};
use nix::sys::socket::{
    self as sock, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};
use prost::Message;
use tokio::io::Interest;
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
    #[error("bad {what} from ztunnel: {detail}")]
    Protocol { what: &'static str, detail: String },
}

impl ConnError {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            ConnError::Io { .. } => "io",
            ConnError::Timeout { .. } => "timeout",
            ConnError::Closed => "closed",
            ConnError::Protocol { .. } => "protocol",
        }
    }
}

/// Creates the listening socket at `path`, replacing a stale socket file.
pub(crate) fn listen(path: &Path) -> io::Result<UnixStream> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let fd = sock::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    sock::bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    sock::listen(&fd, sock::Backlog::new(16)?)?;
    // Registered as a UnixStream only for readiness; accept4 does the work.
    UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// Accepts one connection (waits until there is one).
pub(crate) async fn accept(listener: &UnixStream) -> io::Result<UnixStream> {
    let raw = listener.as_raw_fd();
    let fd = listener
        .async_io(Interest::READABLE, || {
            sock::accept4(raw, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC)
                .map(own_accepted_fd)
                .map_err(io::Error::from)
        })
        .await?;
    UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

#[expect(
    unsafe_code,
    reason = "accept4 returns a raw fd that nothing else owns"
)]
fn own_accepted_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: accept4 just created `fd` for this call and returned it only to us, so we are
    // its only owner and it is closed exactly once when the OwnedFd drops.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Sends `bytes` (and `fd`) as one datagram.
pub(crate) async fn send(
    conn: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ConnError> {
    let raw = conn.as_raw_fd();
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(bytes)];
    let cmsgs: Vec<ControlMessage<'_>> = match fds.is_empty() {
        true => Vec::new(),
        false => vec![ControlMessage::ScmRights(&fds)],
    };
    let sent = conn.async_io(Interest::WRITABLE, || {
        sock::sendmsg::<()>(raw, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
            .map_err(io::Error::from)
    });
    tokio::time::timeout(ACK_DEADLINE, sent)
        .await
        .map_err(|_| ConnError::Timeout { what: "send" })?
        .map(|_| ())
        .map_err(|source| ConnError::Io { op: "send", source })
}

/// Reads one datagram. Cancel-safe: nothing is consumed unless it returns.
pub(crate) async fn recv(conn: &UnixStream, what: &'static str) -> Result<Vec<u8>, ConnError> {
    let raw = conn.as_raw_fd();
    let buf = conn
        .async_io(Interest::READABLE, || {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            let n = sock::recv(raw, &mut buf, MsgFlags::empty()).map_err(io::Error::from)?;
            buf.truncate(n);
            Ok(buf)
        })
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
    let hello = ZdsHello::decode(&bytes[..]).map_err(|e| ConnError::Protocol {
        what: "hello",
        detail: e.to_string(),
    })?;
    if hello.version != Version::V1 as i32 {
        return Err(ConnError::Protocol {
            what: "hello",
            detail: format!("version {} (only V1 = 1 is supported)", hello.version),
        });
    }
    Ok(())
}

/// Sends one request and waits for its ack: `Ok(Ok(()))` = ACK, `Ok(Err(text))` = NACK.
pub(crate) async fn exchange(
    conn: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<Result<(), String>, ConnError> {
    send(conn, bytes, fd).await?;
    let buf = recv_deadline(conn, "ack").await?;
    let response = WorkloadResponse::decode(&buf[..]).map_err(|e| ConnError::Protocol {
        what: "ack",
        detail: e.to_string(),
    })?;
    match response.payload {
        Some(workload_response::Payload::Ack(ack)) if ack.error.is_empty() => Ok(Ok(())),
        Some(workload_response::Payload::Ack(ack)) => Ok(Err(ack.error)),
        None => Err(ConnError::Protocol {
            what: "ack",
            detail: "WorkloadResponse without payload".to_string(),
        }),
    }
}
