//! Outbound (15001): connections a pod makes, redirected to its proxy. The original
//! destination decides the route ([`super::route`]); the connection leaves from the pod's
//! network namespace, over HBONE (pooled, with the source workload's certificate) or as plain
//! TCP.

use std::net::SocketAddr;
use std::sync::Arc;

use mesh_identity::Identity;
use tokio::net::TcpStream;

use super::headers::baggage;
use super::inputs::PodCtx;
use super::route::{workload_identity, Route, Router, Upstream};
use super::{PodInfo, ProxyError};
use crate::hbone::{copy_bidirectional, ByteCounters, ConnectRequest, PoolKey, Tunnel};
use crate::metrics::{
    ConnectionInfo, ConnectionRecord, Direction, Outcome, Peer, ResponseFlags, SecurityPolicy,
};
use crate::state::Workload;

/// Serves one accepted outbound connection to its end.
pub(super) async fn serve(ctx: Arc<PodCtx>, tcp: TcpStream, peer: SocketAddr) {
    let (src, orig_dst) = match identify(&ctx, &tcp, peer).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(src.addr = %peer, error = %e, reason = e.reason(), "outbound connection refused");
            return;
        }
    };
    let route = {
        let state = ctx.inputs.state.read();
        let router = Router {
            state: &state,
            network: &ctx.inputs.config.network,
            hbone_port: ctx.inputs.config.ports.inbound,
        };
        router.route(&src.workload, orig_dst, &mut rand::rng())
    };
    let route = match route {
        Ok(route) => route,
        Err(e) => {
            let record = ConnectionRecord::open(&ctx.inputs.metrics, src.info(peer, orig_dst));
            let e = ProxyError::Route(e);
            record.finish(Outcome::Failed {
                flags: ResponseFlags::ConnectFailure,
                error: &e,
                transferred: Default::default(),
            });
            return;
        }
    };
    let record = ConnectionRecord::open(&ctx.inputs.metrics, src.routed(peer, orig_dst, &route));
    let counters = ByteCounters::default();
    let connected = connect(&ctx, &tcp, &src, peer, &route).await;
    // The copy needs only the two ends: the source and destination workloads' copies go now,
    // not when a connection that may stay open for hours ends.
    drop((src, route));
    let copy_failure = |e| (ResponseFlags::None, ProxyError::Copy(e));
    let result = match connected {
        Ok(Connected::Tcp(upstream)) => copy_bidirectional(tcp, upstream, &counters)
            .await
            .map_err(copy_failure),
        Ok(Connected::Hbone(tunnel, early)) => {
            counters.add_sent(early);
            copy_bidirectional(tcp, tunnel, &counters)
                .await
                .map_err(copy_failure)
        }
        Err(failure) => Err(failure),
    };
    match result {
        Ok(t) => record.finish(Outcome::Completed(t)),
        Err((flags, e)) => record.finish(Outcome::Failed {
            flags,
            error: &e,
            transferred: crate::hbone::Transferred {
                sent: counters.sent(),
                received: counters.received(),
            },
        }),
    }
}

/// The source workload of a connection and its identity.
pub(super) struct Source {
    pub workload: Workload,
    pub identity: Identity,
}

impl Source {
    fn info(&self, peer: SocketAddr, dst: SocketAddr) -> ConnectionInfo {
        ConnectionInfo {
            direction: Direction::Outbound,
            src_addr: peer,
            src: Peer::of_workload(&self.workload, Some(self.identity.clone())),
            dst_addr: dst,
            hbone_addr: None,
            dst: Peer::default(),
            dst_service: None,
            security: SecurityPolicy::None,
        }
    }

    fn routed(&self, peer: SocketAddr, dst: SocketAddr, route: &Route) -> ConnectionInfo {
        let mut info = self.info(peer, dst);
        info.dst = match &route.dst_workload {
            Some(w) => Peer::of_workload(w, route.dst_identity.clone()),
            None => Peer::default(),
        };
        info.dst_service = route.dst_service.clone();
        if let Upstream::Hbone { hbone_addr, .. } = &route.upstream {
            info.hbone_addr = Some(*hbone_addr);
            info.security = SecurityPolicy::MutualTls;
        }
        info
    }
}

/// The original destination and the source workload (which must be this pod).
async fn identify(
    ctx: &PodCtx,
    tcp: &TcpStream,
    peer: SocketAddr,
) -> Result<(Source, SocketAddr), ProxyError> {
    let orig_dst = ctx
        .inputs
        .original_dst
        .original_dst(tcp)
        .map_err(ProxyError::OriginalDst)?;
    let workload = source_workload(ctx, peer).await?;
    let identity = workload_identity(&workload).map_err(ProxyError::Route)?;
    Ok((Source { workload, identity }, orig_dst))
}

fn is_pod(w: &Workload, pod: &PodInfo) -> bool {
    w.namespace == pod.namespace && w.name == pod.name && w.service_account == pod.service_account
}

/// The workload owning the connection's source IP, once xDS has sent it; it must be the pod.
async fn source_workload(ctx: &PodCtx, peer: SocketAddr) -> Result<Workload, ProxyError> {
    let network = &ctx.inputs.config.network;
    let ip = peer.ip();
    let found = ctx
        .inputs
        .state
        .wait_for(ctx.inputs.workload_wait, |s| {
            s.workload_by_ip(network, ip)
                .filter(|w| is_pod(w, &ctx.pod))
                .cloned()
        })
        .await;
    if let Some(w) = found {
        return Ok(w);
    }
    let other = ctx
        .inputs
        .state
        .read()
        .workload_by_ip(network, ip)
        .map(|w| {
            format!(
                "{}/{} (service account {})",
                w.namespace, w.name, w.service_account
            )
        });
    Err(match other {
        Some(workload) => ProxyError::SourceMismatch {
            ip,
            pod: ctx.pod.to_string(),
            workload,
        },
        None => ProxyError::WorkloadTimeout {
            ip,
            pod: ctx.pod.to_string(),
            waited: ctx.inputs.workload_wait,
        },
    })
}

type Failure = (ResponseFlags, ProxyError);

/// The upstream end of a connection.
enum Connected {
    Tcp(TcpStream),
    /// A tunnel, and how many bytes of the client's went with its `CONNECT`.
    Hbone(Tunnel, u64),
}

/// At most this much of what a client sent before its connection was routed goes with the
/// HBONE `CONNECT` (one read; the copy takes the rest).
const EARLY_DATA_LIMIT: usize = 16 * 1024;

/// What the client has already sent, read without waiting: a client that speaks first (an
/// HTTP request, a TLS ClientHello) then does not wait for the tunnel's answer to cross the
/// network before its first bytes do. Nothing yet, or end of stream, is empty. The read goes
/// to the socket itself: tokio's own `try_read` answers "would block" until its reactor has
/// polled a readiness event, which a connection just accepted usually has not had yet.
fn early_data(tcp: &TcpStream) -> std::io::Result<bytes::Bytes> {
    use std::io::Read;
    let mut buf = [0u8; EARLY_DATA_LIMIT];
    let socket = socket2::SockRef::from(tcp);
    let mut reader: &socket2::Socket = &socket;
    match reader.read(&mut buf) {
        Ok(n) => Ok(bytes::Bytes::copy_from_slice(&buf[..n])),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(bytes::Bytes::new()),
        Err(e) => Err(e),
    }
}

/// Makes closing the client's socket send a reset, as closing it with its bytes still unread
/// would have (used when bytes read early went nowhere).
fn reset_on_close(tcp: &TcpStream) {
    let socket = socket2::SockRef::from(tcp);
    if let Err(e) = socket.set_linger(Some(std::time::Duration::ZERO)) {
        tracing::debug!(error = %e, "cannot make the client's close a reset");
    }
}

/// Connects to the route's upstream: plain TCP from the pod's netns, or an HBONE tunnel.
async fn connect(
    ctx: &PodCtx,
    tcp: &TcpStream,
    src: &Source,
    peer: SocketAddr,
    route: &Route,
) -> Result<Connected, Failure> {
    match &route.upstream {
        Upstream::Tcp { addr } => crate::socket::connect(&*ctx.sockets, *addr)
            .await
            .map(Connected::Tcp)
            .map_err(|source| {
                let e = ProxyError::Connect {
                    addr: *addr,
                    source,
                };
                (ResponseFlags::ConnectFailure, e)
            }),
        Upstream::Hbone {
            hbone_addr,
            authority,
            identities,
        } => {
            let mut request = ConnectRequest::new(*authority, peer);
            request.baggage = Some(baggage(&src.workload)).filter(|b| !b.is_empty());
            request.forwarded_host = route.dst_service.as_ref().map(|s| s.hostname.clone());
            request.early_data = early_data(tcp).map_err(|source| {
                let e = crate::hbone::copy::CopyError::Read {
                    direction: crate::hbone::copy::Direction::Upstream,
                    source,
                };
                (ResponseFlags::None, ProxyError::Copy(e))
            })?;
            let early = request.early_data.len() as u64;
            let key = PoolKey::for_source(
                src.identity.clone(),
                Some(peer.ip()),
                identities.clone(),
                *hbone_addr,
            );
            let tunnel = open_tunnel(ctx, &key, &request).await.map_err(|e| {
                if early > 0 {
                    reset_on_close(tcp);
                }
                let flags = match &e {
                    ProxyError::Hbone(h) if h.status() == Some(http::StatusCode::UNAUTHORIZED) => {
                        ResponseFlags::Denied
                    }
                    _ => ResponseFlags::ConnectFailure,
                };
                (flags, e)
            })?;
            Ok(Connected::Hbone(tunnel, early))
        }
    }
}

/// A tunnel on a pooled connection, else on a new one dialed from the pod's netns with the
/// source workload's certificate.
async fn open_tunnel(
    ctx: &PodCtx,
    key: &PoolKey,
    request: &ConnectRequest,
) -> Result<Tunnel, ProxyError> {
    let pool = &ctx.inputs.pool;
    match pool.reuse(key, request).await {
        Some(Ok(tunnel)) => return Ok(tunnel),
        // The peer answered: that is the answer.
        Some(Err(e)) if e.status().is_some() => return Err(ProxyError::Hbone(e)),
        // The stream may have reached the target with the client's early bytes: sending them
        // again on another connection could deliver them twice.
        Some(Err(e)) if !request.early_data.is_empty() && e.may_have_been_processed() => {
            return Err(ProxyError::Hbone(e))
        }
        // The pooled connection died under us: dial a fresh one.
        Some(Err(e)) => tracing::debug!(error = %e, "pooled HBONE connection failed; redialing"),
        None => {}
    }
    // Boxed: the dial's state (TLS and HTTP/2 handshakes) is large, and inline it would make
    // every connection's task that size for its whole life, though most never dial.
    Box::pin(dial_tunnel(ctx, key, request)).await
}

/// A tunnel on a new connection dialed from the pod's netns with the source workload's
/// certificate.
async fn dial_tunnel(
    ctx: &PodCtx,
    key: &PoolKey,
    request: &ConnectRequest,
) -> Result<Tunnel, ProxyError> {
    let pool = &ctx.inputs.pool;
    let cert = ctx
        .inputs
        .certs
        .fetch_certificate(&key.src)
        .await
        .map_err(ProxyError::Certificate)?;
    let roots = cert
        .root_pem()
        .map(|pem| mesh_identity::tls::parse_certs(pem, "mesh root"))
        .transpose()
        .map_err(ProxyError::Tls)?
        .unwrap_or_default();
    let tls = mesh_identity::tls::client_config(
        Some(cert.cert_key.clone()),
        &roots,
        key.dst_identities.clone(),
    )
    .map_err(ProxyError::Tls)?;
    pool.dial(&*ctx.sockets, key, Arc::new(tls), request)
        .await
        .map_err(ProxyError::Hbone)
}
