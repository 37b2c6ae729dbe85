//! Inbound HBONE (15008): TLS with the certificate of the workload owning the connection's
//! local IP (fetched from the [`crate::certs::CertManager`] before the handshake; unknown IP:
//! no handshake), a SPIFFE client certificate required, then [`crate::hbone::Server`] with
//! [`InboundConnector`]: per `CONNECT`, RBAC for the destination workload, then a dial to the
//! target from the pod's network namespace.
//!
//! One `Server` per (identity, certificate serial): a rotated certificate gets a new server,
//! connections on the old one continue until they close. Each accepted tunnel carries its own
//! metrics/access-log record ([`InboundTunnel`]), finished by the server exactly once.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use mesh_identity::tls::{parse_certs, server_config};
use mesh_identity::{ClientAuth, Identity};
use tokio::net::TcpStream;

use super::headers::forwarded_for;
use super::inputs::PodCtx;
use super::route::{is_gateway, workload_identity};
use super::ProxyError;
use crate::hbone::server::BoxFuture;
use crate::hbone::{
    Accepted, Connector, InboundRequest, Refusal, Server, Transferred, TunnelEnd, TunnelObserver,
    FORWARDED_HEADER,
};
use crate::metrics::{
    ConnectionInfo, ConnectionRecord, Direction, Outcome, Peer, ResponseFlags, SecurityPolicy,
};
use crate::rbac;
use crate::state::{State, Workload};

/// The HBONE side of one pod proxy. Dropping it drops its servers, which aborts their
/// tunnels (the pod's drain deadline).
pub(super) struct HboneInbound {
    ctx: Arc<PodCtx>,
    connector: Arc<InboundConnector>,
    /// Current server per identity, with the serial of its certificate.
    servers: Mutex<HashMap<Identity, (String, Arc<Server>)>>,
    /// Servers replaced after a rotation, kept until nothing is open on them.
    retired: Mutex<Vec<Arc<Server>>>,
    /// Set by [`HboneInbound::drain`]: servers made later start drained.
    draining: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HboneInbound {
    pub(super) fn new(ctx: Arc<PodCtx>) -> HboneInbound {
        HboneInbound {
            connector: Arc::new(InboundConnector { ctx: ctx.clone() }),
            ctx,
            servers: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
        }
    }

    /// Serves one accepted connection until it closes.
    pub(super) async fn serve(self: Arc<Self>, tcp: TcpStream, peer: SocketAddr) {
        let local = match tcp.local_addr() {
            Ok(local) => local,
            Err(e) => {
                tracing::debug!(error = %e, "HBONE connection closed before it was served");
                return;
            }
        };
        let server = match self.server_for(local.ip()).await {
            Ok(server) => server,
            Err(e) => {
                tracing::warn!(%peer, %local, error = %e, reason = e.reason(), "refusing the HBONE handshake");
                return;
            }
        };
        if let Err(e) = server.serve_connection(tcp, peer).await {
            tracing::debug!(%peer, error = %e, reason = e.reason(), "HBONE connection ended with an error");
        }
    }

    /// The server presenting the certificate of the workload owning `ip`.
    async fn server_for(&self, ip: IpAddr) -> Result<Arc<Server>, ProxyError> {
        let inputs = &self.ctx.inputs;
        let network = &inputs.config.network;
        let workload = inputs
            .state
            .wait_for(inputs.workload_wait, |s| {
                s.workload_by_ip(network, ip).cloned()
            })
            .await
            .ok_or(ProxyError::UnknownDestination { ip })?;
        let identity = workload_identity(&workload)?;
        let cert = inputs
            .certs
            .fetch_certificate(&identity)
            .await
            .map_err(ProxyError::Certificate)?;
        if let Some((serial, server)) = lock(&self.servers).get(&identity) {
            if *serial == cert.serial {
                return Ok(server.clone());
            }
        }
        let roots = match cert.root_pem() {
            Some(pem) => parse_certs(pem, "mesh root").map_err(ProxyError::Tls)?,
            None => Vec::new(),
        };
        let tls = server_config(cert.cert_key.clone(), &roots, ClientAuth::RequireSpiffe)
            .map_err(ProxyError::Tls)?;
        let server = Arc::new(Server::new(
            Arc::new(tls),
            inputs.h2.clone(),
            self.connector.clone(),
        ));
        let old = lock(&self.servers).insert(identity, (cert.serial.clone(), server.clone()));
        {
            let mut retired = lock(&self.retired);
            // Only this list holds it and nothing is open on it: nobody can use it again.
            retired.retain(|s| Arc::strong_count(s) > 1 || !s.is_idle());
            retired.extend(old.map(|(_, old)| old));
        }
        // A connection accepted just before the pod's drain may get here after it.
        if self.draining.load(Ordering::SeqCst) {
            server.drain();
        }
        Ok(server)
    }

    /// Every server, current and retired.
    fn all_servers(&self) -> Vec<Arc<Server>> {
        let mut servers: Vec<Arc<Server>> = lock(&self.servers)
            .values()
            .map(|(_, s)| s.clone())
            .collect();
        servers.extend(lock(&self.retired).iter().cloned());
        servers
    }

    /// Tells every server's connections to finish: GOAWAY, in-flight tunnels continue.
    /// Connections served from now on get a GOAWAY right after their handshake.
    pub(super) fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        for server in self.all_servers() {
            server.drain();
        }
    }

    /// Completes once every server (drained with [`HboneInbound::drain`]) has no connection
    /// or tunnel left, so that every tunnel's metrics and access log are recorded.
    pub(super) async fn drained(&self) {
        for server in self.all_servers() {
            server.drained().await;
        }
    }
}

/// RBAC and dial for each `CONNECT`, and the connection's metrics and access log.
pub(super) struct InboundConnector {
    ctx: Arc<PodCtx>,
}

/// What the state says about one `CONNECT`.
struct Decided {
    info: ConnectionInfo,
    decision: rbac::Decision,
}

impl InboundConnector {
    /// The destination workload (the one owning the connection's local IP, which the target
    /// must belong to), the RBAC decision and the connection's labels.
    fn decide(&self, state: &State, req: &InboundRequest) -> Result<Decided, Refusal> {
        let network = &self.ctx.inputs.config.network;
        let local_ip = req.local_addr.ip();
        // The certificate was chosen by this IP, so its workload only vanishes on a race
        // with xDS: 503, as upstream.
        let local =
            state
                .workload_by_ip(network, local_ip)
                .ok_or_else(|| Refusal::Unavailable {
                    reason: ProxyError::UnknownDestination { ip: local_ip }.to_string(),
                })?;
        let dst = state
            .workload_by_ip(network, req.target.ip())
            .filter(|w| w.uid == local.uid)
            .ok_or_else(|| Refusal::BadRequest {
                reason: format!(
                    "target {} is not an address of workload {}/{} (which owns {local_ip}); HBONE to a pod may only target that pod",
                    req.target, local.namespace, local.name
                ),
            })?;
        let forwarded = req
            .headers
            .get(FORWARDED_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(forwarded_for);
        let peer_ip = req.peer_addr.ip();
        let src_ip = match forwarded {
            Some(ip) if from_waypoint(state, dst, peer_ip) => ip,
            _ => peer_ip,
        };
        let conn = rbac::Connection {
            src_identity: Some(req.peer_identity.clone()),
            src_ip,
            dst_ip: req.target.ip(),
            dst_port: req.target.port(),
            dst_network: network.clone(),
        };
        let decision = rbac::authorize(&conn, state.policies_for(dst));
        // Labels: the workload at the source IP, else the one `forwarded` names if it has
        // the identity the peer proved.
        let proven = |w: &&Workload| workload_identity(w).is_ok_and(|i| i == req.peer_identity);
        let src_workload = state
            .workload_by_ip(network, src_ip)
            .or_else(|| forwarded.and_then(|ip| state.workload_by_ip(network, ip).filter(proven)));
        let src = match src_workload {
            Some(w) => Peer::of_workload(w, Some(req.peer_identity.clone())),
            None => Peer::of_identity(req.peer_identity.clone()),
        };
        let info = ConnectionInfo {
            direction: Direction::Inbound,
            src_addr: SocketAddr::new(
                src_ip,
                if src_ip == peer_ip {
                    req.peer_addr.port()
                } else {
                    0
                },
            ),
            src,
            dst_addr: req.target,
            hbone_addr: Some(req.local_addr),
            dst: Peer::of_workload(dst, workload_identity(dst).ok()),
            dst_service: None,
            security: SecurityPolicy::MutualTls,
        };
        Ok(Decided { info, decision })
    }

    async fn authorize_and_dial(&self, req: InboundRequest) -> Result<Accepted, Refusal> {
        let decided = {
            let state = self.ctx.inputs.state.read();
            self.decide(&state, &req)
        };
        let Decided { info, decision } = decided?;
        let record = ConnectionRecord::open(&self.ctx.inputs.metrics, info);
        // The application sees the HBONE peer's IP (docs/compatibility.md, HBONE), as upstream.
        let source = req.peer_addr.ip();
        if !decision.is_allowed() {
            let reason = decision.to_string();
            let e = ProxyError::Denied { decision };
            record.finish(Outcome::Failed {
                flags: ResponseFlags::Denied,
                error: &e,
                transferred: Transferred::default(),
            });
            return Err(Refusal::Denied { reason });
        }
        match self.ctx.dial_app(source, req.target).await {
            Ok(upstream) => Ok(Accepted::new(upstream, InboundTunnel { record })),
            Err(source) => {
                let e = ProxyError::Connect {
                    addr: req.target,
                    source: std::io::Error::new(source.kind(), source.to_string()),
                };
                record.finish(Outcome::Failed {
                    flags: ResponseFlags::ConnectFailure,
                    error: &e,
                    transferred: Transferred::default(),
                });
                Err(Refusal::ConnectFailed {
                    target: req.target,
                    source,
                })
            }
        }
    }
}

/// The metrics and access-log record of one accepted tunnel, finished with its end.
struct InboundTunnel {
    record: ConnectionRecord,
}

impl TunnelObserver for InboundTunnel {
    fn finished(self: Box<Self>, end: TunnelEnd) {
        let outcome = match &end.result {
            Ok(()) => Outcome::Completed(end.transferred),
            Err(error) => Outcome::Failed {
                flags: ResponseFlags::None,
                error,
                transferred: end.transferred,
            },
        };
        self.record.finish(outcome);
    }
}

/// Whether `peer_ip` is a waypoint of `dst` (its own, or one of its services'): only then is
/// the `forwarded` source trusted for policy.
fn from_waypoint(state: &State, dst: &Workload, peer_ip: IpAddr) -> bool {
    let Some(peer) = state.workload_by_ip(&dst.network, peer_ip) else {
        return false;
    };
    let service_waypoints = dst
        .services
        .keys()
        .filter_map(|key| state.service(key))
        .filter_map(|s| s.waypoint.as_ref());
    dst.waypoint
        .iter()
        .chain(service_waypoints)
        .any(|wp| is_gateway(state, peer, wp))
}

impl Connector for Arc<InboundConnector> {
    fn connect(&self, request: InboundRequest) -> BoxFuture<'static, Result<Accepted, Refusal>> {
        let this = self.clone();
        Box::pin(async move { this.authorize_and_dial(request).await })
    }
}
