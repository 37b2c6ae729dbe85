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

/// The kernel's answer, recorded by the NAT `REDIRECT` rules of the pod.
#[derive(Clone, Copy, Debug, Default)]
pub struct SoOriginalDst;

impl OriginalDst for SoOriginalDst {
    fn original_dst(&self, stream: &TcpStream) -> io::Result<SocketAddr> {
        let local = stream.local_addr()?;
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
