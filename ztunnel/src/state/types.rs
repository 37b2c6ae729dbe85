//! Validated domain types of workloads and services, converted from `istio.workload` protos.
//!
//! Conversion rejects what the proxy cannot use (bad IP byte lengths, empty keys, enum values
//! this ztunnel does not know, ports above 65535), naming the resource and the field, so that
//! the xDS client can NACK the resource and keep the previous state. `Extension`s are ignored.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mesh_proto::workload::{self as pb, gateway_address, load_balancing};
use serde::Serialize;

use super::{Problem, StateError};

/// A workload (pod, WorkloadEntry). Key: `uid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    pub workload_ips: Vec<IpAddr>,
    pub network: String,
    pub protocol: pb::TunnelProtocol,
    pub trust_domain: String,
    pub service_account: String,
    pub waypoint: Option<GatewayAddress>,
    pub network_gateway: Option<GatewayAddress>,
    pub node: String,
    pub canonical_name: String,
    pub canonical_revision: String,
    pub workload_type: pb::WorkloadType,
    pub workload_name: String,
    pub native_tunnel: bool,
    pub application_tunnel: Option<ApplicationTunnel>,
    /// `namespace/hostname` of each service selecting this workload, with its ports.
    pub services: BTreeMap<String, Vec<Port>>,
    /// Selector policies, `namespace/name`.
    pub authorization_policies: Vec<String>,
    pub status: pb::WorkloadStatus,
    pub cluster_id: String,
    pub locality: Option<Locality>,
    pub network_mode: pb::NetworkMode,
    /// Relative load-balancing weight (default 1).
    pub capacity: u32,
}

/// A service. Key: `namespace/hostname`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    pub vips: Vec<NetworkAddress>,
    pub ports: Vec<Port>,
    pub subject_alt_names: Vec<String>,
    pub waypoint: Option<GatewayAddress>,
    pub load_balancing: Option<LoadBalancing>,
    pub ip_families: pb::IpFamilies,
    pub canonical: bool,
    pub ingress_use_waypoint: bool,
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    pub visibility: pb::ServiceVisibility,
}

/// Trust domain of workloads that name none.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

impl Workload {
    /// The workload's SPIFFE identity (`cluster.local` when it names no trust domain).
    pub fn identity(&self) -> Result<mesh_identity::Identity, mesh_identity::IdentityError> {
        let td = if self.trust_domain.is_empty() {
            DEFAULT_TRUST_DOMAIN
        } else {
            &self.trust_domain
        };
        mesh_identity::Identity::new(td, &self.namespace, &self.service_account)
    }
}

impl Service {
    /// `namespace/hostname`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }
}

/// An IP (or CIDR when `length` is set) on a network.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NetworkAddress {
    pub network: String,
    pub address: IpAddr,
    pub length: Option<u8>,
}

/// A service port and where it lands on workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    pub service_port: u16,
    pub target_port: u16,
    pub app_protocol: pb::AppProtocol,
}

/// A waypoint or network gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayAddress {
    pub destination: GatewayDestination,
    pub hbone_mtls_port: u16,
}

/// Where a gateway is: a service hostname or an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GatewayDestination {
    Hostname { namespace: String, hostname: String },
    Address(NetworkAddress),
}

/// One of a weighted set of waypoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightedWaypoint {
    pub destination: GatewayAddress,
    pub weight: u32,
}

/// Sandwich / PROXY-protocol tunnel into the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplicationTunnel {
    pub protocol: pb::application_tunnel::Protocol,
    pub port: u16,
}

/// Region / zone / subzone (serialized as upstream: `region`, `zone`, `subzone`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

/// Locality-aware load balancing of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadBalancing {
    pub routing_preference: Vec<load_balancing::Scope>,
    pub mode: load_balancing::Mode,
    pub health_policy: load_balancing::HealthPolicy,
}

/// Names the resource being converted, for errors.
pub(super) struct Ctx<'a> {
    pub(super) resource: &'a str,
}

impl Ctx<'_> {
    pub(super) fn err(&self, field: impl Into<String>, problem: Problem) -> StateError {
        StateError::Invalid {
            resource: self.resource.to_string(),
            field: field.into(),
            problem,
        }
    }

    fn enumeration<T: TryFrom<i32>>(&self, field: &str, v: i32) -> Result<T, StateError> {
        T::try_from(v).map_err(|_| self.err(field, Problem::UnknownEnum(v)))
    }

    fn port(&self, field: &str, v: u32) -> Result<u16, StateError> {
        u16::try_from(v).map_err(|_| self.err(field, Problem::PortRange(v)))
    }

    fn non_empty(&self, field: &str, v: &str) -> Result<String, StateError> {
        if v.is_empty() {
            return Err(self.err(field, Problem::Empty));
        }
        Ok(v.to_string())
    }

    pub(super) fn ip(&self, field: &str, bytes: &[u8]) -> Result<IpAddr, StateError> {
        if let Ok(b) = <[u8; 4]>::try_from(bytes) {
            return Ok(IpAddr::V4(Ipv4Addr::from(b)));
        }
        if let Ok(b) = <[u8; 16]>::try_from(bytes) {
            return Ok(IpAddr::V6(Ipv6Addr::from(b)));
        }
        Err(self.err(field, Problem::IpLength(bytes.len())))
    }

    fn network_address(
        &self,
        field: &str,
        a: &pb::NetworkAddress,
    ) -> Result<NetworkAddress, StateError> {
        let address = self.ip(&format!("{field}.address"), &a.address)?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let length = match a.length {
            Some(l) if l > max => {
                return Err(self.err(format!("{field}.length"), Problem::PrefixLength(l)))
            }
            Some(l) => u8::try_from(l).ok(),
            None => None,
        };
        Ok(NetworkAddress {
            network: a.network.clone(),
            address,
            length,
        })
    }

    fn gateway(&self, field: &str, g: &pb::GatewayAddress) -> Result<GatewayAddress, StateError> {
        let destination = match &g.destination {
            Some(gateway_address::Destination::Hostname(h)) => GatewayDestination::Hostname {
                namespace: h.namespace.clone(),
                hostname: self.non_empty(&format!("{field}.hostname.hostname"), &h.hostname)?,
            },
            Some(gateway_address::Destination::Address(a)) => {
                GatewayDestination::Address(self.network_address(&format!("{field}.address"), a)?)
            }
            None => return Err(self.err(format!("{field}.destination"), Problem::Empty)),
        };
        Ok(GatewayAddress {
            destination,
            hbone_mtls_port: self.port(&format!("{field}.hboneMtlsPort"), g.hbone_mtls_port)?,
        })
    }

    fn ports(&self, field: &str, ports: &[pb::Port]) -> Result<Vec<Port>, StateError> {
        ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Ok(Port {
                    service_port: self
                        .port(&format!("{field}[{i}].servicePort"), p.service_port)?,
                    target_port: self.port(&format!("{field}[{i}].targetPort"), p.target_port)?,
                    app_protocol: self
                        .enumeration(&format!("{field}[{i}].appProtocol"), p.app_protocol)?,
                })
            })
            .collect()
    }

    fn opt_gateway(
        &self,
        field: &str,
        g: Option<&pb::GatewayAddress>,
    ) -> Result<Option<GatewayAddress>, StateError> {
        g.map(|g| self.gateway(field, g)).transpose()
    }
}

/// Validates and converts a workload resource.
pub(super) fn workload(ctx: &Ctx<'_>, w: &pb::Workload) -> Result<Workload, StateError> {
    let workload_ips = w
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| ctx.ip(&format!("addresses[{i}]"), a))
        .collect::<Result<_, _>>()?;
    let mut services = BTreeMap::new();
    for (key, list) in &w.services {
        if !is_service_key(key) {
            return Err(ctx.err("services", Problem::BadServiceKey(key.clone())));
        }
        let ports = ctx.ports(&format!("services[{key:?}].ports"), &list.ports)?;
        services.insert(key.clone(), ports);
    }
    let application_tunnel = match &w.application_tunnel {
        Some(t) => Some(ApplicationTunnel {
            protocol: ctx.enumeration("applicationTunnel.protocol", t.protocol)?,
            port: ctx.port("applicationTunnel.port", t.port)?,
        }),
        None => None,
    };
    Ok(Workload {
        uid: ctx.non_empty("uid", &w.uid)?,
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        hostname: w.hostname.clone(),
        workload_ips,
        network: w.network.clone(),
        protocol: ctx.enumeration("tunnelProtocol", w.tunnel_protocol)?,
        trust_domain: w.trust_domain.clone(),
        service_account: w.service_account.clone(),
        waypoint: ctx.opt_gateway("waypoint", w.waypoint.as_ref())?,
        network_gateway: ctx.opt_gateway("networkGateway", w.network_gateway.as_ref())?,
        node: w.node.clone(),
        canonical_name: w.canonical_name.clone(),
        canonical_revision: w.canonical_revision.clone(),
        workload_type: ctx.enumeration("workloadType", w.workload_type)?,
        workload_name: w.workload_name.clone(),
        native_tunnel: w.native_tunnel,
        application_tunnel,
        services,
        authorization_policies: w.authorization_policies.clone(),
        status: ctx.enumeration("status", w.status)?,
        cluster_id: w.cluster_id.clone(),
        locality: w.locality.as_ref().map(|l| Locality {
            region: l.region.clone(),
            zone: l.zone.clone(),
            subzone: l.subzone.clone(),
        }),
        network_mode: ctx.enumeration("networkMode", w.network_mode)?,
        capacity: w.capacity.unwrap_or(1),
    })
}

/// Validates and converts a service resource.
pub(super) fn service(ctx: &Ctx<'_>, s: &pb::Service) -> Result<Service, StateError> {
    let vips = s
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| ctx.network_address(&format!("addresses[{i}]"), a))
        .collect::<Result<_, _>>()?;
    let load_balancing = match &s.load_balancing {
        Some(lb) => Some(LoadBalancing {
            routing_preference: lb
                .routing_preference
                .iter()
                .enumerate()
                .map(|(i, v)| ctx.enumeration(&format!("loadBalancing.routingPreference[{i}]"), *v))
                .collect::<Result<_, _>>()?,
            mode: ctx.enumeration("loadBalancing.mode", lb.mode)?,
            health_policy: ctx.enumeration("loadBalancing.healthPolicy", lb.health_policy)?,
        }),
        None => None,
    };
    let weighted_waypoints = s
        .weighted_waypoints
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let field = format!("weightedWaypoints[{i}].destination");
            let Some(d) = &w.destination else {
                return Err(ctx.err(field, Problem::Empty));
            };
            Ok(WeightedWaypoint {
                destination: ctx.gateway(&field, d)?,
                weight: w.weight,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Service {
        name: s.name.clone(),
        namespace: ctx.non_empty("namespace", &s.namespace)?,
        hostname: ctx.non_empty("hostname", &s.hostname)?,
        vips,
        ports: ctx.ports("ports", &s.ports)?,
        subject_alt_names: s.subject_alt_names.clone(),
        waypoint: ctx.opt_gateway("waypoint", s.waypoint.as_ref())?,
        load_balancing,
        ip_families: ctx.enumeration("ipFamilies", s.ip_families)?,
        canonical: s.canonical,
        ingress_use_waypoint: s.ingress_use_waypoint,
        weighted_waypoints,
        visibility: ctx.enumeration("visibility", s.visibility)?,
    })
}

/// `namespace/hostname` with both parts non-empty.
pub(super) fn is_service_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(ns, host)| !ns.is_empty() && !host.is_empty())
}
