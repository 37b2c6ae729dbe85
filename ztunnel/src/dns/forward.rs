//! Forwarding queries ztunnel does not answer to the upstream resolvers of `/etc/resolv.conf`.
//!
//! The client's query is sent unchanged except for its id (a fresh random one, so a spoofed or
//! stale response cannot match); the upstream response must echo that id and the question and
//! is relayed with the client's id restored. UDP first; a truncated UDP response is retried
//! over TCP when the client itself asked over TCP (a UDP client gets TC and retries with us).
//! Sockets come from the pod's [`SocketFactory`], so in-pod forwarding leaves from the pod's
//! netns with the ztunnel mark and is not redirected back to us.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;

use super::message::{set_id, Transport};
use super::DnsError;
use crate::socket::{self, SocketFactory};

/// `/etc/resolv.conf`.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
/// The DNS port.
const DNS_PORT: u16 = 53;
/// glibc uses at most this many `nameserver` lines (`MAXNS`).
const MAX_NAMESERVERS: usize = 3;

/// The upstream resolvers queries are forwarded to, tried in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolvers {
    pub servers: Vec<SocketAddr>,
}

impl Resolvers {
    /// Explicit servers (tests, or a configured upstream).
    pub fn new(servers: Vec<SocketAddr>) -> Resolvers {
        Resolvers { servers }
    }

    /// The `nameserver` lines of a resolv.conf text (at most three, like glibc); without any,
    /// the local resolver `127.0.0.1:53`, as glibc does.
    pub fn from_resolv_conf(text: &str) -> Resolvers {
        let mut servers = Vec::new();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("nameserver") {
                continue;
            }
            let Some(addr) = words.next() else { continue };
            // A link-local IPv6 server may carry a zone (`fe80::1%eth0`); we cannot use it.
            match addr.parse::<IpAddr>() {
                Ok(ip) => servers.push(SocketAddr::new(ip, DNS_PORT)),
                Err(_) => tracing::warn!(
                    nameserver = addr,
                    "ignoring a resolv.conf nameserver that is not a plain IP address"
                ),
            }
        }
        servers.truncate(MAX_NAMESERVERS);
        if servers.is_empty() {
            servers.push(SocketAddr::from((Ipv4Addr::LOCALHOST, DNS_PORT)));
        }
        Resolvers { servers }
    }

    /// The resolvers of ztunnel's `/etc/resolv.conf`, read once per process.
    pub fn system() -> Resolvers {
        static SYSTEM: OnceLock<Resolvers> = OnceLock::new();
        SYSTEM
            .get_or_init(|| match std::fs::read_to_string(RESOLV_CONF) {
                Ok(text) => {
                    let r = Resolvers::from_resolv_conf(&text);
                    tracing::info!(servers = ?r.servers, "DNS proxy upstream resolvers");
                    r
                }
                Err(e) => {
                    tracing::warn!(error = %e, path = RESOLV_CONF, "cannot read resolv.conf; DNS proxy forwards to 127.0.0.1:53");
                    Resolvers::from_resolv_conf("")
                }
            })
            .clone()
    }
}

/// Forwards `request` (the client's bytes, already parsed as `parsed`) to each resolver in
/// turn, each within `timeout`; returns the first valid response with the client's id.
pub async fn forward(
    sockets: &dyn SocketFactory,
    resolvers: &Resolvers,
    timeout: Duration,
    request: &[u8],
    parsed: &Message,
    transport: Transport,
) -> Result<Vec<u8>, DnsError> {
    let mut last = DnsError::NoUpstream;
    for &server in &resolvers.servers {
        let id = rand::random::<u16>();
        let mut query = request.to_vec();
        set_id(&mut query, id);
        let attempt = async {
            let response = udp_exchange(sockets, server, &query, id, parsed).await?;
            if response.truncated && transport == Transport::Tcp {
                return tcp_exchange(sockets, server, &query, id, parsed).await;
            }
            Ok(response.bytes)
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(mut bytes)) => {
                set_id(&mut bytes, parsed.id());
                return Ok(bytes);
            }
            Ok(Err(e)) => {
                tracing::debug!(%server, error = %e, "upstream DNS server failed");
                last = e;
            }
            Err(_) => {
                tracing::debug!(%server, ?timeout, "upstream DNS server timed out");
                last = DnsError::UpstreamTimeout { server, timeout };
            }
        }
    }
    Err(last)
}

struct UdpResponse {
    bytes: Vec<u8>,
    truncated: bool,
}

async fn udp_exchange(
    sockets: &dyn SocketFactory,
    server: SocketAddr,
    query: &[u8],
    id: u16,
    parsed: &Message,
) -> Result<UdpResponse, DnsError> {
    let io_err = |source| DnsError::UpstreamIo { server, source };
    let any: IpAddr = match server {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = sockets
        .udp_bind(SocketAddr::new(any, 0))
        .and_then(|s| {
            s.set_nonblocking(true)?;
            UdpSocket::from_std(s)
        })
        .map_err(io_err)?;
    socket.connect(server).await.map_err(io_err)?;
    socket.send(query).await.map_err(io_err)?;
    let mut buf = vec![0u8; usize::from(u16::MAX)];
    loop {
        let n = socket.recv(&mut buf).await.map_err(io_err)?;
        // Anything that is not the answer to this query is ignored; the timeout bounds us.
        if let Some(msg) = matching(&buf[..n], id, parsed) {
            return Ok(UdpResponse {
                bytes: buf[..n].to_vec(),
                truncated: msg.truncated(),
            });
        }
    }
}

async fn tcp_exchange(
    sockets: &dyn SocketFactory,
    server: SocketAddr,
    query: &[u8],
    id: u16,
    parsed: &Message,
) -> Result<Vec<u8>, DnsError> {
    let io_err = |source| DnsError::UpstreamIo { server, source };
    let mut stream = socket::connect(sockets, server).await.map_err(io_err)?;
    let len = u16::try_from(query.len()).map_err(|_| {
        io_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "query too long",
        ))
    })?;
    let mut framed = Vec::with_capacity(query.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(query);
    stream.write_all(&framed).await.map_err(io_err)?;
    loop {
        let len = stream.read_u16().await.map_err(io_err)?;
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.map_err(io_err)?;
        if matching(&buf, id, parsed).is_some() {
            return Ok(buf);
        }
    }
}

/// `bytes` parsed, if it is a response with `id` to the question of `parsed`.
fn matching(bytes: &[u8], id: u16, parsed: &Message) -> Option<Message> {
    let msg = Message::from_vec(bytes).ok()?;
    let ok = msg.id() == id
        && msg.message_type() == MessageType::Response
        // A server that rejects the query outright (FORMERR, NOTIMP) may omit the question.
        && (msg.queries() == parsed.queries() || msg.queries().is_empty());
    if !ok {
        tracing::debug!(
            id,
            "ignoring an upstream DNS message that does not answer our query"
        );
    }
    ok.then_some(msg)
}
