//! TCP conveniences in a namespace: listeners, (marked) connects with a timeout, an echo server,
//! and `SO_ORIGINAL_DST`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockProtocol, SockType};
use nix::sys::time::{TimeVal, TimeValLike};

use super::{Netns, NetnsError};

impl Netns {
    /// A blocking TCP listener bound to `addr` inside this namespace.
    pub fn tcp_listen(&self, addr: SocketAddr) -> Result<TcpListener, NetnsError> {
        self.run(|| TcpListener::bind(addr))?
            .map_err(|source| self.socket_error("listen on", addr, source))
    }

    /// A TCP connection from this namespace to `addr`, giving up after `timeout`.
    pub fn tcp_connect(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<TcpStream, NetnsError> {
        self.run(|| connect(addr, None, timeout))?
            .map_err(|source| self.socket_error("connect to", addr, source))
    }

    /// Like [`Netns::tcp_connect`] from a socket carrying `SO_MARK` `mark` (ztunnel's sockets
    /// carry [`PROXY_MARK`](mesh_capture::PROXY_MARK), which the capture rules let through).
    pub fn tcp_connect_marked(
        &self,
        addr: SocketAddr,
        mark: u32,
        timeout: Duration,
    ) -> Result<TcpStream, NetnsError> {
        self.run(|| connect(addr, Some(mark), timeout))?
            .map_err(|source| self.socket_error("marked connect to", addr, source))
    }

    /// A TCP echo server on `addr` inside this namespace, served by threads of this process.
    pub fn echo_server(&self, addr: SocketAddr) -> Result<EchoServer, NetnsError> {
        let listener = self.tcp_listen(addr)?;
        let local = listener
            .local_addr()
            .map_err(|source| self.socket_error("listen on", addr, source))?;
        EchoServer::start(listener, local)
            .map_err(|source| self.socket_error("serve", addr, source))
    }

    fn socket_error(
        &self,
        op: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    ) -> NetnsError {
        NetnsError::Socket {
            op,
            addr,
            netns: self.name().to_owned(),
            source,
        }
    }
}

fn connect(addr: SocketAddr, mark: Option<u32>, timeout: Duration) -> std::io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd: OwnedFd = socket::socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Tcp,
    )?;
    if let Some(mark) = mark {
        socket::setsockopt(&fd, sockopt::Mark, &mark)?;
    }
    // Linux bounds a blocking connect(2) by SO_SNDTIMEO (EINPROGRESS when it expires).
    let millis = i64::try_from(timeout.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    socket::setsockopt(&fd, sockopt::SendTimeout, &TimeVal::milliseconds(millis))?;
    match socket::connect(fd.as_raw_fd(), &socket::SockaddrStorage::from(addr)) {
        Ok(()) => {}
        Err(nix::Error::EINPROGRESS) | Err(nix::Error::EAGAIN) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {timeout:?}"),
            ))
        }
        Err(errno) => return Err(errno.into()),
    }
    let stream = TcpStream::from(fd);
    stream.set_write_timeout(None)?;
    Ok(stream)
}

/// The destination a REDIRECTed connection was originally sent to (`SO_ORIGINAL_DST`); for a
/// connection that was not NATed, its own local address.
pub fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddrV4> {
    let raw = socket::getsockopt(stream, sockopt::OriginalDst)?;
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr)),
        u16::from_be(raw.sin_port),
    ))
}

/// A TCP echo server (see [`Netns::echo_server`]); stops and closes every connection on drop.
#[derive(Debug)]
pub struct EchoServer {
    addr: SocketAddr,
    listener: TcpListener,
    stopping: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    peers: Peers,
    connections: Connections,
    thread: Option<JoinHandle<()>>,
}

/// The peer address of every accepted connection, in accept order.
type Peers = Arc<Mutex<Vec<SocketAddr>>>;

impl EchoServer {
    fn start(listener: TcpListener, addr: SocketAddr) -> std::io::Result<Self> {
        let stopping = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let connections = Connections::default();
        let peers = Peers::default();
        let accept_loop = AcceptLoop {
            listener: listener.try_clone()?,
            stopping: stopping.clone(),
            accepted: accepted.clone(),
            peers: peers.clone(),
            connections: connections.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("echo-accept".to_owned())
            .spawn(move || accept_loop.run())?;
        Ok(EchoServer {
            addr,
            listener,
            stopping,
            accepted,
            peers,
            connections,
            thread: Some(thread),
        })
    }

    /// The address it listens on (inside its namespace).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The source address of every connection accepted so far (what the application saw).
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // shutdown(2) on a listening socket wakes a blocked accept(2) with EINVAL.
        let _ = socket::shutdown(self.listener.as_raw_fd(), socket::Shutdown::Both);
        if let Ok(connections) = self.connections.lock() {
            for stream in connections.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Clones of the open connections, so that dropping the server closes them.
type Connections = Arc<Mutex<HashMap<usize, TcpStream>>>;

struct AcceptLoop {
    listener: TcpListener,
    stopping: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    peers: Peers,
    connections: Connections,
}

impl AcceptLoop {
    fn run(self) {
        while !self.stopping.load(Ordering::SeqCst) {
            let stream = match self.listener.accept() {
                Ok((stream, peer)) => {
                    if let Ok(mut peers) = self.peers.lock() {
                        peers.push(peer);
                    }
                    stream
                }
                Err(_) => {
                    // Shut down (the loop ends) or out of resources (retry a little later).
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let id = self.accepted.fetch_add(1, Ordering::SeqCst);
            if let (Ok(clone), Ok(mut connections)) = (stream.try_clone(), self.connections.lock())
            {
                connections.insert(id, clone);
            }
            let connections = self.connections.clone();
            let spawned = std::thread::Builder::new()
                .name("echo-conn".to_owned())
                .spawn(move || {
                    echo(stream);
                    if let Ok(mut connections) = connections.lock() {
                        connections.remove(&id);
                    }
                });
            if let Err(error) = spawned {
                tracing::warn!(%error, "echo server cannot start a connection thread");
            }
        }
    }
}

fn echo(mut stream: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}
