//! Where ztunnel's sockets are made. In shared (in-pod) mode every socket a pod's proxy uses
//! -- its listeners and the connections it dials -- must be created inside that pod's network
//! namespace and carry `SO_MARK` 1337 so the pod's redirect rules let them through. A
//! [`SocketFactory`] hides that: [`LocalSockets`] makes sockets in ztunnel's own netns (tests,
//! dedicated mode); the in-pod factory (`inpod`) makes the same sockets inside a pod's netns.
//!
//! Only socket *creation* happens in the namespace; connecting and I/O run on the data-plane
//! runtime, since a socket stays in the namespace it was created in.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::sync::Arc;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::Keepalive;

/// Listen backlog of ztunnel's listeners: the kernel caps it at `net.core.somaxconn` of the
/// listener's network namespace, so this asks for the largest accept queue there, as Istio's
/// ztunnel does. A fixed 1,024 overflowed in a burst of new connections while ztunnel was busy:
/// the kernel then drops handshakes or falls back to SYN cookies.
pub const LISTEN_BACKLOG: i32 = i32::MAX;

/// Makes the sockets of one proxy (ztunnel's own, or one pod's).
pub trait SocketFactory: Send + Sync + std::fmt::Debug + 'static {
    /// A new, unconnected, non-blocking TCP socket for `family_of` (an address of the family
    /// wanted), with the factory's mark and options applied.
    fn new_tcp(&self, family_of: SocketAddr) -> io::Result<Socket>;

    /// A non-blocking TCP listener bound to `addr` (`SO_REUSEADDR`, and `SO_REUSEPORT` when
    /// the factory was told to), listening.
    fn tcp_listener(&self, addr: SocketAddr) -> io::Result<StdTcpListener>;

    /// A non-blocking UDP socket bound to `addr`.
    fn udp_bind(&self, addr: SocketAddr) -> io::Result<StdUdpSocket>;
}

/// Socket options every factory applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketOptions {
    /// `SO_MARK` on every socket (`PACKET_MARK`, 1337 in shared mode).
    pub mark: Option<u32>,
    /// `SO_REUSEPORT` on listeners (`INPOD_PORT_REUSE`).
    pub reuse_port: bool,
    /// TCP keepalive on dialed sockets (`KEEPALIVE_*`).
    pub keepalive: Option<Keepalive>,
    /// `IP_TRANSPARENT` on listeners, so they can accept connections whose destination is not
    /// a local address (socket-assigning capture such as eBPF; upstream's in-pod listeners are
    /// transparent too). Needs CAP_NET_ADMIN.
    pub transparent: bool,
}

impl SocketOptions {
    /// A TCP socket of `addr`'s family with these options.
    pub fn tcp_socket(&self, family_of: SocketAddr) -> io::Result<Socket> {
        // Non-blocking and close-on-exec from socket(2) itself: three fcntl calls fewer per
        // dialed connection.
        let socket = Socket::new(
            Domain::for_address(family_of),
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?;
        socket.set_tcp_nodelay(true)?;
        self.apply_mark(&socket)?;
        if let Some(ka) = self.keepalive.filter(|k| k.enabled) {
            let params = TcpKeepalive::new()
                .with_time(ka.time)
                .with_interval(ka.interval)
                .with_retries(ka.retries);
            socket.set_tcp_keepalive(&params)?;
        }
        Ok(socket)
    }

    /// A bound, listening TCP socket with these options.
    pub fn tcp_listener(&self, addr: SocketAddr) -> io::Result<StdTcpListener> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        // Accepted sockets inherit it: small proxied writes must not wait for delayed ACKs.
        socket.set_tcp_nodelay(true)?;
        if self.reuse_port {
            socket.set_reuse_port(true)?;
        }
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
            if self.transparent {
                socket.set_ip_transparent_v6(true)?;
            }
        } else if self.transparent {
            socket.set_ip_transparent_v4(true)?;
        }
        self.apply_mark(&socket)?;
        socket.bind(&addr.into())?;
        socket.listen(LISTEN_BACKLOG)?;
        Ok(socket.into())
    }

    /// A bound UDP socket with these options.
    pub fn udp_bind(&self, addr: SocketAddr) -> io::Result<StdUdpSocket> {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?;
        if self.reuse_port {
            socket.set_reuse_port(true)?;
        }
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        self.apply_mark(&socket)?;
        socket.bind(&addr.into())?;
        Ok(socket.into())
    }

    fn apply_mark(&self, socket: &Socket) -> io::Result<()> {
        match self.mark {
            Some(mark) => SockRef::from(socket).set_mark(mark),
            None => Ok(()),
        }
    }
}

/// Sockets in ztunnel's own network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalSockets {
    pub options: SocketOptions,
}

impl LocalSockets {
    pub fn new(options: SocketOptions) -> Self {
        LocalSockets { options }
    }
}

impl SocketFactory for LocalSockets {
    fn new_tcp(&self, family_of: SocketAddr) -> io::Result<Socket> {
        self.options.tcp_socket(family_of)
    }

    fn tcp_listener(&self, addr: SocketAddr) -> io::Result<StdTcpListener> {
        self.options.tcp_listener(addr)
    }

    fn udp_bind(&self, addr: SocketAddr) -> io::Result<StdUdpSocket> {
        self.options.udp_bind(addr)
    }
}

/// Dials `addr` with a socket made by `factory`.
pub async fn connect(factory: &dyn SocketFactory, addr: SocketAddr) -> io::Result<TcpStream> {
    let (stream, _) = connect_from(factory, None, false, addr).await?;
    Ok(stream)
}

/// How [`connect_from`] ended up dialing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceUsed {
    /// From the requested source IP.
    Original,
    /// From an address the kernel chose (spoofing was not requested, or not possible).
    Local,
}

/// Dials `addr` from `source` (any port) when given: `IP_TRANSPARENT` lets the socket bind to
/// an address that is not local, so the application sees the client's IP (upstream's
/// `ENABLE_ORIG_SRC`; replies reach the socket through the in-pod capture's connmark rules or
/// eBPF programs). When `required` is false and the kernel refuses the option (no
/// CAP_NET_ADMIN) or the families differ, it dials from a local address instead.
pub async fn connect_from(
    factory: &dyn SocketFactory,
    source: Option<IpAddr>,
    required: bool,
    addr: SocketAddr,
) -> io::Result<(TcpStream, SourceUsed)> {
    let socket = factory.new_tcp(addr)?;
    let mut used = SourceUsed::Local;
    if let Some(src) = source {
        match bind_transparent(&socket, src, addr) {
            Ok(()) => used = SourceUsed::Original,
            Err(e) if required => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                    "cannot dial {addr} from the original source {src} (ENABLE_ORIG_SRC=true): {e}"
                ),
                ))
            }
            Err(e) => {
                tracing::debug!(%src, %addr, error = %e, "dialing from a local address: the original source cannot be used");
            }
        }
    }
    let stream = TcpSocket::from_std_stream(socket.into())
        .connect(addr)
        .await?;
    Ok((stream, used))
}

fn bind_transparent(socket: &Socket, src: IpAddr, dst: SocketAddr) -> io::Result<()> {
    match (src, dst) {
        (IpAddr::V4(_), SocketAddr::V4(_)) => socket.set_ip_transparent_v4(true)?,
        (IpAddr::V6(_), SocketAddr::V6(_)) => socket.set_ip_transparent_v6(true)?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "source and destination are of different IP families",
            ))
        }
    }
    socket.bind(&SocketAddr::new(src, 0).into())
}

/// Shared handle to a factory.
pub type SharedSocketFactory = Arc<dyn SocketFactory>;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_factory_listens_and_dials() {
        let factory = LocalSockets::new(SocketOptions {
            reuse_port: true,
            ..SocketOptions::default()
        });
        let (listener, addr) = loopback_listener(&factory);
        let (dialed, accepted) = tokio::join!(connect(&factory, addr), listener.accept());
        let dialed = dialed.expect("dial");
        let (accepted, _) = accepted.expect("accept");
        assert_eq!(dialed.peer_addr().expect("peer"), addr);
        assert_eq!(
            accepted.peer_addr().expect("peer"),
            dialed.local_addr().expect("local")
        );
        // A second listener may share the port only because of SO_REUSEPORT.
        factory
            .tcp_listener(addr)
            .expect("second listener with SO_REUSEPORT");
    }

    #[tokio::test]
    async fn without_reuse_port_a_second_bind_fails() {
        let factory = LocalSockets::default();
        let (_listener, addr) = loopback_listener(&factory);
        let err = factory.tcp_listener(addr).expect_err("port is taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    /// The accept queue is the network namespace's largest (`ss` shows a listener's queue
    /// limit as its Send-Q).
    #[tokio::test]
    async fn listeners_get_the_largest_accept_queue() {
        let factory = LocalSockets::default();
        let (_listener, addr) = loopback_listener(&factory);
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn").expect("somaxconn");
        let out = std::process::Command::new("ss")
            .args(["-ltnH", &format!("sport = :{}", addr.port())])
            .output()
            .expect("ss (iproute2)");
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let queue = line
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_string();
        assert_eq!(queue, somaxconn.trim(), "ss: {line}");
    }

    fn loopback_listener(factory: &LocalSockets) -> (tokio::net::TcpListener, SocketAddr) {
        let listener = factory
            .tcp_listener("127.0.0.1:0".parse().expect("addr"))
            .expect("listen");
        let addr = listener.local_addr().expect("addr");
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        (listener, addr)
    }

    #[tokio::test]
    async fn connect_from_dials_from_the_original_source() {
        if !mesh_testutil::netns::have_root("connect_from_dials_from_the_original_source") {
            return;
        }
        let factory = LocalSockets::default();
        let (listener, addr) = loopback_listener(&factory);
        let src: IpAddr = "127.0.0.7".parse().expect("ip");
        let (dialed, accepted) = tokio::join!(
            connect_from(&factory, Some(src), true, addr),
            listener.accept()
        );
        let (_stream, used) = dialed.expect("dial from 127.0.0.7");
        assert_eq!(used, SourceUsed::Original);
        assert_eq!(accepted.expect("accept").1.ip(), src);

        // No source asked for: the kernel picks it.
        let (dialed, accepted) =
            tokio::join!(connect_from(&factory, None, false, addr), listener.accept());
        assert_eq!(dialed.expect("dial").1, SourceUsed::Local);
        assert_eq!(
            accepted.expect("accept").1.ip(),
            IpAddr::from([127, 0, 0, 1])
        );
    }

    #[tokio::test]
    async fn connect_from_falls_back_unless_required() {
        let factory = LocalSockets::default();
        let (listener, addr) = loopback_listener(&factory);
        // An IPv6 source cannot dial an IPv4 destination.
        let v6: IpAddr = "fd00::7".parse().expect("ip");
        let (dialed, accepted) = tokio::join!(
            connect_from(&factory, Some(v6), false, addr),
            listener.accept()
        );
        assert_eq!(dialed.expect("fallback dial").1, SourceUsed::Local);
        assert!(accepted.is_ok());
        let err = connect_from(&factory, Some(v6), true, addr)
            .await
            .expect_err("required");
        assert!(
            err.to_string().contains("ENABLE_ORIG_SRC") && err.to_string().contains("fd00::7"),
            "{err}"
        );
    }
}
