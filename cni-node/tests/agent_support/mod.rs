//! Test peers for the agent tests: a ztunnel-side ZDS client (SOCK_SEQPACKET, SCM_RIGHTS)
//! and a recording [`Redirector`].

#![allow(dead_code, reason = "each test file uses part of the support module")]

use std::collections::{BTreeSet, HashSet};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cni_node::redirect::{PodNetwork, RedirectError, Redirector};
use mesh_proto::workload::zds::{
    workload_request::Payload, workload_response, Ack, Version, WorkloadRequest, WorkloadResponse,
    ZdsHello,
};
use nix::sys::socket::{
    self as sock, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use prost::Message;
use tokio::io::Interest;
use tokio::net::UnixStream;

/// How long tests wait for anything.
pub const WAIT: Duration = Duration::from_secs(10);

/// One request as ztunnel receives it.
#[derive(Debug)]
pub struct Request {
    pub payload: Payload,
    pub fd: Option<OwnedFd>,
}

impl Request {
    /// `add <uid>`, `keep <uid>`, `del <uid>` or `snapshot-sent`.
    pub fn describe(&self) -> String {
        match &self.payload {
            Payload::Add(a) => format!("add {}", a.uid),
            Payload::Keep(k) => format!("keep {}", k.uid),
            Payload::Del(d) => format!("del {}", d.uid),
            Payload::SnapshotSent(_) => "snapshot-sent".to_string(),
        }
    }
}

/// (device, inode) of a netns file or fd: equal means the same namespace.
pub fn netns_id_of_path(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).expect("stat netns path");
    (meta.dev(), meta.ino())
}

pub fn netns_id_of_fd(fd: OwnedFd) -> (u64, u64) {
    let meta = std::fs::File::from(fd).metadata().expect("fstat netns fd");
    (meta.dev(), meta.ino())
}

/// The ztunnel side of one ZDS connection.
pub struct TestZtunnel {
    stream: UnixStream,
}

impl TestZtunnel {
    pub fn connect(path: &Path) -> io::Result<TestZtunnel> {
        let fd = sock::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        sock::connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
        let stream = UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?;
        Ok(TestZtunnel { stream })
    }

    /// Connects (retrying while the server starts) and says hello.
    pub async fn hello(path: &Path) -> TestZtunnel {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match TestZtunnel::connect(path) {
                Ok(zt) => {
                    let hello = ZdsHello {
                        version: Version::V1 as i32,
                    };
                    zt.send_raw(&hello.encode_to_vec())
                        .await
                        .expect("send hello");
                    return zt;
                }
                Err(e) if tokio::time::Instant::now() > deadline => panic!("connect: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    pub async fn send_raw(&self, bytes: &[u8]) -> io::Result<()> {
        let raw = self.stream.as_raw_fd();
        let iov = [IoSlice::new(bytes)];
        self.stream
            .async_io(Interest::WRITABLE, || {
                sock::sendmsg::<()>(raw, &iov, &[], MsgFlags::MSG_NOSIGNAL, None)
                    .map(|_| ())
                    .map_err(io::Error::from)
            })
            .await
    }

    /// The next request; `None` when the agent closed the connection.
    pub async fn recv(&self) -> Option<Request> {
        let raw = self.stream.as_raw_fd();
        let (data, fds) = tokio::time::timeout(
            WAIT,
            self.stream
                .async_io(Interest::READABLE, || recv_datagram(raw)),
        )
        .await
        .expect("a request from the agent in time")
        .expect("recvmsg");
        if data.is_empty() && fds.is_empty() {
            return None;
        }
        assert!(fds.len() <= 1, "at most one fd per request");
        let request = WorkloadRequest::decode(&data[..]).expect("WorkloadRequest");
        Some(Request {
            payload: request.payload.expect("payload"),
            fd: fds.into_iter().next(),
        })
    }

    /// Whether the agent closed the connection (waits up to `WAIT`).
    pub async fn closed(&self) -> bool {
        self.recv().await.is_none()
    }

    /// `None` if nothing arrives within `wait`.
    pub async fn try_recv(&self, wait: Duration) -> Option<Request> {
        tokio::time::timeout(wait, self.recv()).await.ok().flatten()
    }

    pub async fn ack(&self) {
        self.answer("").await;
    }

    pub async fn nack(&self, error: &str) {
        self.answer(error).await;
    }

    async fn answer(&self, error: &str) {
        let response = WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack {
                error: error.to_string(),
            })),
        };
        self.send_raw(&response.encode_to_vec())
            .await
            .expect("send ack");
    }

    /// Receives and acks requests up to and including `SnapshotSent`.
    pub async fn take_snapshot(&self) -> Vec<Request> {
        let mut items = Vec::new();
        loop {
            let request = self.recv().await.expect("snapshot request");
            self.ack().await;
            if matches!(request.payload, Payload::SnapshotSent(_)) {
                return items;
            }
            items.push(request);
        }
    }
}

fn recv_datagram(fd: RawFd) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = [0u8; 4096];
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
    let n = msg.bytes;
    Ok((buf[..n].to_vec(), fds))
}

#[expect(
    unsafe_code,
    reason = "SCM_RIGHTS descriptors arrive as raw fds that nothing else owns"
)]
fn own_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in our table for this recvmsg; nothing else refers
    // to it, so we are its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A ztunnel that acks everything (NACKs the uids in `nack`) and records what it got.
#[derive(Clone, Default)]
pub struct AutoZtunnel {
    pub log: Arc<Mutex<Vec<String>>>,
    pub nack: Arc<Mutex<HashSet<String>>>,
}

impl AutoZtunnel {
    /// Connects to `path` and serves until the agent closes the connection.
    pub fn spawn(path: &Path) -> (AutoZtunnel, tokio::task::JoinHandle<()>) {
        let zt = AutoZtunnel::default();
        let path = path.to_path_buf();
        let me = zt.clone();
        let task = tokio::spawn(async move {
            let conn = TestZtunnel::hello(&path).await;
            while let Some(request) = conn.recv().await {
                let text = request.describe();
                let uid = text.split_whitespace().nth(1).unwrap_or("").to_string();
                let nack = me.nack.lock().expect("lock").contains(&uid) && text.starts_with("add");
                me.log.lock().expect("lock").push(text);
                match nack {
                    true => conn.nack("test ztunnel rejects this pod").await,
                    false => conn.ack().await,
                }
            }
        });
        (zt, task)
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("lock").clone()
    }

    /// Waits until the log contains `entry`.
    pub async fn wait_for(&self, entry: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !self.log().iter().any(|e| e == entry) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "ztunnel never got {entry:?}; got {:?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// What the recording redirector was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Enroll(PathBuf),
    Unenroll(PathBuf),
}

/// A redirector that records calls and keeps the set of "installed" netns (a set: enrolling
/// twice installs one copy, as the real one). Enrolls of netns in `fail` fail.
#[derive(Default)]
pub struct RecordingRedirector {
    pub calls: Mutex<Vec<Call>>,
    pub installed: Mutex<BTreeSet<PathBuf>>,
    pub fail: Mutex<HashSet<PathBuf>>,
}

impl RecordingRedirector {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }

    pub fn installed(&self) -> Vec<PathBuf> {
        self.installed
            .lock()
            .expect("lock")
            .iter()
            .cloned()
            .collect()
    }

    pub fn enroll_count(&self, netns: &Path) -> usize {
        self.calls()
            .iter()
            .filter(|c| **c == Call::Enroll(netns.to_path_buf()))
            .count()
    }

    /// Waits until `netns` is installed (`true`) or not (`false`).
    pub async fn wait_installed(&self, netns: &Path, want: bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.installed().contains(&netns.to_path_buf()) != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} installed should be {want}; calls {:?}",
                netns.display(),
                self.calls()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Redirector for RecordingRedirector {
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.calls
            .lock()
            .expect("lock")
            .push(Call::Enroll(pod.netns.clone()));
        if self.fail.lock().expect("lock").contains(&pod.netns) {
            return Err(RedirectError::Netns {
                path: pod.netns.clone(),
                source: io::Error::other("test failure"),
            });
        }
        self.installed
            .lock()
            .expect("lock")
            .insert(pod.netns.clone());
        Ok(())
    }

    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.calls
            .lock()
            .expect("lock")
            .push(Call::Unenroll(pod.netns.clone()));
        self.installed.lock().expect("lock").remove(&pod.netns);
        Ok(())
    }

    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError> {
        Ok(self.installed.lock().expect("lock").contains(&pod.netns))
    }

    fn name(&self) -> &'static str {
        "recording"
    }
}
