//! The node agent's side of ZDS on the wire: a `SOCK_SEQPACKET` unix socket that ztunnel
//! connects to, one protobuf per datagram, a pod's netns fd riding along as `SCM_RIGHTS`.
//! Used by cni-node's ZDS server and by `mesh-testutil`'s fake of it; callers add their own
//! deadlines and error types. (ztunnel's side, the client, lives in ztunnel.)

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

/// What ztunnel answered to one request: `Ok(())` = ACK, `Err` = NACK.
pub type AckResult = Result<(), Nack>;

/// ztunnel refused a request (a NACK); the text is its own error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Nack(pub String);

/// Why a datagram from ztunnel is not the message expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not a {message} protobuf: {source}")]
    Protobuf {
        message: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("version {0} (only V1 = 1 is supported)")]
    Version(i32),
    #[error("WorkloadResponse without payload")]
    NoPayload,
}

/// Creates the listening socket at `path` (its directory too), replacing a stale socket file.
/// It is registered with Tokio as a `UnixStream` only for readiness; [`accept`] does the work.
pub fn listen(path: &Path) -> io::Result<UnixStream> {
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
    UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// Accepts one connection on a [`listen`]ing socket (waits until there is one).
pub async fn accept(listener: &UnixStream) -> io::Result<UnixStream> {
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
pub async fn send(conn: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let raw = conn.as_raw_fd();
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(bytes)];
    let cmsgs: Vec<ControlMessage<'_>> = match fds.is_empty() {
        true => Vec::new(),
        false => vec![ControlMessage::ScmRights(&fds)],
    };
    conn.async_io(Interest::WRITABLE, || {
        sock::sendmsg::<()>(raw, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
            .map_err(io::Error::from)
    })
    .await
    .map(|_| ())
}

/// Reads one datagram of at most `max` bytes; empty means the peer closed. Cancel-safe:
/// nothing is consumed unless it returns.
pub async fn recv(conn: &UnixStream, max: usize) -> io::Result<Vec<u8>> {
    let raw = conn.as_raw_fd();
    conn.async_io(Interest::READABLE, || {
        let mut buf = vec![0u8; max];
        let n = sock::recv(raw, &mut buf, MsgFlags::empty()).map_err(io::Error::from)?;
        buf.truncate(n);
        Ok(buf)
    })
    .await
}

/// Decodes ztunnel's first datagram, `ZdsHello`, and checks it asks for V1.
pub fn decode_hello(bytes: &[u8]) -> Result<(), DecodeError> {
    let hello = ZdsHello::decode(bytes).map_err(|source| DecodeError::Protobuf {
        message: "ZdsHello",
        source,
    })?;
    if hello.version != Version::V1 as i32 {
        return Err(DecodeError::Version(hello.version));
    }
    Ok(())
}

/// Decodes ztunnel's `WorkloadResponse`: an ACK or a NACK.
pub fn decode_ack(bytes: &[u8]) -> Result<AckResult, DecodeError> {
    let response = WorkloadResponse::decode(bytes).map_err(|source| DecodeError::Protobuf {
        message: "WorkloadResponse",
        source,
    })?;
    match response.payload {
        Some(workload_response::Payload::Ack(ack)) if ack.error.is_empty() => Ok(Ok(())),
        Some(workload_response::Payload::Ack(ack)) => Ok(Err(Nack(ack.error))),
        None => Err(DecodeError::NoPayload),
    }
}

#[cfg(test)]
mod tests {
    use mesh_proto::workload::zds::Ack;

    use super::*;

    #[test]
    fn hello_must_be_v1() {
        let v1 = ZdsHello {
            version: Version::V1 as i32,
        };
        assert_eq!(decode_hello(&v1.encode_to_vec()), Ok(()));
        let v0 = ZdsHello { version: 0 };
        let err = decode_hello(&v0.encode_to_vec()).expect_err("not V1");
        assert_eq!(err.to_string(), "version 0 (only V1 = 1 is supported)");
        assert!(decode_hello(&[0xff, 0xff]).is_err(), "garbage");
    }

    #[tokio::test]
    async fn datagrams_and_fds_cross_the_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/zds.sock");
        let listener = listen(&path).expect("listen");
        let client = {
            let fd = sock::socket(
                AddressFamily::Unix,
                SockType::SeqPacket,
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                None,
            )
            .expect("socket");
            sock::connect(fd.as_raw_fd(), &UnixAddr::new(&path).expect("addr")).expect("connect");
            UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)).expect("tokio")
        };
        let server = accept(&listener).await.expect("accept");
        let file = std::fs::File::open("/proc/self/ns/net").expect("netns");
        send(&server, b"one", Some(std::os::fd::AsFd::as_fd(&file)))
            .await
            .expect("send");
        send(&server, b"two", None).await.expect("send");
        assert_eq!(recv(&client, 64).await.expect("recv"), b"one");
        assert_eq!(recv(&client, 64).await.expect("recv"), b"two");
        // A stale socket file is replaced.
        drop(listener);
        listen(&path).expect("listen again over the stale file");
    }

    #[test]
    fn acks_and_nacks_decode() {
        let ack = |error: &str| WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack {
                error: error.to_string(),
            })),
        };
        assert_eq!(decode_ack(&ack("").encode_to_vec()), Ok(Ok(())));
        assert_eq!(
            decode_ack(&ack("no netns").encode_to_vec()),
            Ok(Err(Nack("no netns".to_string())))
        );
        let empty = WorkloadResponse { payload: None }.encode_to_vec();
        assert_eq!(decode_ack(&empty), Err(DecodeError::NoPayload));
        assert!(decode_ack(&[0xff, 0xff]).is_err());
    }
}
