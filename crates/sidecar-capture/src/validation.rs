//! The `istio-validation` check (`istio-iptables --run-validation`): when cni-node rather than
//! an init container writes a sidecar pod's capture, the pod's first init container proves the
//! rules are in place before the app starts. Running as the proxy's uid, it listens where
//! captured traffic lands (the proxy's outbound and inbound ports on loopback), dials
//! `127.0.0.6:<probe port>` from `127.0.0.1` once a second, and passes when one of its
//! listeners accepts a connection whose original destination is the probe port.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The port the probe dials (nothing listens there: only capture can answer).
pub const PROBE_PORT: u16 = 15002;
/// How long the check may take by default.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The exit code of a failed check (Istio's `ValidationErrorCode`).
pub const EXIT_CODE: u8 = 126;

/// What the check listens on and dials.
#[derive(Clone, Debug)]
pub struct Validation {
    pub proxy_port: u16,
    pub inbound_capture_port: u16,
    pub probe_port: u16,
    pub timeout: Duration,
    /// Probe over `::1` / `::6` (an IPv6-only pod).
    pub ipv6: bool,
}

/// Why the check failed.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("cannot listen on {addr} for the capture check: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("traffic to {probe} was not redirected to {listeners} within {timeout:?} (last attempt: {last}); sidecar capture is not in place")]
    NotCaptured {
        probe: SocketAddr,
        listeners: String,
        timeout: Duration,
        last: String,
    },
}

impl Validation {
    /// Runs the check (blocking, at most `timeout` plus one connect attempt).
    pub fn run(&self) -> Result<(), ValidationError> {
        let (loopback, passthrough) = crate::config::loopback_and_passthrough(self.ipv6);
        let listeners = [self.proxy_port, self.inbound_capture_port]
            .into_iter()
            .map(|port| listen(SocketAddr::new(loopback, port)))
            .collect::<Result<Vec<_>, _>>()?;
        let probe = SocketAddr::new(passthrough, self.probe_port);
        let deadline = Instant::now() + self.timeout;
        loop {
            let last = match dial(SocketAddr::new(loopback, 0), probe) {
                Ok(_stream) => match accepted_original_port(&listeners) {
                    Some(port) if port == self.probe_port => {
                        tracing::info!(%probe, "sidecar capture validated");
                        return Ok(());
                    }
                    Some(port) => format!("redirected, but the original port was {port}"),
                    None => "connected, but not to a capture listener".into(),
                },
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(ValidationError::NotCaptured {
                    probe,
                    listeners: format!(
                        "{} or {}",
                        SocketAddr::new(loopback, self.proxy_port),
                        SocketAddr::new(loopback, self.inbound_capture_port)
                    ),
                    timeout: self.timeout,
                    last,
                });
            }
            std::thread::sleep(
                Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
            );
        }
    }
}

fn listen(addr: SocketAddr) -> Result<TcpListener, ValidationError> {
    let make = || -> io::Result<TcpListener> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(16)?;
        socket.set_nonblocking(true)?;
        Ok(socket.into())
    };
    make().map_err(|source| ValidationError::Listen { addr, source })
}

fn dial(from: SocketAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SockAddr::from(from))?;
    socket.connect_timeout(&to.into(), Duration::from_secs(1))?;
    Ok(socket.into())
}

/// The original destination port of a connection one of `listeners` accepted (waiting up to
/// a second for the accept: the handshake has completed, so it is already queued).
fn accepted_original_port(listeners: &[TcpListener]) -> Option<u16> {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for listener in listeners {
            if let Ok((stream, _)) = listener.accept() {
                return original_port(&stream);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn original_port(stream: &TcpStream) -> Option<u16> {
    use nix::sys::socket::{getsockopt, sockopt};
    match stream.local_addr().ok()? {
        SocketAddr::V4(_) => getsockopt(stream, sockopt::OriginalDst)
            .ok()
            .map(|a| u16::from_be(a.sin_port)),
        SocketAddr::V6(_) => getsockopt(stream, sockopt::Ip6tOriginalDst)
            .ok()
            .map(|a| u16::from_be(a.sin6_port)),
    }
}
