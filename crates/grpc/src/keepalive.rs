//! Noticing a control-plane connection that died without a word: istiod's node lost power, a
//! network partition, a firewall that dropped the flow. TCP alone would wait for minutes (with
//! data unacknowledged) or forever (with nothing to send, the usual state of an xDS stream).
//!
//! - TCP keepalive on the socket: idle 300 s, then a probe every 75 s, given up after 9.
//! - HTTP/2 PINGs every 30 s while a call is open, the connection closed when one is not
//!   answered within 10 s. No PINGs while no call is open: istiod's gRPC server refuses clients
//!   that ping an idle connection (it answers `GOAWAY` with `ENHANCE_YOUR_CALM`), and allows one
//!   PING per 15 s on a busy one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use h2::{Ping, PingPong};
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// How long a connection with an open call may be quiet before it is pinged.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may go unanswered before the connection is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive: idle time before the first probe, time between probes, probes sent.
pub const TCP_IDLE: Duration = Duration::from_secs(300);
pub const TCP_PROBE_INTERVAL: Duration = Duration::from_secs(75);
pub const TCP_PROBES: u32 = 9;

/// Connects to `host:port` with `TCP_NODELAY` (small xDS ACKs must not wait for Nagle) and TCP
/// keepalive.
pub async fn dial_tcp(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let tcp = TcpStream::connect((host, port)).await?;
    let option = |what: &str, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("connected, but cannot set {what}: {e}"))
    };
    tcp.set_nodelay(true)
        .map_err(|e| option("TCP_NODELAY", e))?;
    tcp_keepalive(&tcp).map_err(|e| option("TCP keepalive", e))?;
    Ok(tcp)
}

/// Turns TCP keepalive on for `tcp` ([`TCP_IDLE`], [`TCP_PROBE_INTERVAL`], [`TCP_PROBES`]).
pub fn tcp_keepalive(tcp: &TcpStream) -> std::io::Result<()> {
    let params = TcpKeepalive::new()
        .with_time(TCP_IDLE)
        .with_interval(TCP_PROBE_INTERVAL)
        .with_retries(TCP_PROBES);
    SockRef::from(tcp).set_tcp_keepalive(&params)
}

/// Why [`pings`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum PingEnd {
    /// A PING went unanswered for the timeout: the connection should be closed.
    TimedOut,
    /// The connection is closing anyway.
    Closed,
}

/// Every `interval`, while `busy()` says the connection carries something, sends a PING and
/// waits up to `timeout` for its acknowledgement. Returns when one is late or the connection
/// closes; never when `interval` is `None` (or h2 gave no `PingPong`).
pub async fn pings(
    ping_pong: Option<PingPong>,
    interval: Option<Duration>,
    timeout: Duration,
    busy: impl Fn() -> bool,
) -> PingEnd {
    let (Some(mut ping_pong), Some(interval)) = (ping_pong, interval) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        if !busy() {
            continue;
        }
        match tokio::time::timeout(timeout, ping_pong.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_)) => return PingEnd::Closed,
            Err(_) => return PingEnd::TimedOut,
        }
    }
}

/// How a connection driven by [`drive`] ended.
#[derive(Debug)]
pub enum ConnectionEnd {
    /// The connection ended by itself, cleanly or with this error.
    Closed(Result<(), h2::Error>),
    /// A PING went unanswered: the connection was dropped, which fails its streams.
    PingTimedOut,
}

/// Drives an HTTP/2 client connection with its `pings` (from [`pings`]) beside it, until the
/// connection ends or a PING goes unanswered.
pub async fn drive<T, B>(
    mut connection: h2::client::Connection<T, B>,
    pings: impl std::future::Future<Output = PingEnd>,
) -> ConnectionEnd
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: bytes::Buf,
{
    tokio::pin!(pings);
    tokio::select! {
        biased;
        ended = &mut connection => ConnectionEnd::Closed(ended),
        end = &mut pings => match end {
            PingEnd::TimedOut => ConnectionEnd::PingTimedOut,
            PingEnd::Closed => ConnectionEnd::Closed(connection.await),
        },
    }
}

/// The calls open on one connection.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenCalls(Arc<AtomicUsize>);

impl OpenCalls {
    /// Counts a call as open until the returned guard is dropped.
    pub(crate) fn enter(&self) -> CallOpen {
        self.0.fetch_add(1, Ordering::Relaxed);
        CallOpen(self.0.clone())
    }

    pub(crate) fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

/// One open call of [`OpenCalls`].
#[derive(Debug)]
pub(crate) struct CallOpen(Arc<AtomicUsize>);

impl Drop for CallOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dialed_sockets_carry_tcp_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tcp = dial_tcp("127.0.0.1", port).await.unwrap();
        let socket = SockRef::from(&tcp);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), TCP_IDLE);
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), TCP_PROBE_INTERVAL);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), TCP_PROBES);
        assert!(tcp.nodelay().unwrap());
    }

    #[test]
    fn open_calls_are_counted_until_their_guard_drops() {
        let calls = OpenCalls::default();
        assert!(!calls.any());
        let first = calls.enter();
        let second = calls.clone().enter();
        assert!(calls.any());
        drop(first);
        assert!(calls.any());
        drop(second);
        assert!(!calls.any());
    }
}
