//! Pod network namespaces and the sockets made inside them.
//!
//! A [`Netns`] is an owned file descriptor checked to be a network namespace. A socket is made
//! in it by the calling thread itself, as upstream ztunnel does: `setns` into the pod, create
//! the socket, `setns` back into ztunnel's own namespace (two syscalls, no thread hop; a
//! thread per pod cost a context switch each way per dialed connection). A socket stays in
//! the namespace it was created in, so everything after creation (connect, accept, I/O) runs
//! on the ordinary runtime. A thread that cannot get back into ztunnel's namespace aborts the
//! process rather than make sockets in the wrong place.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use mesh_capture::netns::Inside;
use nix::sys::stat::SFlag;
use nix::sys::statfs::NSFS_MAGIC;
use socket2::Socket;

use crate::socket::{SocketFactory, SocketOptions};

/// `NS_GET_NSTYPE` = `_IO(0xb7, 0x3)` (linux/nsfs.h).
const NS_GET_NSTYPE: libc::Ioctl = 0xb703;

/// Why a netns could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open netns {path}: {source}; does the pod's sandbox still exist?")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("fd {fd} ({what}) is not a network namespace; the node agent must send the pod's /proc/<pid>/ns/net or /var/run/netns/<name> fd")]
    NotNetns { fd: RawFd, what: String },
    #[error("fd {fd} is a {kind} namespace, not a network namespace; the node agent sent the wrong /proc/<pid>/ns/<kind> fd")]
    WrongType { fd: RawFd, kind: &'static str },
    #[error("cannot inspect fd {fd}: {source}")]
    Inspect {
        fd: RawFd,
        #[source]
        source: nix::Error,
    },
    #[error("cannot enter netns {id}: {source}; ztunnel needs CAP_SYS_ADMIN to setns into pods")]
    Enter {
        id: NetnsId,
        #[source]
        source: nix::Error,
    },
    #[error("cannot open ztunnel's own netns (/proc/self/ns/net): {source}")]
    Home {
        #[source]
        source: io::Error,
    },
}

impl NetnsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            NetnsError::Open { .. } => "open",
            NetnsError::NotNetns { .. } => "not_netns",
            NetnsError::WrongType { .. } => "wrong_ns_type",
            NetnsError::Inspect { .. } => "inspect",
            NetnsError::Enter { .. } => "setns",
            NetnsError::Home { .. } => "home_netns",
        }
    }
}

/// Identity of a namespace (device and inode of its nsfs file): two fds of the same pod
/// sandbox have the same id; a re-created sandbox has a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NetnsId {
    pub dev: u64,
    pub inode: u64,
}

impl fmt::Display for NetnsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "net:[{}]", self.inode)
    }
}

/// An owned file descriptor of a network namespace.
#[derive(Clone)]
pub struct Netns {
    fd: Arc<OwnedFd>,
    id: NetnsId,
}

impl fmt::Debug for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Netns({}, fd {})", self.id, self.fd.as_raw_fd())
    }
}

impl Netns {
    /// Takes `fd` after checking it is a network namespace.
    pub fn from_fd(fd: OwnedFd) -> Result<Netns, NetnsError> {
        let raw = fd.as_raw_fd();
        let fs = nix::sys::statfs::fstatfs(&fd)
            .map_err(|source| NetnsError::Inspect { fd: raw, source })?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(NetnsError::NotNetns {
                fd: raw,
                what: describe_fd(fd.as_fd()),
            });
        }
        match ns_type(fd.as_fd()) {
            Ok(t) if t == libc::CLONE_NEWNET => {}
            Ok(t) => {
                return Err(NetnsError::WrongType {
                    fd: raw,
                    kind: ns_kind(t),
                })
            }
            // Kernels before 4.11 lack NS_GET_NSTYPE; setns(CLONE_NEWNET) checks the type.
            Err(e) => tracing::debug!(fd = raw, error = %e, "NS_GET_NSTYPE unsupported"),
        }
        let st =
            nix::sys::stat::fstat(&fd).map_err(|source| NetnsError::Inspect { fd: raw, source })?;
        let id = NetnsId {
            dev: st.st_dev,
            inode: st.st_ino,
        };
        Ok(Netns {
            fd: Arc::new(fd),
            id,
        })
    }

    /// Opens a netns file such as `/proc/<pid>/ns/net` or `/var/run/netns/<name>`.
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        let file = std::fs::File::open(path).map_err(|source| NetnsError::Open {
            path: path.display().to_string(),
            source,
        })?;
        Netns::from_fd(file.into())
    }

    /// Which namespace this is.
    pub fn id(&self) -> NetnsId {
        self.id
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[expect(
    unsafe_code,
    reason = "ioctl(NS_GET_NSTYPE) has no safe wrapper in nix or libc"
)]
fn ns_type(fd: BorrowedFd<'_>) -> nix::Result<libc::c_int> {
    // SAFETY: NS_GET_NSTYPE takes no argument and only returns an int; `fd` is a valid open
    // descriptor for the duration of the call (it is borrowed).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) };
    nix::errno::Errno::result(r)
}

fn ns_kind(t: libc::c_int) -> &'static str {
    match t {
        libc::CLONE_NEWNS => "mount",
        libc::CLONE_NEWUTS => "uts",
        libc::CLONE_NEWIPC => "ipc",
        libc::CLONE_NEWUSER => "user",
        libc::CLONE_NEWPID => "pid",
        libc::CLONE_NEWCGROUP => "cgroup",
        libc::CLONE_NEWTIME => "time",
        _ => "unknown",
    }
}

/// "a regular file /tmp/x", "a socket socket:[123]", ... for error messages.
fn describe_fd(fd: BorrowedFd<'_>) -> String {
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".to_string());
    let kind = match nix::sys::stat::fstat(fd) {
        Ok(st) => match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => "a regular file",
            SFlag::S_IFDIR => "a directory",
            SFlag::S_IFSOCK => "a socket",
            SFlag::S_IFIFO => "a pipe",
            SFlag::S_IFCHR => "a character device",
            SFlag::S_IFBLK => "a block device",
            _ => "a file",
        },
        Err(_) => "a file",
    };
    format!("{kind} {target}")
}

/// ztunnel's own netns (the main thread's), where every thread returns after making a socket.
fn home() -> Result<&'static Netns, NetnsError> {
    static HOME: std::sync::OnceLock<Netns> = std::sync::OnceLock::new();
    if let Some(home) = HOME.get() {
        return Ok(home);
    }
    let file =
        std::fs::File::open("/proc/self/ns/net").map_err(|source| NetnsError::Home { source })?;
    let netns = Netns::from_fd(file.into())?;
    Ok(HOME.get_or_init(|| netns))
}

impl Netns {
    /// Runs `f` on the calling thread inside this netns, then returns the thread to ztunnel's
    /// own netns. `f` must not block for long: it holds up the thread it runs on.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
        // Back to ztunnel's own netns afterwards; a thread that cannot get back aborts ztunnel
        // (the node agent hands the pods to the restarted one).
        let _inside =
            Inside::enter(&*self.fd, &*home()?.fd).map_err(|source| NetnsError::Enter {
                id: self.id,
                source,
            })?;
        Ok(f())
    }
}

/// The sockets of one pod: every socket is created inside the pod's netns, with the options
/// (mark, `SO_REUSEPORT`, keepalive) ztunnel applies to in-pod sockets.
#[derive(Debug)]
pub struct InPodSockets {
    pub netns: Netns,
    pub options: SocketOptions,
}

impl InPodSockets {
    /// Sockets of `netns`; fails if ztunnel cannot enter it (missing CAP_SYS_ADMIN, stale fd).
    pub fn new(netns: Netns, options: SocketOptions) -> Result<InPodSockets, NetnsError> {
        netns.run(|| ())?;
        Ok(InPodSockets { netns, options })
    }

    /// Runs `f` inside the pod's netns, on the calling thread.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
        self.netns.run(f)
    }

    fn make<R>(&self, f: impl FnOnce(SocketOptions) -> io::Result<R>) -> io::Result<R> {
        let options = self.options;
        self.netns
            .run(move || f(options))
            .map_err(io::Error::other)?
    }
}

impl SocketFactory for InPodSockets {
    fn new_tcp(&self, family_of: SocketAddr) -> io::Result<Socket> {
        self.make(move |o| o.tcp_socket(family_of))
    }

    fn tcp_listener(&self, addr: SocketAddr) -> io::Result<StdTcpListener> {
        self.make(move |o| o.tcp_listener(addr))
    }

    fn udp_bind(&self, addr: SocketAddr) -> io::Result<StdUdpSocket> {
        self.make(move |o| o.udp_bind(addr))
    }
}
