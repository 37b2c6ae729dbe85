//! HBONE: HTTP/2 `CONNECT` tunnels over mutual TLS 1.3 (ALPN `h2`), the mesh's data-plane
//! transport (docs/compatibility.md, HBONE).
//!
//! - [`server`]: terminates TLS with a caller-supplied rustls `ServerConfig` (client certificate
//!   required), reads the peer's SPIFFE identity, serves HTTP/2 and, per `CONNECT`, asks a
//!   [`server::Connector`] (policy + dial) for an upstream `TcpStream` and a per-tunnel
//!   [`server::TunnelObserver`]; refusals map to 400/401/503. Graceful drain
//!   ([`Server::drain`], [`Server::drained`]); dropping the server aborts its tunnels.
//! - [`client`]: one TLS + HTTP/2 connection that multiplexes many `CONNECT` streams; each
//!   accepted stream is an `AsyncRead + AsyncWrite` [`client::Tunnel`].
//! - [`pool`]: connections keyed by (source identity, destination identities, source IP,
//!   destination address), at most [`H2Settings::max_streams_per_connection`] streams each; the
//!   source IP keeps pods from sharing a connection dialed from one pod's network namespace.
//! - [`read_buffer`]: large socket reads under rustls (it asks for 4 KiB at a time).
//! - [`copy`]: bidirectional copy with half-close propagation and live byte counters.
//! - [`stream`]: a tunnel as h2's stream pair (the `h2` crate directly, no hyper upgrade
//!   layer: DATA frames move as `Bytes` between the socket and h2 without extra copies), and
//!   the PING keepalive.

use std::time::Duration;

use http::StatusCode;

pub mod client;
pub mod copy;
pub mod pool;
pub mod read_buffer;
pub mod server;
pub mod stream;

pub use client::{ConnectRequest, Connection, Tunnel};
pub use copy::{copy_bidirectional, ByteCounters, Transferred};
pub use pool::{Pool, PoolKey};
pub use server::{
    Accepted, Connector, InboundRequest, Refusal, Server, TunnelEnd, TunnelError, TunnelObserver,
};

/// The HBONE port on every mesh pod.
pub const HBONE_PORT: u16 = mesh_capture::HBONE_PORT;
/// Header carrying the original source as `for="ip:port"` (RFC 7239).
pub const FORWARDED_HEADER: &str = "forwarded";
/// Header carrying W3C baggage about the source workload.
pub const BAGGAGE_HEADER: &str = "baggage";
/// Header carrying the W3C trace context.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// HTTP/2 and TLS tunables shared by the server and the client; defaults are Istio's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct H2Settings {
    /// Per-stream flow-control window (`HTTP2_STREAM_WINDOW_SIZE`, 4 MiB).
    pub stream_window: u32,
    /// Per-connection flow-control window (`HTTP2_CONNECTION_WINDOW_SIZE`, 16 MiB).
    pub connection_window: u32,
    /// Largest frame we accept (`HTTP2_FRAME_SIZE`, 1 MiB).
    pub max_frame_size: u32,
    /// Concurrent streams the server accepts per connection (200).
    pub max_concurrent_streams: u32,
    /// Streams a client puts on one pooled connection (`POOL_MAX_STREAMS_PER_CONNECTION`, 100).
    pub max_streams_per_connection: usize,
    /// Largest request/response header block accepted, in bytes (64 KiB, as Istio's server).
    /// A larger request gets 431 and `REFUSED_STREAM`; over 4× this, h2 closes the connection.
    pub max_header_list_size: u32,
    /// Deadline for the TCP connect plus TLS and HTTP/2 handshakes.
    pub handshake_timeout: Duration,
    /// HTTP/2 PING keepalive interval; `None` disables pings.
    pub keepalive_interval: Option<Duration>,
    /// How long to wait for a PING acknowledgement before closing the connection.
    pub keepalive_timeout: Duration,
    /// Pooled connections without streams for this long are closed
    /// (`POOL_UNUSED_RELEASE_TIMEOUT`, 5 min).
    pub pool_unused_release_timeout: Duration,
}

impl Default for H2Settings {
    fn default() -> Self {
        H2Settings {
            stream_window: 4 * 1024 * 1024,
            connection_window: 16 * 1024 * 1024,
            max_frame_size: 1024 * 1024,
            max_concurrent_streams: 200,
            max_streams_per_connection: 100,
            max_header_list_size: 64 * 1024,
            handshake_timeout: Duration::from_secs(10),
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(20),
            pool_unused_release_timeout: Duration::from_secs(300),
        }
    }
}

/// Errors of HBONE servers and clients.
#[derive(Debug, thiserror::Error)]
pub enum HboneError {
    #[error("cannot accept on the HBONE listener: {0}; is the process out of file descriptors?")]
    Accept(#[source] std::io::Error),
    #[error("cannot connect to HBONE peer {addr}: {source}; is a NetworkPolicy blocking port {HBONE_PORT}, or is the peer's ztunnel down?")]
    Dial {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr} failed: {source}; do both sides trust the same mesh root, and does the peer's identity match the expected SANs?")]
    Tls {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TCP connect, TLS and HTTP/2 handshakes with {addr} took longer than {timeout:?}; is the peer overloaded or is traffic being dropped?")]
    HandshakeTimeout {
        addr: std::net::SocketAddr,
        timeout: Duration,
    },
    #[error("peer {addr} presented no usable mesh identity: {source}; HBONE requires a SPIFFE client certificate")]
    PeerIdentity {
        addr: std::net::SocketAddr,
        #[source]
        source: mesh_identity::TlsError,
    },
    #[error("peer {addr} did not negotiate ALPN h2; is it an HBONE (port {HBONE_PORT}) endpoint?")]
    NoH2 { addr: std::net::SocketAddr },
    #[error("HTTP/2 handshake with {addr} failed: {source}")]
    H2Handshake {
        addr: std::net::SocketAddr,
        #[source]
        source: h2::Error,
    },
    #[error("HBONE connection from {addr} closed because the server was shut down (drain deadline reached or proxy stopped)")]
    Aborted { addr: std::net::SocketAddr },
    #[error("HTTP/2 connection with {addr} failed: {source}")]
    H2Connection {
        addr: std::net::SocketAddr,
        #[source]
        source: h2::Error,
    },
    #[error("CONNECT to {authority} failed on the HTTP/2 connection: {source}; the connection may have been closed by the peer")]
    Request {
        authority: String,
        #[source]
        source: h2::Error,
        /// Whether the request had left (it may then have reached the peer).
        sent: bool,
    },
    #[error("the HBONE peer answered CONNECT to {authority} with {status}: {}", status_hint(*.status))]
    Status {
        authority: String,
        status: StatusCode,
    },
    #[error("header {name} has a value that is not a valid HTTP header: {source}")]
    InvalidHeader {
        name: &'static str,
        #[source]
        source: http::header::InvalidHeaderValue,
    },
    #[error("cannot build the CONNECT request for {authority}: {source}")]
    BuildRequest {
        authority: String,
        #[source]
        source: http::Error,
    },
}

fn status_hint(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => {
            "an AuthorizationPolicy at the destination denied the connection"
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            "the destination ztunnel could not reach the target; is the application listening on that port?"
        }
        StatusCode::BAD_REQUEST => {
            "the destination rejected the request as malformed or not for its workload"
        }
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
            "the request headers are larger than the destination accepts (64 KiB)"
        }
        _ => "unexpected HBONE response",
    }
}

impl HboneError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            HboneError::Accept(_) => "accept",
            HboneError::Dial { .. } => "dial",
            HboneError::Tls { .. } => "tls",
            HboneError::HandshakeTimeout { .. } => "handshake_timeout",
            HboneError::PeerIdentity { .. } => "peer_identity",
            HboneError::NoH2 { .. } => "no_h2",
            HboneError::H2Handshake { .. } => "h2_handshake",
            HboneError::Aborted { .. } => "aborted",
            HboneError::H2Connection { .. } => "h2_connection",
            HboneError::Request { .. } => "request",
            HboneError::Status { status, .. } => match *status {
                StatusCode::UNAUTHORIZED => "status_401",
                StatusCode::SERVICE_UNAVAILABLE => "status_503",
                StatusCode::BAD_REQUEST => "status_400",
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "status_431",
                _ => "status_other",
            },
            HboneError::InvalidHeader { .. } => "invalid_header",
            HboneError::BuildRequest { .. } => "build_request",
        }
    }

    /// Whether the peer may have acted on the request, and so delivered its early data to the
    /// target: false for failures before the request left, for a status answer, and for a
    /// stream the peer refused unprocessed (REFUSED_STREAM, or a GOAWAY from the peer that left
    /// the stream out), which HTTP/2 guarantees the peer never acted on.
    pub fn may_have_been_processed(&self) -> bool {
        match self {
            HboneError::Request {
                source, sent: true, ..
            } => {
                let refused = source.reason() == Some(h2::Reason::REFUSED_STREAM);
                let left_out = source.is_go_away() && source.is_remote();
                !(refused || left_out)
            }
            _ => false,
        }
    }

    /// The HTTP status the peer answered with, if the failure was a non-200 response.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            HboneError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
