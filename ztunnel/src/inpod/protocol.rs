//! The ztunnel side of ZDS: a `SOCK_SEQPACKET` unix socket to the node agent carrying one
//! protobuf per datagram. ztunnel connects, sends `ZdsHello{V1}`, then reads `WorkloadRequest`s
//! (an `Add` carries the pod's netns fd as `SCM_RIGHTS`) and answers each with one
//! `WorkloadResponse{ack}` in order; a non-empty `ack.error` is a NACK.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use mesh_proto::workload::zds::{
    self, workload_request::Payload, workload_response, Ack, WorkloadRequest, WorkloadResponse,
    ZdsHello,
};
use nix::sys::socket::{
    self as sock, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use prost::Message;
use tokio::io::Interest;
use tokio::net::UnixStream;

use super::netns::{Netns, NetnsError};
use crate::proxy::PodInfo;

/// Receive buffer of one datagram (as upstream); longer messages are rejected.
pub const MAX_MESSAGE: usize = 1024;

/// Errors of the ZDS connection itself (the manager reconnects on these).
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("cannot connect to the node agent at {path}: {source}; is istio-cni running on this node and is /var/run/ztunnel shared with it?")]
    Connect {
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
    #[error("the node agent closed the ZDS connection")]
    Closed,
}

impl ZdsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ZdsError::Connect { .. } => "connect",
            ZdsError::Io { .. } => "io",
            ZdsError::Closed => "closed",
        }
    }
}

/// A datagram that is not a valid request; its text is sent back as the NACK.
#[derive(Debug, thiserror::Error)]
pub enum InvalidMessage {
    #[error("message truncated: longer than {MAX_MESSAGE} bytes")]
    Truncated,
    #[error("ancillary data truncated: too many file descriptors")]
    ControlTruncated,
    #[error("cannot decode WorkloadRequest: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("WorkloadRequest has no payload")]
    NoPayload,
    #[error("expected at most 1 file descriptor, got {0}")]
    TooManyFds(usize),
    #[error("AddWorkload for {uid} carries no netns fd")]
    AddWithoutFd { uid: String },
    #[error("{kind} must not carry a file descriptor")]
    UnexpectedFd { kind: &'static str },
    #[error("{kind} has an empty uid")]
    EmptyUid { kind: &'static str },
    #[error("AddWorkload for {uid}: {source}")]
    BadNetns {
        uid: String,
        #[source]
        source: NetnsError,
    },
}

impl InvalidMessage {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            InvalidMessage::Truncated => "truncated",
            InvalidMessage::ControlTruncated => "control_truncated",
            InvalidMessage::Decode(_) => "decode",
            InvalidMessage::NoPayload => "no_payload",
            InvalidMessage::TooManyFds(_) => "too_many_fds",
            InvalidMessage::AddWithoutFd { .. } => "add_without_fd",
            InvalidMessage::UnexpectedFd { .. } => "unexpected_fd",
            InvalidMessage::EmptyUid { .. } => "empty_uid",
            InvalidMessage::BadNetns { .. } => "bad_netns",
        }
    }
}

/// A decoded request.
#[derive(Debug)]
pub enum WorkloadMessage {
    /// Start (or keep) the proxy of `pod` in `netns`.
    Add { pod: PodInfo, netns: Netns },
    /// Snapshot only: the pod is known but its netns was not sent.
    Keep { uid: String },
    /// Drain the proxy of the pod.
    Del { uid: String },
    /// The snapshot is complete.
    SnapshotSent,
}

/// One datagram as received: the request, or why it is not one.
pub type Received = Result<WorkloadMessage, InvalidMessage>;

/// A connection to the node agent. The `SOCK_SEQPACKET` socket is registered with Tokio as a
/// `UnixStream` only for readiness; every read and write is a `recvmsg`/`sendmsg` of one
/// whole datagram.
pub struct ZdsConnection {
    fd: UnixStream,
}

impl std::fmt::Debug for ZdsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZdsConnection(fd {})", self.fd.as_raw_fd())
    }
}

impl ZdsConnection {
    /// Connects to the node agent's socket at `path`.
    pub fn connect(path: &Path) -> Result<ZdsConnection, ZdsError> {
        let err = |source: io::Error| ZdsError::Connect {
            path: path.to_path_buf(),
            source,
        };
        let fd = sock::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| err(e.into()))?;
        let addr = UnixAddr::new(path).map_err(|e| err(e.into()))?;
        // A unix connect completes at once or fails (EAGAIN = backlog full: retried later).
        sock::connect(fd.as_raw_fd(), &addr).map_err(|e| err(e.into()))?;
        let fd = UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)).map_err(err)?;
        Ok(ZdsConnection { fd })
    }

    /// Sends `ZdsHello{version: V1}`.
    pub async fn send_hello(&self) -> Result<(), ZdsError> {
        let hello = ZdsHello {
            version: zds::Version::V1 as i32,
        };
        self.send("hello", &hello.encode_to_vec()).await
    }

    /// Answers the last request: `None` = ACK, `Some(error)` = NACK.
    pub async fn send_ack(&self, error: Option<String>) -> Result<(), ZdsError> {
        let response = WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack {
                error: error.unwrap_or_default(),
            })),
        };
        self.send("ack", &response.encode_to_vec()).await
    }

    async fn send(&self, op: &'static str, buf: &[u8]) -> Result<(), ZdsError> {
        let io_err = |source| ZdsError::Io { op, source };
        let raw = self.fd.as_raw_fd();
        let iov = [IoSlice::new(buf)];
        self.fd
            .async_io(Interest::WRITABLE, || {
                sock::sendmsg::<()>(raw, &iov, &[], MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            })
            .await
            .map(|_| ())
            .map_err(io_err)
    }

    /// Reads the next datagram. `Ok(None)` = the node agent closed the connection. Cancel-safe.
    pub async fn recv(&self) -> Result<Option<Received>, ZdsError> {
        let io_err = |source| ZdsError::Io { op: "read", source };
        let raw = self.fd.as_raw_fd();
        let datagram = self
            .fd
            .async_io(Interest::READABLE, || recv_datagram(raw))
            .await
            .map_err(io_err)?;
        Ok(datagram.map(|d| parse(&d.data, d.fds, d.flags)))
    }
}

/// One received datagram with the descriptors that came with it.
struct Datagram {
    data: Vec<u8>,
    fds: Vec<OwnedFd>,
    flags: MsgFlags,
}

fn recv_datagram(fd: RawFd) -> io::Result<Option<Datagram>> {
    let mut buf = [0u8; MAX_MESSAGE];
    // Room for a few fds, so a sender passing several has them closed by us, not leaked.
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = sock::recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().map(own_received_fd));
        }
    }
    let (bytes, flags) = (msg.bytes, msg.flags);
    if bytes == 0 && fds.is_empty() && !flags.contains(MsgFlags::MSG_TRUNC) {
        return Ok(None);
    }
    Ok(Some(Datagram {
        data: buf[..bytes.min(MAX_MESSAGE)].to_vec(),
        fds,
        flags,
    }))
}

#[expect(
    unsafe_code,
    reason = "SCM_RIGHTS descriptors arrive as raw fds that nothing else owns"
)]
fn own_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in our table for this recvmsg; nothing else refers to
    // it, so we are its only owner and it is closed exactly once when dropped.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Decodes one datagram. Extra descriptors are closed (dropped) whatever the outcome.
pub fn parse(data: &[u8], mut fds: Vec<OwnedFd>, flags: MsgFlags) -> Received {
    if flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(InvalidMessage::Truncated);
    }
    if flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(InvalidMessage::ControlTruncated);
    }
    if fds.len() > 1 {
        return Err(InvalidMessage::TooManyFds(fds.len()));
    }
    let fd = fds.pop();
    let payload = WorkloadRequest::decode(data)?
        .payload
        .ok_or(InvalidMessage::NoPayload)?;
    let no_fd = |kind| match fd {
        Some(_) => Err(InvalidMessage::UnexpectedFd { kind }),
        None => Ok(()),
    };
    let uid = |kind, uid: String| match uid.is_empty() {
        true => Err(InvalidMessage::EmptyUid { kind }),
        false => Ok(uid),
    };
    match payload {
        Payload::Add(add) => {
            let uid = uid("AddWorkload", add.uid)?;
            let Some(fd) = fd else {
                return Err(InvalidMessage::AddWithoutFd { uid });
            };
            let netns = Netns::from_fd(fd).map_err(|source| InvalidMessage::BadNetns {
                uid: uid.clone(),
                source,
            })?;
            let info = add.workload_info.unwrap_or_default();
            let pod = PodInfo {
                uid,
                name: info.name,
                namespace: info.namespace,
                service_account: info.service_account,
            };
            Ok(WorkloadMessage::Add { pod, netns })
        }
        Payload::Keep(keep) => {
            no_fd("KeepWorkload")?;
            Ok(WorkloadMessage::Keep {
                uid: uid("KeepWorkload", keep.uid)?,
            })
        }
        Payload::Del(del) => {
            no_fd("DelWorkload")?;
            Ok(WorkloadMessage::Del {
                uid: uid("DelWorkload", del.uid)?,
            })
        }
        Payload::SnapshotSent(_) => {
            no_fd("SnapshotSent")?;
            Ok(WorkloadMessage::SnapshotSent)
        }
    }
}
