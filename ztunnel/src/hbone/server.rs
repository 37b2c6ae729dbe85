//! HBONE server: TLS (client certificate required) + HTTP/2, one tunnel per `CONNECT`.
//!
//! Per request: non-`CONNECT` → 400, `:authority` missing or not `ip:port` → 400, then the
//! caller's [`Connector`] applies policy and dials the target (refusals → 400, 401 or 503); on
//! success the server answers 200 and copies bytes both ways with half-close propagation. Every
//! accepted tunnel reports exactly one [`TunnelEnd`] to the [`TunnelObserver`] the connector
//! returned with its upstream.
//!
//! h2 itself refuses what never reaches the connector: a header block over
//! [`H2Settings::max_header_list_size`](super::H2Settings) gets 431 and `REFUSED_STREAM`
//! (more than 4× the limit: GOAWAY), streams beyond `max_concurrent_streams` get
//! `REFUSED_STREAM`, pseudo-header errors get `PROTOCOL_ERROR`.
//!
//! Lifecycle: [`Server::drain`] sends GOAWAY to open connections (and to any accepted later)
//! and lets their tunnels finish; [`Server::drained`] waits for that. Every task the server
//! starts (per-stream handlers and tunnel copies) is tracked: dropping the `Server` aborts them,
//! their observers then report [`TunnelError::Aborted`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use mesh_identity::Identity;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use super::copy::{copy_bidirectional, ByteCounters, CopyError, Transferred};
use super::read_buffer::ReadBuffered;
use super::stream::{keepalive, H2Stream, PingEnd, MAX_SEND_BUFFER, TLS_BUFFER_LIMIT};
use super::{H2Settings, HboneError};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the server knows about one `CONNECT` when it asks the [`Connector`].
#[derive(Clone, Debug)]
pub struct InboundRequest {
    /// SPIFFE identity from the peer's client certificate.
    pub peer_identity: Identity,
    /// TCP address of the HBONE peer (the source ztunnel or waypoint).
    pub peer_addr: SocketAddr,
    /// Local address the HBONE connection arrived on (the original destination `ip:15008`).
    pub local_addr: SocketAddr,
    /// Target from `:authority`.
    pub target: SocketAddr,
    /// Request headers (`forwarded`, `baggage`, `traceparent`, ...).
    pub headers: HeaderMap,
}

/// Why a [`Connector`] refused a `CONNECT`.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("bad request: {reason}")]
    BadRequest { reason: String },
    #[error("denied by authorization policy: {reason}")]
    Denied { reason: String },
    #[error("cannot serve the request now: {reason}")]
    Unavailable { reason: String },
    #[error("cannot connect to {target}: {source}; is the application listening on that port?")]
    ConnectFailed {
        target: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Refusal {
    /// The status sent to the HBONE client: 400 for requests this server cannot serve (e.g. a
    /// target that is not its workload), 401 for policy denials, 503 for dial failures and
    /// missing local state.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Refusal::Denied { .. } => StatusCode::UNAUTHORIZED,
            Refusal::Unavailable { .. } | Refusal::ConnectFailed { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::BadRequest { .. } => "bad_request",
            Refusal::Denied { .. } => "denied",
            Refusal::Unavailable { .. } => "unavailable",
            Refusal::ConnectFailed { .. } => "connect_failed",
        }
    }
}

/// Why an accepted tunnel did not end with both directions closed cleanly.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("the CONNECT stream ended before the tunnel started: {0}; the client reset the stream or lost its connection right after the 200")]
    NotStarted(#[source] h2::Error),
    #[error(transparent)]
    Copy(#[from] CopyError),
    #[error("the tunnel was closed because its HBONE server was shut down (drain deadline reached or proxy stopped)")]
    Aborted,
}

impl TunnelError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            TunnelError::NotStarted(_) => "not_started",
            TunnelError::Copy(e) => e.reason(),
            TunnelError::Aborted => "aborted",
        }
    }
}

/// How one accepted tunnel ended.
#[derive(Debug)]
pub struct TunnelEnd {
    /// Bytes copied each way (up to the failure, if any).
    pub transferred: Transferred,
    /// `Ok` once both directions reached EOF.
    pub result: Result<(), TunnelError>,
}

/// Per-tunnel context returned by a [`Connector`] with the upstream: told once how the
/// tunnel ended (copy totals, upgrade failure, or abort). Closures `FnOnce(TunnelEnd)`
/// implement it.
pub trait TunnelObserver: Send + 'static {
    /// Called exactly once per accepted tunnel.
    fn finished(self: Box<Self>, end: TunnelEnd);
}

impl<F> TunnelObserver for F
where
    F: FnOnce(TunnelEnd) + Send + 'static,
{
    fn finished(self: Box<Self>, end: TunnelEnd) {
        (*self)(end)
    }
}

/// What a [`Connector`] returns for an allowed `CONNECT`: the dialed upstream and the
/// observer of the tunnel.
pub struct Accepted {
    pub upstream: TcpStream,
    pub observer: Box<dyn TunnelObserver>,
}

impl Accepted {
    pub fn new(upstream: TcpStream, observer: impl TunnelObserver) -> Self {
        Accepted {
            upstream,
            observer: Box::new(observer),
        }
    }
}

impl std::fmt::Debug for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepted")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

/// An upstream whose tunnel nobody observes.
impl From<TcpStream> for Accepted {
    fn from(upstream: TcpStream) -> Self {
        Accepted::new(upstream, |_: TunnelEnd| {})
    }
}

/// Policy and dial callback of the server. Closures
/// `Fn(InboundRequest) -> impl Future<Output = Result<T, Refusal>>` implement it, for `T` an
/// [`Accepted`] or a plain `TcpStream` (unobserved).
pub trait Connector: Send + Sync + 'static {
    /// Authorizes the request and dials its target.
    fn connect(&self, request: InboundRequest) -> BoxFuture<'static, Result<Accepted, Refusal>>;
}

impl<F, Fut, T> Connector for F
where
    F: Fn(InboundRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Refusal>> + Send + 'static,
    T: Into<Accepted>,
{
    fn connect(&self, request: InboundRequest) -> BoxFuture<'static, Result<Accepted, Refusal>> {
        let fut = self(request);
        Box::pin(async move { fut.await.map(Into::into) })
    }
}

/// An HBONE server; cheap to share (`Arc`) across accept loops. It owns every task it starts:
/// dropping it closes its connections and tunnels at once (use [`Server::drain`] first for a
/// graceful stop).
pub struct Server {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("settings", &self.inner.settings)
            .field("open", &*self.inner.tracker.counts.borrow())
            .finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.inner.tracker.abort.send_replace(true);
    }
}

/// What the server's tasks share; outlives the [`Server`] only while they wind down.
struct Inner {
    acceptor: TlsAcceptor,
    settings: H2Settings,
    connector: Arc<dyn Connector>,
    tracker: Arc<Tracker>,
}

/// Per-connection state shared by its request handlers.
struct ConnContext {
    connector: Arc<dyn Connector>,
    tracker: Arc<Tracker>,
    peer_identity: Identity,
    peer_addr: SocketAddr,
    local_addr: SocketAddr,
}

impl Server {
    /// A server terminating TLS with `tls` (which must require client certificates, e.g.
    /// `mesh_identity::tls::server_config(cert, roots, ClientAuth::RequireSpiffe)`).
    pub fn new(tls: Arc<ServerConfig>, settings: H2Settings, connector: impl Connector) -> Self {
        Server {
            inner: Arc::new(Inner {
                acceptor: TlsAcceptor::from(tls),
                settings,
                connector: Arc::new(connector),
                tracker: Arc::new(Tracker::new()),
            }),
        }
    }

    /// Accepts connections until `shutdown` completes, serving each on its own tracked task.
    /// On shutdown the listener is closed, open connections get a GOAWAY, and `run` returns
    /// once their in-flight tunnels have finished ([`Server::drained`]). Aborting `run` drops
    /// this handle; if it was the last, every connection and tunnel is closed.
    pub async fn run(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), HboneError> {
        tokio::pin!(shutdown);
        loop {
            let (tcp, peer_addr) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) if is_transient_accept_error(&e) => {
                        tracing::warn!(error = %e, "transient accept error on the HBONE listener");
                        continue;
                    }
                    Err(e) => return Err(HboneError::Accept(e)),
                },
            };
            let inner = self.inner.clone();
            let span = tracing::debug_span!("hbone_inbound", peer = %peer_addr);
            let serve = async move {
                if let Err(e) = inner.serve_connection(tcp, peer_addr).await {
                    log_connection_error(&e);
                }
            };
            self.inner.tracker.spawn(Kind::Task, serve.instrument(span));
        }
        drop(listener);
        tracing::info!("HBONE listener stopped; draining open connections");
        self.drain();
        self.drained().await;
        Ok(())
    }

    /// Serves one accepted TCP connection: TLS handshake, peer identity, HTTP/2 until closed
    /// (or until this server is dropped). Refused handshakes are logged at `info`.
    pub async fn serve_connection(
        &self,
        tcp: TcpStream,
        peer_addr: SocketAddr,
    ) -> Result<(), HboneError> {
        self.inner.serve_connection(tcp, peer_addr).await
    }

    /// Serves HTTP/2 on `io`, a stream whose peer is already authenticated as
    /// `peer_identity` (what the TLS handshake of [`Server::serve_connection`] yields), until
    /// the peer closes it. The request-head fuzzer drives `CONNECT`s through this.
    pub async fn serve_authenticated<I>(
        &self,
        io: I,
        peer_identity: Identity,
        peer_addr: SocketAddr,
        local_addr: SocketAddr,
    ) -> Result<(), HboneError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let inner = &self.inner;
        let ctx = ConnContext {
            connector: inner.connector.clone(),
            tracker: inner.tracker.clone(),
            peer_identity,
            peer_addr,
            local_addr,
        };
        let _open = Active::new(&inner.tracker, Kind::Connection);
        inner.serve_h2(io, Arc::new(ctx)).await
    }

    /// Starts a graceful drain: every open connection, and any served from now on, gets a
    /// GOAWAY; requests already received and their tunnels run to completion. Idempotent.
    pub fn drain(&self) {
        if !self.inner.tracker.drain.send_replace(true) {
            tracing::debug!(open = ?*self.inner.tracker.counts.borrow(), "HBONE server draining");
        }
    }

    /// Completes once [`Server::drain`] has been called and no connection, request or
    /// tunnel of this server is open any more.
    pub async fn drained(&self) {
        let tracker = &self.inner.tracker;
        // The senders live in `tracker`, which `self` keeps alive: these never fail.
        let _ = tracker.drain.subscribe().wait_for(|d| *d).await;
        let _ = tracker.counts.subscribe().wait_for(Counts::is_idle).await;
    }

    /// HTTP/2 connections being served (including those still in the TLS handshake).
    pub fn open_connections(&self) -> usize {
        self.inner.tracker.counts.borrow().connections
    }

    /// Tunnels (accepted `CONNECT`s) whose copy has not finished.
    pub fn open_tunnels(&self) -> usize {
        self.inner.tracker.counts.borrow().tunnels
    }

    /// Whether nothing is open: no connection, request or tunnel.
    pub fn is_idle(&self) -> bool {
        self.inner.tracker.counts.borrow().is_idle()
    }
}

impl Inner {
    async fn serve_connection(
        &self,
        tcp: TcpStream,
        peer_addr: SocketAddr,
    ) -> Result<(), HboneError> {
        let _open = Active::new(&self.tracker, Kind::Connection);
        let mut abort = self.tracker.abort.subscribe();
        tokio::select! {
            biased;
            result = self.handshake_and_serve(tcp, peer_addr) => result,
            _ = abort.wait_for(|a| *a) => Err(HboneError::Aborted { addr: peer_addr }),
        }
    }

    async fn handshake_and_serve(
        &self,
        tcp: TcpStream,
        peer_addr: SocketAddr,
    ) -> Result<(), HboneError> {
        let (tls, ctx) = match self.handshake(tcp, peer_addr).await {
            Ok(ok) => ok,
            Err(e) => {
                tracing::info!(peer = %peer_addr, error = %e, reason = e.reason(), "refused HBONE connection");
                return Err(e);
            }
        };
        tracing::debug!(peer_identity = %ctx.peer_identity, "HBONE connection established");
        self.serve_h2(tls, Arc::new(ctx)).await
    }

    /// TLS handshake within the handshake timeout, ALPN `h2`, and the peer's SPIFFE id.
    async fn handshake(
        &self,
        tcp: TcpStream,
        peer_addr: SocketAddr,
    ) -> Result<
        (
            tokio_rustls::server::TlsStream<ReadBuffered<TcpStream>>,
            ConnContext,
        ),
        HboneError,
    > {
        let local_addr = tcp.local_addr().map_err(|source| HboneError::Tls {
            addr: peer_addr,
            source,
        })?;
        let timeout = self.settings.handshake_timeout;
        let mut tls = tokio::time::timeout(timeout, self.acceptor.accept(ReadBuffered::new(tcp)))
            .await
            .map_err(|_| HboneError::HandshakeTimeout {
                addr: peer_addr,
                timeout,
            })?
            .map_err(|source| HboneError::Tls {
                addr: peer_addr,
                source: clarify_tls_error(source),
            })?;
        tls.get_mut().1.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
        let (_, session) = tls.get_ref();
        if session.alpn_protocol() != Some(mesh_identity::tls::ALPN_H2) {
            return Err(HboneError::NoH2 { addr: peer_addr });
        }
        let peer_identity = mesh_identity::tls::peer_identity_of(session.peer_certificates())
            .map_err(|source| HboneError::PeerIdentity {
                addr: peer_addr,
                source,
            })?;
        let ctx = ConnContext {
            connector: self.connector.clone(),
            tracker: self.tracker.clone(),
            peer_identity,
            peer_addr,
            local_addr,
        };
        Ok((tls, ctx))
    }

    async fn serve_h2<I>(&self, io: I, ctx: Arc<ConnContext>) -> Result<(), HboneError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let peer_addr = ctx.peer_addr;
        let h2_error = |source| HboneError::H2Connection {
            addr: peer_addr,
            source,
        };
        let mut conn = self
            .h2_builder()
            .handshake::<_, Bytes>(io)
            .await
            .map_err(h2_error)?;
        let s = &self.settings;
        let ping = keepalive(conn.ping_pong(), s.keepalive_interval, s.keepalive_timeout);
        tokio::pin!(ping);
        let mut drain = self.tracker.drain.subscribe();
        let (mut draining, mut pinging) = (false, true);
        loop {
            tokio::select! {
                accepted = conn.accept() => match accepted {
                    Some(Ok((req, respond))) => {
                        let ctx = ctx.clone();
                        self.tracker.spawn(Kind::Task, handle_request(ctx, req, respond));
                    }
                    Some(Err(e)) => return Err(h2_error(e)),
                    None => return Ok(()),
                },
                // The sender lives in the tracker this connection holds: never an error.
                _ = drain.wait_for(|d| *d), if !draining => {
                    tracing::debug!("sending GOAWAY: the HBONE server is draining");
                    draining = true;
                    conn.graceful_shutdown();
                }
                end = &mut ping, if pinging => match end {
                    PingEnd::TimedOut => {
                        tracing::debug!("no PING acknowledgement in time; closing the HBONE connection");
                        return Ok(());
                    }
                    PingEnd::Closed => pinging = false,
                },
            }
        }
    }

    fn h2_builder(&self) -> h2::server::Builder {
        let s = &self.settings;
        let mut builder = h2::server::Builder::new();
        builder
            .initial_window_size(s.stream_window)
            .initial_connection_window_size(s.connection_window)
            .max_frame_size(s.max_frame_size)
            .max_concurrent_streams(s.max_concurrent_streams)
            .max_header_list_size(s.max_header_list_size)
            .max_send_buffer_size(MAX_SEND_BUFFER);
        builder
    }
}

/// rustls shows a verifier's own error (e.g. "no SPIFFE id") with `Debug`; rewrap it so the
/// log line carries its message.
fn clarify_tls_error(e: std::io::Error) -> std::io::Error {
    use rustls::{CertificateError, Error as RustlsError};
    let detail = match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<RustlsError>())
    {
        Some(RustlsError::InvalidCertificate(CertificateError::Other(other))) => {
            format!("invalid peer certificate: {}", other.0)
        }
        _ => return e,
    };
    std::io::Error::new(e.kind(), detail)
}

fn log_connection_error(e: &HboneError) {
    tracing::debug!(error = %e, reason = e.reason(), "HBONE connection ended with an error");
}

fn is_transient_accept_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    )
}

fn status(code: StatusCode) -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = code;
    response
}

/// Answers `code` with END_STREAM (a refusal).
fn refuse(respond: &mut SendResponse<Bytes>, code: StatusCode) {
    if let Err(e) = respond.send_response(status(code), true) {
        tracing::debug!(error = %e, "cannot send the HBONE refusal; the stream is gone");
    }
}

/// Handles one HTTP/2 request; on 200 starts the tunnel copy on its own task.
async fn handle_request(
    ctx: Arc<ConnContext>,
    mut req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    if req.method() != Method::CONNECT {
        tracing::debug!(method = %req.method(), "rejecting non-CONNECT HBONE request");
        return refuse(&mut respond, StatusCode::BAD_REQUEST);
    }
    let Some(target) = parse_authority(&req) else {
        tracing::debug!(uri = %req.uri(), "rejecting CONNECT whose authority is not ip:port");
        return refuse(&mut respond, StatusCode::BAD_REQUEST);
    };
    let request = InboundRequest {
        peer_identity: ctx.peer_identity.clone(),
        peer_addr: ctx.peer_addr,
        local_addr: ctx.local_addr,
        target,
        headers: std::mem::take(req.headers_mut()),
    };
    let Accepted { upstream, observer } = match ctx.connector.connect(request).await {
        Ok(accepted) => accepted,
        Err(refusal) => {
            tracing::info!(dst.addr = %target, peer = %ctx.peer_identity, error = %refusal, reason = refusal.reason(), "refused HBONE CONNECT");
            return refuse(&mut respond, refusal.status());
        }
    };
    // From here on the observer is told exactly once, even if the task below is aborted.
    let completion = Completion::new(observer);
    let started = respond
        .send_response(status(StatusCode::OK), false)
        .map(|send| H2Stream::new(send, req.into_body()));
    let span = tracing::debug_span!("tunnel", dst.addr = %target);
    let tracker = ctx.tracker.clone();
    let spawner = tracker.clone();
    let tunnel = async move {
        let result = match started {
            Ok(stream) => copy_bidirectional(stream, upstream, &completion.counters)
                .await
                .map(drop)
                .map_err(TunnelError::Copy),
            Err(e) => Err(TunnelError::NotStarted(e)),
        };
        // Closing the connection first may fail the copy just before the abort reaches us.
        let result = match result {
            Err(_) if tracker.is_aborted() => Err(TunnelError::Aborted),
            other => other,
        };
        log_completion(&ctx, target, &completion.counters, &result);
        completion.complete(result);
    };
    spawner.spawn(Kind::Tunnel, tunnel.instrument(span));
}

fn log_completion(
    ctx: &ConnContext,
    target: SocketAddr,
    counters: &ByteCounters,
    result: &Result<(), TunnelError>,
) {
    let (sent, received) = (counters.sent(), counters.received());
    match result {
        Ok(()) => tracing::debug!(
            src.identity = %ctx.peer_identity, src.addr = %ctx.peer_addr, dst.hbone_addr = %target,
            bytes_sent = sent, bytes_recv = received, "tunnel complete"
        ),
        Err(e) => tracing::debug!(
            src.identity = %ctx.peer_identity, src.addr = %ctx.peer_addr, dst.hbone_addr = %target,
            bytes_sent = sent, bytes_recv = received, error = %e, reason = e.reason(), "tunnel failed"
        ),
    }
}

/// The target of a CONNECT: its authority must be a literal `ip:port`.
fn parse_authority<B>(req: &Request<B>) -> Option<SocketAddr> {
    req.uri().authority()?.as_str().parse().ok()
}

/// Delivers a tunnel's [`TunnelEnd`] once: explicitly, or as [`TunnelError::Aborted`] when
/// dropped first (its task was aborted).
struct Completion {
    observer: Option<Box<dyn TunnelObserver>>,
    counters: ByteCounters,
}

impl Completion {
    fn new(observer: Box<dyn TunnelObserver>) -> Self {
        Completion {
            observer: Some(observer),
            counters: ByteCounters::default(),
        }
    }

    fn complete(mut self, result: Result<(), TunnelError>) {
        self.finish(result);
    }

    fn finish(&mut self, result: Result<(), TunnelError>) {
        if let Some(observer) = self.observer.take() {
            let transferred = Transferred {
                sent: self.counters.sent(),
                received: self.counters.received(),
            };
            observer.finished(TunnelEnd {
                transferred,
                result,
            });
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.finish(Err(TunnelError::Aborted));
    }
}

/// What a tracked task is, for [`Counts`].
#[derive(Clone, Copy, Debug)]
enum Kind {
    Connection,
    Tunnel,
    /// Accept-loop connection tasks and per-stream handlers.
    Task,
}

/// Open things of one server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    connections: usize,
    tunnels: usize,
    tasks: usize,
}

impl Counts {
    fn is_idle(&self) -> bool {
        *self == Counts::default()
    }

    fn slot(&mut self, kind: Kind) -> &mut usize {
        match kind {
            Kind::Connection => &mut self.connections,
            Kind::Tunnel => &mut self.tunnels,
            Kind::Task => &mut self.tasks,
        }
    }
}

/// Drain and abort signals of one server, and what is open.
struct Tracker {
    counts: watch::Sender<Counts>,
    drain: watch::Sender<bool>,
    /// Set when the [`Server`] is dropped: every tracked task stops.
    abort: watch::Sender<bool>,
}

impl Tracker {
    fn new() -> Self {
        Tracker {
            counts: watch::Sender::new(Counts::default()),
            drain: watch::Sender::new(false),
            abort: watch::Sender::new(false),
        }
    }

    fn is_aborted(&self) -> bool {
        *self.abort.borrow()
    }

    /// Spawns `fut`, counted as `kind` while it runs, dropped when the server is.
    fn spawn<F>(self: &Arc<Self>, kind: Kind, fut: F)
    where
        F: Future + Send + 'static,
    {
        let open = Active::new(self, kind);
        let mut abort = self.abort.subscribe();
        tokio::spawn(async move {
            let _open = open;
            tokio::select! {
                biased;
                _ = fut => {}
                _ = abort.wait_for(|a| *a) => {}
            }
        });
    }
}

/// Counts one open thing of a [`Tracker`] while alive.
struct Active {
    tracker: Arc<Tracker>,
    kind: Kind,
}

impl Active {
    fn new(tracker: &Arc<Tracker>, kind: Kind) -> Self {
        tracker.counts.send_modify(|c| *c.slot(kind) += 1);
        Active {
            tracker: tracker.clone(),
            kind,
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let kind = self.kind;
        self.tracker
            .counts
            .send_modify(|c| *c.slot(kind) = c.slot(kind).saturating_sub(1));
    }
}
