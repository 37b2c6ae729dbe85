//! HBONE client: one TLS + HTTP/2 connection to a peer's port 15008 carrying many `CONNECT`
//! streams. A [`Connection`] is a cheap, cloneable handle; each successful `CONNECT` yields a
//! [`Tunnel`] (`AsyncRead + AsyncWrite`). Shutting a tunnel's write side sends END_STREAM.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::client::SendRequest;
use http::{HeaderValue, Method, Request, StatusCode, Version};
use mesh_grpc::keepalive::ConnectionEnd;
use mesh_identity::Identity;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tracing::Instrument;

use crate::socket::{LocalSockets, SocketFactory};

use super::copy::{ChunkWrite, Duplex};
use super::read_buffer::ReadBuffered;
use super::stream::{keepalive, H2Reader, H2Stream, H2Writer, MAX_SEND_BUFFER, TLS_BUFFER_LIMIT};
use super::{H2Settings, HboneError, BAGGAGE_HEADER, FORWARDED_HEADER, TRACEPARENT_HEADER};

/// One `CONNECT` to send over a [`Connection`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Target `ip:port`, sent as `:authority` (a service VIP when sent to a waypoint).
    pub target: SocketAddr,
    /// Original source of the proxied connection, sent as `forwarded: for="ip:port"`.
    pub source: SocketAddr,
    /// W3C baggage describing the source workload, if any.
    pub baggage: Option<String>,
    /// W3C trace context, if any.
    pub traceparent: Option<String>,
    /// Service hostname the client addressed, sent as `forwarded: ...;host=<hostname>`.
    pub forwarded_host: Option<String>,
    /// Bytes the client had already sent when the request was made, sent as the stream's
    /// first DATA right behind the `CONNECT` instead of after the answer (empty: none). The
    /// peer reads them once it has connected the target, as any body of a `CONNECT`; a
    /// refusal discards them with the stream.
    pub early_data: Bytes,
}

impl ConnectRequest {
    /// A request for `target` on behalf of `source`, with no baggage or trace context.
    pub fn new(target: SocketAddr, source: SocketAddr) -> Self {
        ConnectRequest {
            target,
            source,
            baggage: None,
            traceparent: None,
            forwarded_host: None,
            early_data: Bytes::new(),
        }
    }

    /// The HTTP/2 request: `CONNECT` with `:authority` = target and the HBONE headers.
    pub fn to_http(&self) -> Result<Request<()>, HboneError> {
        let authority = self.target.to_string();
        let mut forwarded = format!("for=\"{}\"", self.source);
        if let Some(host) = &self.forwarded_host {
            forwarded.push_str(";host=");
            forwarded.push_str(host);
        }
        let mut builder = Request::builder()
            .method(Method::CONNECT)
            .version(Version::HTTP_2)
            .uri(authority.as_str())
            .header(
                FORWARDED_HEADER,
                header_value(FORWARDED_HEADER, &forwarded)?,
            );
        if let Some(baggage) = &self.baggage {
            builder = builder.header(BAGGAGE_HEADER, header_value(BAGGAGE_HEADER, baggage)?);
        }
        if let Some(traceparent) = &self.traceparent {
            let value = header_value(TRACEPARENT_HEADER, traceparent)?;
            builder = builder.header(TRACEPARENT_HEADER, value);
        }
        builder
            .body(())
            .map_err(|source| HboneError::BuildRequest { authority, source })
    }
}

fn header_value(name: &'static str, value: &str) -> Result<HeaderValue, HboneError> {
    HeaderValue::from_str(value).map_err(|source| HboneError::InvalidHeader { name, source })
}

/// A TLS + HTTP/2 connection to an HBONE peer; clones share the connection.
#[derive(Clone)]
pub struct Connection {
    sender: SendRequest<Bytes>,
    addr: SocketAddr,
    peer_identity: Identity,
    streams: Arc<StreamCount>,
    /// Set when the connection task ends.
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .field("peer_identity", &self.peer_identity)
            .field("streams", &self.active_streams())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Dials `addr`, runs the TLS handshake with `tls` (which carries the source certificate
    /// and the expected destination identities) and the HTTP/2 handshake, all within
    /// `settings.handshake_timeout`.
    /// The TCP connection is dialed in ztunnel's own network namespace.
    pub async fn connect(
        addr: SocketAddr,
        tls: Arc<ClientConfig>,
        settings: &H2Settings,
    ) -> Result<Self, HboneError> {
        Self::connect_via(&LocalSockets::default(), addr, tls, settings).await
    }

    /// Like [`Connection::connect`], with the TCP socket made by `sockets` (for a pod: inside
    /// its network namespace, carrying the ztunnel mark).
    pub async fn connect_via(
        sockets: &dyn SocketFactory,
        addr: SocketAddr,
        tls: Arc<ClientConfig>,
        settings: &H2Settings,
    ) -> Result<Self, HboneError> {
        let timeout = settings.handshake_timeout;
        tokio::time::timeout(timeout, Self::handshake(sockets, addr, tls, settings))
            .await
            .map_err(|_| HboneError::HandshakeTimeout { addr, timeout })?
    }

    async fn handshake(
        sockets: &dyn SocketFactory,
        addr: SocketAddr,
        tls: Arc<ClientConfig>,
        settings: &H2Settings,
    ) -> Result<Self, HboneError> {
        let tcp = crate::socket::connect(sockets, addr)
            .await
            .map_err(|source| HboneError::Dial { addr, source })?;
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on the HBONE connection");
        }
        let name = ServerName::IpAddress(addr.ip().into());
        let mut stream = TlsConnector::from(tls)
            .connect(name, ReadBuffered::new(tcp))
            .await
            .map_err(|source| HboneError::Tls { addr, source })?;
        stream.get_mut().1.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
        let peer_identity = verified_peer(&stream, addr)?;
        let (sender, mut conn) = h2_builder(settings)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(|source| HboneError::H2Handshake { addr, source })?;
        let ping = keepalive(
            conn.ping_pong(),
            settings.keepalive_interval,
            settings.keepalive_timeout,
        );
        let closed = Arc::new(AtomicBool::new(false));
        let done = closed.clone();
        let span = tracing::debug_span!("hbone_outbound", peer = %addr, %peer_identity);
        tokio::spawn(
            async move {
                let end = mesh_grpc::keepalive::drive(conn, ping).await;
                done.store(true, Ordering::Release);
                match end {
                    ConnectionEnd::PingTimedOut => {
                        tracing::debug!(
                            "no PING acknowledgement in time; closed the HBONE connection"
                        );
                    }
                    ConnectionEnd::Closed(Ok(())) => tracing::debug!("HBONE connection closed"),
                    ConnectionEnd::Closed(Err(e)) => {
                        tracing::debug!(error = %e, "HBONE connection failed")
                    }
                }
            }
            .instrument(span),
        );
        Ok(Connection {
            sender,
            addr,
            peer_identity,
            streams: Arc::new(StreamCount::default()),
            closed,
        })
    }

    /// Sends `request` (and its early data) and, once the peer answers 200, returns the
    /// tunnel.
    pub async fn open(&self, request: &ConnectRequest) -> Result<Tunnel, HboneError> {
        let slot = StreamSlot::acquire(self.streams.clone());
        self.open_reserved(request, slot).await
    }

    /// Sends a prepared `CONNECT` request (see [`ConnectRequest::to_http`]).
    pub async fn send(&self, request: Request<()>) -> Result<Tunnel, HboneError> {
        let slot = StreamSlot::acquire(self.streams.clone());
        self.send_in_slot(request, &Bytes::new(), slot).await
    }

    async fn send_in_slot(
        &self,
        request: Request<()>,
        early_data: &Bytes,
        slot: StreamSlot,
    ) -> Result<Tunnel, HboneError> {
        let authority = request.uri().to_string();
        let request_error = |sent: bool| {
            let authority = authority.clone();
            move |source| HboneError::Request {
                authority,
                source,
                sent,
            }
        };
        let mut sender = self
            .sender
            .clone()
            .ready()
            .await
            .map_err(request_error(false))?;
        let (response, mut send) = sender
            .send_request(request, false)
            .map_err(request_error(false))?;
        if !early_data.is_empty() {
            // Queued behind the HEADERS, so both leave in one write: the peer connects the
            // target and forwards them without waiting for a round trip over this connection.
            send.send_data(early_data.clone(), false)
                .map_err(request_error(true))?;
        }
        let response = response.await.map_err(request_error(true))?;
        if response.status() != StatusCode::OK {
            return Err(HboneError::Status {
                authority,
                status: response.status(),
            });
        }
        Ok(Tunnel {
            stream: H2Stream::new(send, response.into_body()),
            slot,
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The peer's verified SPIFFE identity.
    pub fn peer_identity(&self) -> &Identity {
        &self.peer_identity
    }

    /// Whether the connection can no longer carry new streams.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Streams opened through this handle (and its clones) that are still alive, including
    /// those still waiting for their response.
    pub fn active_streams(&self) -> usize {
        self.streams.count.load(Ordering::Relaxed)
    }

    /// Calls `hook` (on the thread that drops it) whenever the last live stream of this
    /// connection ends, with the connection's stream count (see [`Connection::same_as`]). The
    /// pool uses it to let go of connections it no longer needs, so that they close as soon as
    /// they carry nothing. `hook` must not hold the connection (that would keep it open); only
    /// the first hook set counts.
    pub(crate) fn on_idle(&self, hook: impl Fn(&StreamCount) + Send + Sync + 'static) {
        let _ = self.streams.on_idle.set(Box::new(hook));
    }

    /// Whether `self` and `other` are handles on the same connection.
    pub(crate) fn same_as(&self, other: &StreamCount) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.streams), other)
    }

    /// Reserves a stream slot if fewer than `max` are in use (used by the pool).
    pub(crate) fn try_reserve(&self, max: usize) -> Option<StreamSlot> {
        self.streams
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| StreamSlot(self.streams.clone()))
    }

    /// Like [`Connection::open`] with a slot reserved by [`Connection::try_reserve`].
    pub(crate) async fn open_reserved(
        &self,
        request: &ConnectRequest,
        slot: StreamSlot,
    ) -> Result<Tunnel, HboneError> {
        self.send_in_slot(request.to_http()?, &request.early_data, slot)
            .await
    }
}

fn verified_peer(
    stream: &TlsStream<ReadBuffered<TcpStream>>,
    addr: SocketAddr,
) -> Result<Identity, HboneError> {
    let (_, session) = stream.get_ref();
    if session.alpn_protocol() != Some(mesh_identity::tls::ALPN_H2) {
        return Err(HboneError::NoH2 { addr });
    }
    mesh_identity::tls::peer_identity_of(session.peer_certificates())
        .map_err(|source| HboneError::PeerIdentity { addr, source })
}

fn h2_builder(settings: &H2Settings) -> h2::client::Builder {
    let mut builder = h2::client::Builder::new();
    builder
        .enable_push(false)
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.max_header_list_size)
        .max_send_buffer_size(MAX_SEND_BUFFER);
    builder
}

/// The live streams of a connection, and what to do when the last one ends.
#[derive(Default)]
pub(crate) struct StreamCount {
    count: AtomicUsize,
    on_idle: std::sync::OnceLock<IdleHook>,
}

type IdleHook = Box<dyn Fn(&StreamCount) + Send + Sync>;

impl std::fmt::Debug for StreamCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCount")
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Counts one live stream on a connection until dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot(Arc<StreamCount>);

impl StreamSlot {
    fn acquire(counter: Arc<StreamCount>) -> Self {
        counter.count.fetch_add(1, Ordering::AcqRel);
        StreamSlot(counter)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(hook) = self.0.on_idle.get() {
                hook(&self.0);
            }
        }
    }
}

/// An established HBONE tunnel: bytes written reach the target, `shutdown` half-closes.
/// [`super::copy_bidirectional`] moves its h2 `Bytes` without copying them.
#[derive(Debug)]
pub struct Tunnel {
    stream: H2Stream,
    slot: StreamSlot,
}

/// Sending half of a [`Tunnel`]; holds the tunnel's stream slot on its connection.
#[derive(Debug)]
pub struct TunnelWriter {
    writer: H2Writer,
    _slot: StreamSlot,
}

impl ChunkWrite for TunnelWriter {
    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<()>> {
        self.writer.poll_write_chunk(cx, chunk)
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.writer.finish())
    }
}

impl Duplex for Tunnel {
    type Reader = H2Reader;
    type Writer = TunnelWriter;

    fn into_chunks(self) -> (H2Reader, TunnelWriter) {
        let (reader, writer) = self.stream.into_split();
        let writer = TunnelWriter {
            writer,
            _slot: self.slot,
        };
        (reader, writer)
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
