//! Outbound routing (docs/compatibility.md, outbound routing), pure: given the state, the source workload and the original
//! destination, where the connection goes and how.
//!
//! 1. A service VIP: to the service's waypoint if it has one (`:authority` = `VIP:port`), else
//!    to one endpoint (healthy only unless `health_policy` is `ALLOW_ALL`; `capacity` is the
//!    weight; random among equals). No endpoint: passthrough for `PASSTHROUGH` services, else
//!    "no healthy upstream".
//! 2. A workload IP: to the workload's waypoint if it has one, else HBONE to `podIP:15008`
//!    when its tunnel protocol is HBONE, plain TCP otherwise.
//! 3. Anything else: plain TCP passthrough to the original destination.
//!
//! Traffic from a waypoint is never sent back to that waypoint.

use std::net::{IpAddr, SocketAddr};

use mesh_identity::Identity;
use mesh_proto::workload::load_balancing::{HealthPolicy, Mode};
use mesh_proto::workload::{TunnelProtocol, WorkloadStatus};
use rand::Rng;

use crate::metrics::ServiceName;
use crate::state::{GatewayAddress, GatewayDestination, Service, State, Workload};

/// Trust domain of workloads that do not name one.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// Why a connection cannot be routed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("no healthy upstream for service {service} port {port}; are its pods ready, and do they listen on the target port?")]
    NoHealthyUpstream { service: String, port: u16 },
    #[error("waypoint {waypoint} of {target} is not known to this ztunnel; is the waypoint deployed and ready?")]
    UnknownWaypoint { waypoint: String, target: String },
    #[error("workload {workload} has no usable identity ({detail}); check its namespace and service account")]
    BadIdentity { workload: String, detail: String },
}

impl RouteError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::NoHealthyUpstream { .. } => "no_healthy_upstream",
            RouteError::UnknownWaypoint { .. } => "unknown_waypoint",
            RouteError::BadIdentity { .. } => "bad_identity",
        }
    }
}

/// How the connection is carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// HBONE to `hbone_addr` with `CONNECT authority`; the peer must prove one of `identities`.
    Hbone {
        hbone_addr: SocketAddr,
        authority: SocketAddr,
        identities: Vec<Identity>,
    },
    /// Plain TCP to `addr`.
    Tcp { addr: SocketAddr },
}

/// The routing decision, with what metrics and logs need about the destination.
#[derive(Clone, Debug)]
pub struct Route {
    pub upstream: Upstream,
    /// The workload the connection lands on (the waypoint when through a waypoint).
    pub dst_workload: Option<Workload>,
    pub dst_identity: Option<Identity>,
    pub dst_service: Option<ServiceName>,
    pub via_waypoint: bool,
}

/// The SPIFFE identity of a workload.
pub fn workload_identity(w: &Workload) -> Result<Identity, RouteError> {
    let td = if w.trust_domain.is_empty() {
        DEFAULT_TRUST_DOMAIN
    } else {
        &w.trust_domain
    };
    Identity::new(td, &w.namespace, &w.service_account).map_err(|e| RouteError::BadIdentity {
        workload: w.uid.clone(),
        detail: e.to_string(),
    })
}

fn service_name(s: &Service) -> ServiceName {
    ServiceName {
        hostname: s.hostname.clone(),
        namespace: s.namespace.clone(),
        name: s.name.clone(),
    }
}

/// The service's SANs that parse as SPIFFE identities.
fn service_sans(s: &Service) -> impl Iterator<Item = Identity> + '_ {
    s.subject_alt_names
        .iter()
        .filter_map(|san| Identity::parse(san).ok())
}

/// Picks an endpoint of `svc` among `candidates`: healthy ones only unless the service's
/// health policy is `ALLOW_ALL`; `capacity` is the weight (all-zero weights: uniform).
pub fn choose_endpoint<'a, R: Rng>(
    svc: &Service,
    candidates: &[&'a Workload],
    rng: &mut R,
) -> Option<&'a Workload> {
    let allow_unhealthy = svc
        .load_balancing
        .as_ref()
        .is_some_and(|lb| lb.health_policy == HealthPolicy::AllowAll);
    let eligible: Vec<&Workload> = candidates
        .iter()
        .copied()
        .filter(|w| !w.workload_ips.is_empty())
        .filter(|w| allow_unhealthy || w.status == WorkloadStatus::Healthy)
        .collect();
    let total: u64 = eligible.iter().map(|w| u64::from(w.capacity)).sum();
    if total == 0 {
        return match eligible.len() {
            0 => None,
            n => Some(eligible[rng.random_range(0..n)]),
        };
    }
    let mut point = rng.random_range(0..total);
    for w in eligible {
        let weight = u64::from(w.capacity);
        if point < weight {
            return Some(w);
        }
        point -= weight;
    }
    None
}

/// The port on the endpoint for service port `port`: the workload's own mapping, else the
/// service's, else the same port (0 also means "same port").
pub fn target_port(svc: &Service, endpoint: &Workload, port: u16) -> u16 {
    let mapped = endpoint
        .services
        .get(&svc.key())
        .and_then(|ports| ports.iter().find(|p| p.service_port == port))
        .or_else(|| svc.ports.iter().find(|p| p.service_port == port))
        .map_or(0, |p| p.target_port);
    if mapped == 0 {
        port
    } else {
        mapped
    }
}

/// Outbound routing inputs that do not change per connection.
#[derive(Clone, Copy, Debug)]
pub struct Router<'a> {
    pub state: &'a State,
    pub network: &'a str,
    /// Port of HBONE endpoints (15008).
    pub hbone_port: u16,
}

impl Router<'_> {
    /// Routes a connection from `src` to `dst`.
    pub fn route<R: Rng>(
        &self,
        src: &Workload,
        dst: SocketAddr,
        rng: &mut R,
    ) -> Result<Route, RouteError> {
        if let Some(svc) = self.state.service_by_vip(self.network, dst.ip()) {
            return self.service_route(src, svc, dst, rng);
        }
        if let Some(w) = self.state.workload_by_ip(self.network, dst.ip()) {
            if let Some(wp) = w
                .waypoint
                .as_ref()
                .filter(|wp| !is_gateway(self.state, src, wp))
            {
                return self.waypoint_route(wp, dst, &w.uid, None, rng);
            }
            return self.workload_route(w, dst, dst, None);
        }
        Ok(Route {
            upstream: Upstream::Tcp { addr: dst },
            dst_workload: None,
            dst_identity: None,
            dst_service: None,
            via_waypoint: false,
        })
    }

    fn service_route<R: Rng>(
        &self,
        src: &Workload,
        svc: &Service,
        dst: SocketAddr,
        rng: &mut R,
    ) -> Result<Route, RouteError> {
        if let Some(wp) = svc
            .waypoint
            .as_ref()
            .filter(|wp| !is_gateway(self.state, src, wp))
        {
            return self.waypoint_route(wp, dst, &svc.key(), Some(service_name(svc)), rng);
        }
        let key = svc.key();
        let candidates = self.state.workloads_of_service(&key);
        let Some(endpoint) = choose_endpoint(svc, &candidates, rng) else {
            let passthrough = svc
                .load_balancing
                .as_ref()
                .is_some_and(|lb| lb.mode == Mode::Passthrough);
            if passthrough {
                return Ok(Route {
                    upstream: Upstream::Tcp { addr: dst },
                    dst_workload: None,
                    dst_identity: None,
                    dst_service: Some(service_name(svc)),
                    via_waypoint: false,
                });
            }
            return Err(RouteError::NoHealthyUpstream {
                service: svc.hostname.clone(),
                port: dst.port(),
            });
        };
        let ip = endpoint_ip(endpoint, dst.ip());
        let target = SocketAddr::new(ip, target_port(svc, endpoint, dst.port()));
        let mut route = self.workload_route(endpoint, target, target, Some(svc))?;
        route.dst_service = Some(service_name(svc));
        Ok(route)
    }

    /// Direct to a workload: HBONE to `ip:15008` (authority `target`) or TCP to `tcp_addr`.
    fn workload_route(
        &self,
        w: &Workload,
        target: SocketAddr,
        tcp_addr: SocketAddr,
        svc: Option<&Service>,
    ) -> Result<Route, RouteError> {
        let identity = workload_identity(w)?;
        let upstream = if w.protocol == TunnelProtocol::Hbone {
            let mut identities = vec![identity.clone()];
            identities.extend(svc.into_iter().flat_map(service_sans));
            Upstream::Hbone {
                hbone_addr: SocketAddr::new(target.ip(), self.hbone_port),
                authority: target,
                identities,
            }
        } else {
            Upstream::Tcp { addr: tcp_addr }
        };
        Ok(Route {
            upstream,
            dst_workload: Some(w.clone()),
            dst_identity: Some(identity),
            dst_service: None,
            via_waypoint: false,
        })
    }

    fn waypoint_route<R: Rng>(
        &self,
        wp: &GatewayAddress,
        dst: SocketAddr,
        target: &str,
        svc: Option<ServiceName>,
        rng: &mut R,
    ) -> Result<Route, RouteError> {
        let unknown = |waypoint: String| RouteError::UnknownWaypoint {
            waypoint,
            target: target.to_string(),
        };
        let (workload, mut identities) = match &wp.destination {
            GatewayDestination::Address(a) => {
                let w = self
                    .state
                    .workload_by_ip(&a.network, a.address)
                    .ok_or_else(|| unknown(a.address.to_string()))?;
                (w, Vec::new())
            }
            GatewayDestination::Hostname {
                namespace,
                hostname,
            } => {
                let key = format!("{namespace}/{hostname}");
                let wp_svc = self
                    .state
                    .service(&key)
                    .ok_or_else(|| unknown(key.clone()))?;
                let candidates = self.state.workloads_of_service(&key);
                let w = choose_endpoint(wp_svc, &candidates, rng).ok_or_else(|| unknown(key))?;
                (w, service_sans(wp_svc).collect())
            }
        };
        let identity = workload_identity(workload)?;
        identities.push(identity.clone());
        let port = match wp.hbone_mtls_port {
            0 => self.hbone_port,
            p => p,
        };
        let ip = match &wp.destination {
            GatewayDestination::Address(a) => a.address,
            GatewayDestination::Hostname { .. } => endpoint_ip(workload, dst.ip()),
        };
        Ok(Route {
            upstream: Upstream::Hbone {
                hbone_addr: SocketAddr::new(ip, port),
                authority: dst,
                identities,
            },
            dst_workload: Some(workload.clone()),
            dst_identity: Some(identity),
            dst_service: svc,
            via_waypoint: true,
        })
    }
}

/// The workload's IP of the same family as `like`, else its first.
fn endpoint_ip(w: &Workload, like: IpAddr) -> IpAddr {
    w.workload_ips
        .iter()
        .find(|ip| ip.is_ipv4() == like.is_ipv4())
        .or_else(|| w.workload_ips.first())
        .copied()
        .unwrap_or(like)
}

/// Whether `src` is (one of the pods of) gateway `gw`.
pub fn is_gateway(state: &State, src: &Workload, gw: &GatewayAddress) -> bool {
    match &gw.destination {
        GatewayDestination::Address(a) => {
            src.network == a.network && src.workload_ips.contains(&a.address)
        }
        GatewayDestination::Hostname {
            namespace,
            hostname,
        } => {
            let key = format!("{namespace}/{hostname}");
            src.services.contains_key(&key)
                || state
                    .workloads_of_service(&key)
                    .iter()
                    .any(|w| w.uid == src.uid)
        }
    }
}
