//! HBONE server: TLS (client certificate required) + HTTP/2, one tunnel per `CONNECT`.
//!
//! Per request: non-`CONNECT` → 400, `:authority` not `ip:port` → 400, then the caller's
//! [`Connector`] applies policy and dials the target (refusals → 401 or 503); on success the
//! server answers 200 and copies bytes both ways with half-close propagation.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use mesh_identity::Identity;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use super::copy::{copy_bidirectional, ByteCounters, CopyError, Transferred};
use super::{Empty, H2Settings, HboneError};

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
    #[error("denied by authorization policy: {reason}")]
    Denied { reason: String },
    #[error("cannot connect to {target}: {source}; is the application listening on that port?")]
    ConnectFailed {
        target: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Refusal {
    /// The status sent to the HBONE client: 401 for policy denials, 503 for dial failures.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Denied { .. } => StatusCode::UNAUTHORIZED,
            Refusal::ConnectFailed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Denied { .. } => "denied",
            Refusal::ConnectFailed { .. } => "connect_failed",
        }
    }
}

/// Policy and dial callback of the server. Closures
/// `Fn(InboundRequest) -> impl Future<Output = Result<TcpStream, Refusal>>` implement it.
pub trait Connector: Send + Sync + 'static {
    /// Authorizes the request and dials its target.
    fn connect(&self, request: InboundRequest) -> BoxFuture<'static, Result<TcpStream, Refusal>>;

    /// Called once a tunnel ends, with its byte counts (for metrics and access logs).
    fn finished(
        &self,
        _peer: &Identity,
        _target: SocketAddr,
        _result: &Result<Transferred, CopyError>,
    ) {
    }
}

impl<F, Fut> Connector for F
where
    F: Fn(InboundRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<TcpStream, Refusal>> + Send + 'static,
{
    fn connect(&self, request: InboundRequest) -> BoxFuture<'static, Result<TcpStream, Refusal>> {
        Box::pin(self(request))
    }
}

/// An HBONE server; cheap to share (`Arc`) across accept loops.
pub struct Server {
    acceptor: TlsAcceptor,
    settings: H2Settings,
    connector: Arc<dyn Connector>,
    drain: watch::Sender<bool>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Per-connection state shared by its request handlers.
struct ConnContext {
    connector: Arc<dyn Connector>,
    peer_identity: Identity,
    peer_addr: SocketAddr,
    local_addr: SocketAddr,
}

impl Server {
    /// A server terminating TLS with `tls` (which must require client certificates, e.g.
    /// `mesh_identity::tls::server_config(cert, roots, ClientAuth::RequireSpiffe)`).
    pub fn new(tls: Arc<ServerConfig>, settings: H2Settings, connector: impl Connector) -> Self {
        let (drain, _) = watch::channel(false);
        Server {
            acceptor: TlsAcceptor::from(tls),
            settings,
            connector: Arc::new(connector),
            drain,
        }
    }

    /// Accepts connections until `shutdown` completes, serving each on its own task. On
    /// shutdown, open connections get a GOAWAY and finish their in-flight tunnels.
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
            let server = self.clone();
            let span = tracing::debug_span!("hbone_inbound", peer = %peer_addr);
            tokio::spawn(
                async move {
                    if let Err(e) = server.serve_connection(tcp, peer_addr).await {
                        tracing::debug!(error = %e, reason = e.reason(), "HBONE connection ended with an error");
                    }
                }
                .instrument(span),
            );
        }
        self.drain.send_replace(true);
        tracing::info!("HBONE listener stopped; draining open connections");
        Ok(())
    }

    /// Serves one accepted TCP connection: TLS handshake, peer identity, HTTP/2 until closed.
    pub async fn serve_connection(
        &self,
        tcp: TcpStream,
        peer_addr: SocketAddr,
    ) -> Result<(), HboneError> {
        let local_addr = tcp.local_addr().map_err(|source| HboneError::Tls {
            addr: peer_addr,
            source,
        })?;
        let timeout = self.settings.handshake_timeout;
        let tls = tokio::time::timeout(timeout, self.acceptor.accept(tcp))
            .await
            .map_err(|_| HboneError::HandshakeTimeout {
                addr: peer_addr,
                timeout,
            })?
            .map_err(|source| HboneError::Tls {
                addr: peer_addr,
                source,
            })?;
        let (_, session) = tls.get_ref();
        if session.alpn_protocol() != Some(mesh_identity::tls::ALPN_H2) {
            return Err(HboneError::NoH2 { addr: peer_addr });
        }
        let peer_identity = mesh_identity::tls::peer_identity_of(session.peer_certificates())
            .map_err(|source| HboneError::PeerIdentity {
                addr: peer_addr,
                source,
            })?;
        tracing::debug!(%peer_identity, "HBONE connection established");
        let ctx = Arc::new(ConnContext {
            connector: self.connector.clone(),
            peer_identity,
            peer_addr,
            local_addr,
        });
        self.serve_h2(TokioIo::new(tls), ctx).await
    }

    async fn serve_h2<I>(&self, io: TokioIo<I>, ctx: Arc<ConnContext>) -> Result<(), HboneError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let peer_addr = ctx.peer_addr;
        let service = hyper::service::service_fn(move |req| {
            let ctx = ctx.clone();
            async move { Ok::<_, Infallible>(handle_request(ctx, req).await) }
        });
        let conn = self.h2_builder().serve_connection(io, service);
        tokio::pin!(conn);
        let mut drain = self.drain.subscribe();
        let draining = async move {
            if drain.wait_for(|draining| *draining).await.is_err() {
                // The server is gone without draining: never trigger.
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = draining => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        result.map_err(|source| HboneError::H2Connection {
            addr: peer_addr,
            source,
        })
    }

    fn h2_builder(&self) -> hyper::server::conn::http2::Builder<TokioExecutor> {
        let s = &self.settings;
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(s.stream_window)
            .initial_connection_window_size(s.connection_window)
            .max_frame_size(s.max_frame_size)
            .max_concurrent_streams(s.max_concurrent_streams)
            .max_header_list_size(s.max_header_list_size)
            .keep_alive_interval(s.keepalive_interval)
            .keep_alive_timeout(s.keepalive_timeout);
        builder
    }
}

fn is_transient_accept_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    )
}

fn status(code: StatusCode) -> Response<Empty> {
    let mut response = Response::new(Empty);
    *response.status_mut() = code;
    response
}

/// Handles one HTTP/2 request; spawns the tunnel copy when the answer is 200.
async fn handle_request(ctx: Arc<ConnContext>, mut req: Request<Incoming>) -> Response<Empty> {
    if req.method() != Method::CONNECT {
        tracing::debug!(method = %req.method(), "rejecting non-CONNECT HBONE request");
        return status(StatusCode::BAD_REQUEST);
    }
    let Some(target) = parse_authority(&req) else {
        tracing::debug!(uri = %req.uri(), "rejecting CONNECT whose authority is not ip:port");
        return status(StatusCode::BAD_REQUEST);
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let request = InboundRequest {
        peer_identity: ctx.peer_identity.clone(),
        peer_addr: ctx.peer_addr,
        local_addr: ctx.local_addr,
        target,
        headers: std::mem::take(req.headers_mut()),
    };
    let upstream = match ctx.connector.connect(request).await {
        Ok(upstream) => upstream,
        Err(refusal) => {
            tracing::info!(%target, peer = %ctx.peer_identity, error = %refusal, reason = refusal.reason(), "refused HBONE CONNECT");
            return status(refusal.status());
        }
    };
    let span = tracing::debug_span!("tunnel", %target);
    tokio::spawn(
        async move {
            let result = match on_upgrade.await {
                Ok(upgraded) => {
                    let counters = ByteCounters::default();
                    copy_bidirectional(TokioIo::new(upgraded), upstream, &counters).await
                }
                Err(e) => {
                    tracing::debug!(error = %e, "CONNECT stream closed before the tunnel started");
                    return;
                }
            };
            log_completion(&ctx, target, &result);
            ctx.connector.finished(&ctx.peer_identity, target, &result);
        }
        .instrument(span),
    );
    status(StatusCode::OK)
}

fn log_completion(ctx: &ConnContext, target: SocketAddr, result: &Result<Transferred, CopyError>) {
    match result {
        Ok(t) => tracing::debug!(
            src.identity = %ctx.peer_identity, src.addr = %ctx.peer_addr, dst.hbone_addr = %target,
            bytes_sent = t.sent, bytes_recv = t.received, "tunnel complete"
        ),
        Err(e) => tracing::debug!(
            src.identity = %ctx.peer_identity, src.addr = %ctx.peer_addr, dst.hbone_addr = %target,
            error = %e, reason = e.reason(), "tunnel failed"
        ),
    }
}

/// The target of a CONNECT: its authority must be a literal `ip:port`.
fn parse_authority<B>(req: &Request<B>) -> Option<SocketAddr> {
    req.uri().authority()?.as_str().parse().ok()
}
