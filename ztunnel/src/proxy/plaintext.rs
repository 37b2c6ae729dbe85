//! Inbound plaintext (15006): connections to the pod that did not come over HBONE. RBAC runs
//! with no peer identity, so a STRICT PeerAuthentication (istiod's DENY policy
//! `istio_converted_static_strict`, matching any plaintext peer) or any ALLOW policy naming
//! principals refuses them; allowed connections pass through to the original destination,
//! dialed from the pod's network namespace.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;

use super::inputs::PodCtx;
use super::route::workload_identity;
use super::ProxyError;
use crate::hbone::{copy_bidirectional, ByteCounters, Transferred};
use crate::metrics::{
    ConnectionInfo, ConnectionRecord, Direction, Outcome, Peer, ResponseFlags, SecurityPolicy,
};
use crate::rbac;

/// Serves one accepted plaintext inbound connection to its end.
pub(super) async fn serve(ctx: Arc<PodCtx>, tcp: TcpStream, peer: SocketAddr) {
    let decided = match decide(&ctx, &tcp, peer).await {
        Ok(decided) => decided,
        Err(e) => {
            tracing::warn!(src.addr = %peer, error = %e, reason = e.reason(), "inbound plaintext connection refused");
            return;
        }
    };
    let (info, decision) = decided;
    let dst = info.dst_addr;
    let record = ConnectionRecord::open(&ctx.inputs.metrics, info);
    if !decision.is_allowed() {
        let e = ProxyError::Denied { decision };
        record.finish(Outcome::Failed {
            flags: ResponseFlags::Denied,
            error: &e,
            transferred: Transferred::default(),
        });
        return;
    }
    let upstream = match ctx.dial_app(peer.ip(), dst).await {
        Ok(upstream) => upstream,
        Err(source) => {
            let e = ProxyError::Connect { addr: dst, source };
            record.finish(Outcome::Failed {
                flags: ResponseFlags::ConnectFailure,
                error: &e,
                transferred: Transferred::default(),
            });
            return;
        }
    };
    let counters = ByteCounters::default();
    match copy_bidirectional(tcp, upstream, &counters).await {
        Ok(t) => record.finish(Outcome::Completed(t)),
        Err(e) => record.finish(Outcome::Failed {
            flags: ResponseFlags::None,
            error: &ProxyError::Copy(e),
            transferred: Transferred {
                sent: counters.sent(),
                received: counters.received(),
            },
        }),
    }
}

/// The connection's attributes and the RBAC decision for it.
async fn decide(
    ctx: &PodCtx,
    tcp: &TcpStream,
    peer: SocketAddr,
) -> Result<(ConnectionInfo, rbac::Decision), ProxyError> {
    let dst_addr = ctx
        .inputs
        .original_dst
        .original_dst(tcp)
        .map_err(ProxyError::OriginalDst)?;
    let inputs = &ctx.inputs;
    let network = &inputs.config.network;
    let ip = dst_addr.ip();
    inputs
        .state
        .wait_for(inputs.workload_wait, |s| {
            s.workload_by_ip(network, ip).map(drop)
        })
        .await
        .ok_or(ProxyError::UnknownDestination { ip })?;
    let state = inputs.state.read();
    let dst = state
        .workload_by_ip(network, ip)
        .ok_or(ProxyError::UnknownDestination { ip })?;
    let conn = rbac::Connection {
        src_identity: None,
        src_ip: peer.ip(),
        dst_ip: ip,
        dst_port: dst_addr.port(),
        dst_network: network.clone(),
    };
    let decision = rbac::authorize(&conn, state.policies_for(dst));
    let src = state
        .workload_by_ip(network, peer.ip())
        .map(|w| Peer::of_workload(w, None))
        .unwrap_or_default();
    let info = ConnectionInfo {
        direction: Direction::Inbound,
        src_addr: peer,
        src,
        dst_addr,
        hbone_addr: None,
        dst: Peer::of_workload(dst, workload_identity(dst).ok()),
        dst_service: None,
        security: SecurityPolicy::None,
    };
    Ok((info, decision))
}
