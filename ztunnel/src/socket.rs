//! Where ztunnel's sockets are made. In shared (in-pod) mode every socket a pod's proxy uses
//! -- its listeners and the connections it dials -- must be created inside that pod's network
//! namespace and carry `SO_MARK` 1337 so the pod's redirect rules let them through. A
//! [`SocketFactory`] hides that: [`LocalSockets`] makes sockets in ztunnel's own netns (tests,
//! dedicated mode); the in-pod factory (`inpod`) makes the same sockets inside a pod's netns.
//!
//! Only socket *creation* happens in the namespace; connecting and I/O run on the data-plane
//! runtime, since a socket stays in the namespace it was created in.

use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::sync::Arc;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::Keepalive;

/// Listen backlog of ztunnel's listeners (upstream uses the kernel maximum).
pub const LISTEN_BACKLOG: i32 = 1024;

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
        let socket = Socket::new(
            Domain::for_address(family_of),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_nonblocking(true)?;
        socket.set_cloexec(true)?;
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
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_nonblocking(true)?;
        socket.set_cloexec(true)?;
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
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_nonblocking(true)?;
        socket.set_cloexec(true)?;
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
    let socket = factory.new_tcp(addr)?;
    TcpSocket::from_std_stream(socket.into())
        .connect(addr)
        .await
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
        let listener = factory
            .tcp_listener("127.0.0.1:0".parse().expect("addr"))
            .expect("listen");
        let addr = listener.local_addr().expect("addr");
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
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
        let listener = factory
            .tcp_listener("127.0.0.1:0".parse().expect("addr"))
            .expect("listen");
        let addr = listener.local_addr().expect("addr");
        let err = factory.tcp_listener(addr).expect_err("port is taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }
}
