//! Where a redirected connection was going: the kernel's original destination
//! (`SO_ORIGINAL_DST`, `IP6T_SO_ORIGINAL_DST`), behind a seam so that in-process tests, where
//! nothing is redirected, can say it themselves.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Mutex, PoisonError};

use nix::sys::socket::{getsockopt, sockopt};
use tokio::net::TcpStream;

/// Finds the original destination of an accepted, redirected connection.
pub trait OriginalDst: Send + Sync + std::fmt::Debug + 'static {
    fn original_dst(&self, stream: &TcpStream) -> io::Result<SocketAddr>;
}

/// The kernel's answer: the NAT `REDIRECT` rules of the pod (nftables capture) record it in
/// conntrack (`SO_ORIGINAL_DST`); with socket-assigning capture (eBPF, TPROXY) there is no NAT
/// and the accepted socket's local address is the original destination.
#[derive(Clone, Copy, Debug, Default)]
pub struct SoOriginalDst;

impl OriginalDst for SoOriginalDst {
    fn original_dst(&self, stream: &TcpStream) -> io::Result<SocketAddr> {
        let local = stream.local_addr()?;
        let dst = match nat_original_dst(stream, local) {
            Ok(dst) => dst,
            // No conntrack entry: nothing was NATed, the socket was assigned.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => local,
            Err(e) => return Err(e),
        };
        refuse_loop(dst, local)?;
        Ok(dst)
    }
}

/// A connection whose "original" destination is ztunnel's own capture listener reached it
/// directly, not through capture: proxying it would connect to itself.
fn refuse_loop(dst: SocketAddr, local: SocketAddr) -> io::Result<()> {
    let ports = crate::config::Ports::default();
    let own = [ports.outbound, ports.inbound_plaintext];
    if dst == local && own.contains(&local.port()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("connection addressed to ztunnel's own listener {local}; refusing to proxy it to itself"),
        ));
    }
    Ok(())
}

fn nat_original_dst(stream: &TcpStream, local: SocketAddr) -> io::Result<SocketAddr> {
    if local.is_ipv4() {
        let sa = getsockopt(stream, sockopt::OriginalDst).map_err(io::Error::from)?;
        let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Ok(SocketAddr::V4(SocketAddrV4::new(
            ip,
            u16::from_be(sa.sin_port),
        )))
    } else {
        let sa = getsockopt(stream, sockopt::Ip6tOriginalDst).map_err(io::Error::from)?;
        let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
        Ok(SocketAddr::V6(SocketAddrV6::new(
            ip,
            u16::from_be(sa.sin6_port),
            0,
            0,
        )))
    }
}

/// A table from the client's address (the accepted connection's peer) to the destination it
/// asked for, filled by tests before they connect. Unknown clients get an error.
#[derive(Debug, Default)]
pub struct StaticOriginalDst {
    by_client: Mutex<HashMap<SocketAddr, SocketAddr>>,
}

impl StaticOriginalDst {
    /// Declares that the connection from `client` was going to `dst`.
    pub fn insert(&self, client: SocketAddr, dst: SocketAddr) {
        self.by_client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(client, dst);
    }
}

impl OriginalDst for StaticOriginalDst {
    fn original_dst(&self, stream: &TcpStream) -> io::Result<SocketAddr> {
        let peer = stream.peer_addr()?;
        self.by_client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&peer)
            .copied()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no original destination recorded for client {peer}"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unredirected_connection_reports_its_local_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let addr = listener.local_addr().expect("addr");
        let (_client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (accepted, _) = accepted.expect("accept");
        // No NAT happened: the original destination is where the socket is.
        assert_eq!(SoOriginalDst.original_dst(&accepted).expect("dst"), addr);
    }

    #[test]
    fn own_listener_is_refused() {
        let own: SocketAddr = "10.0.0.1:15001".parse().expect("addr");
        let err = refuse_loop(own, own).expect_err("loop");
        assert!(err.to_string().contains("own listener"), "{err}");
        let other: SocketAddr = "10.0.0.2:80".parse().expect("addr");
        refuse_loop(other, own).expect("redirected connection is fine");
        let app: SocketAddr = "10.0.0.1:8080".parse().expect("addr");
        refuse_loop(app, app).expect("socket-assigned app port is fine");
    }
}
