//! Workloads and services as Istio's ztunnel shows them in `/config_dump`, so that upstream
//! `istioctl ztunnel-config` (whose Go structs reject other JSON types) reads our dump:
//! addresses as `network/ip` strings, service hostnames as `namespace/hostname`, ports as
//! `{"servicePort": targetPort}` maps, `endpoints` on services keyed by workload uid, enum
//! values as upstream's names (`TCP`/`HBONE`, `Healthy`, `deployment`, `OnlyHealthy`), and
//! empty optional fields left out. The same shapes are what `LOCAL_XDS_PATH` files use.

use std::collections::BTreeMap;
use std::net::IpAddr;

use mesh_proto::workload::{self as pb, load_balancing};
use serde::Serialize;

use super::types::{
    GatewayAddress, GatewayDestination, NetworkAddress, Port, DEFAULT_TRUST_DOMAIN,
};
use super::{Service, State, Workload};

/// Service account of workloads that name none (as upstream).
const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Cluster of workloads that name none (as upstream).
const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

/// A workload as dumped.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadDump<'a> {
    workload_ips: &'a [IpAddr],
    #[serde(skip_serializing_if = "Option::is_none")]
    waypoint: Option<GatewayDump>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network_gateway: Option<GatewayDump>,
    protocol: &'static str,
    network_mode: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    uid: &'a str,
    name: &'a str,
    namespace: &'a str,
    trust_domain: &'a str,
    service_account: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    network: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    workload_name: &'a str,
    workload_type: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    canonical_name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    canonical_revision: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    hostname: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    node: &'a str,
    #[serde(skip_serializing_if = "is_false")]
    native_tunnel: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    application_tunnel: Option<ApplicationTunnelDump>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    authorization_policies: &'a [String],
    status: &'static str,
    cluster_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    locality: Option<&'a super::types::Locality>,
    /// `namespace/hostname` of the services selecting it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    services: Vec<&'a str>,
    capacity: u32,
}

/// A waypoint or network gateway: `destination` is `namespace/hostname` or `network/ip`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayDump {
    destination: String,
    hbone_mtls_port: u16,
}

#[derive(Debug, Serialize)]
struct ApplicationTunnelDump {
    protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
}

/// A service as dumped.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceDump<'a> {
    name: &'a str,
    namespace: &'a str,
    hostname: &'a str,
    vips: Vec<String>,
    ports: BTreeMap<u16, u16>,
    /// By workload uid: the workloads traffic to the service may go to.
    endpoints: BTreeMap<&'a str, EndpointDump<'a>>,
    subject_alt_names: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    waypoint: Option<GatewayDump>,
    #[serde(skip_serializing_if = "Option::is_none")]
    load_balancer: Option<LoadBalancerDump>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip_families: Option<&'static str>,
    canonical: bool,
    /// `Public` (the default) or `NamespaceLocal`.
    visibility: &'static str,
}

/// One workload behind a service, with the ports it serves the service on.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointDump<'a> {
    workload_uid: &'a str,
    port: BTreeMap<u16, u16>,
    status: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LoadBalancerDump {
    routing_preferences: Vec<&'static str>,
    mode: &'static str,
    health_policy: &'static str,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn or_default<'a>(value: &'a str, default: &'static str) -> &'a str {
    if value.is_empty() {
        default
    } else {
        value
    }
}

/// `network/ip`, or `network/ip/length` for a range.
pub fn network_address(a: &NetworkAddress) -> String {
    match a.length {
        Some(len) => format!("{}/{}/{len}", a.network, a.address),
        None => format!("{}/{}", a.network, a.address),
    }
}

fn gateway(g: &GatewayAddress) -> GatewayDump {
    GatewayDump {
        destination: match &g.destination {
            GatewayDestination::Hostname {
                namespace,
                hostname,
            } => format!("{namespace}/{hostname}"),
            GatewayDestination::Address(a) => network_address(a),
        },
        hbone_mtls_port: g.hbone_mtls_port,
    }
}

fn port_map(ports: &[Port]) -> BTreeMap<u16, u16> {
    ports
        .iter()
        .map(|p| (p.service_port, p.target_port))
        .collect()
}

fn status(s: pb::WorkloadStatus) -> &'static str {
    match s {
        pb::WorkloadStatus::Healthy => "Healthy",
        pb::WorkloadStatus::Unhealthy => "Unhealthy",
    }
}

impl<'a> From<&'a Workload> for WorkloadDump<'a> {
    fn from(w: &'a Workload) -> Self {
        WorkloadDump {
            workload_ips: &w.workload_ips,
            waypoint: w.waypoint.as_ref().map(gateway),
            network_gateway: w.network_gateway.as_ref().map(gateway),
            protocol: match w.protocol {
                pb::TunnelProtocol::None => "TCP",
                pb::TunnelProtocol::Hbone => "HBONE",
                // Upstream's dump predates this value; its proto name is the clearest label.
                pb::TunnelProtocol::LegacyIstioMtls => "LEGACY_ISTIO_MTLS",
            },
            network_mode: match w.network_mode {
                pb::NetworkMode::Standard => "Standard",
                pb::NetworkMode::HostNetwork => "HostNetwork",
            },
            uid: &w.uid,
            name: &w.name,
            namespace: &w.namespace,
            trust_domain: or_default(&w.trust_domain, DEFAULT_TRUST_DOMAIN),
            service_account: or_default(&w.service_account, DEFAULT_SERVICE_ACCOUNT),
            network: &w.network,
            workload_name: &w.workload_name,
            workload_type: w.workload_type.as_str_name().to_ascii_lowercase(),
            canonical_name: &w.canonical_name,
            canonical_revision: &w.canonical_revision,
            hostname: &w.hostname,
            node: &w.node,
            native_tunnel: w.native_tunnel,
            application_tunnel: w.application_tunnel.map(|t| ApplicationTunnelDump {
                protocol: t.protocol.as_str_name(),
                port: (t.port != 0).then_some(t.port),
            }),
            authorization_policies: &w.authorization_policies,
            status: status(w.status),
            cluster_id: or_default(&w.cluster_id, DEFAULT_CLUSTER_ID),
            locality: w
                .locality
                .as_ref()
                .filter(|l| !(l.region.is_empty() && l.zone.is_empty() && l.subzone.is_empty())),
            services: w.services.keys().map(String::as_str).collect(),
            capacity: w.capacity,
        }
    }
}

impl<'a> ServiceDump<'a> {
    /// The service with its endpoints: the workloads selecting it that are healthy, or all of
    /// them under the `ALLOW_ALL` health policy (as upstream fills them).
    pub fn new(s: &'a Service, state: &'a State) -> Self {
        let key = s.key();
        let allow_all = s
            .load_balancing
            .as_ref()
            .is_some_and(|lb| lb.health_policy == load_balancing::HealthPolicy::AllowAll);
        let endpoints = state
            .workloads_of_service(&key)
            .into_iter()
            .filter(|w| allow_all || w.status == pb::WorkloadStatus::Healthy)
            .map(|w| (w.uid.as_str(), EndpointDump::new(w, &key)))
            .collect();
        ServiceDump {
            name: &s.name,
            namespace: &s.namespace,
            hostname: &s.hostname,
            vips: s.vips.iter().map(network_address).collect(),
            ports: port_map(&s.ports),
            endpoints,
            subject_alt_names: &s.subject_alt_names,
            waypoint: s.waypoint.as_ref().map(gateway),
            load_balancer: s.load_balancing.as_ref().map(|lb| LoadBalancerDump {
                routing_preferences: lb.routing_preference.iter().map(scope).collect(),
                mode: match lb.mode {
                    load_balancing::Mode::UnspecifiedMode => "Standard",
                    load_balancing::Mode::Strict => "Strict",
                    load_balancing::Mode::Failover => "Failover",
                    load_balancing::Mode::Passthrough => "Passthrough",
                },
                health_policy: match lb.health_policy {
                    load_balancing::HealthPolicy::OnlyHealthy => "OnlyHealthy",
                    load_balancing::HealthPolicy::AllowAll => "AllowAll",
                },
            }),
            ip_families: match s.ip_families {
                pb::IpFamilies::Automatic => None,
                pb::IpFamilies::Ipv4Only => Some("IPv4"),
                pb::IpFamilies::Ipv6Only => Some("IPv6"),
                pb::IpFamilies::Dual => Some("Dual"),
            },
            canonical: s.canonical,
            visibility: match s.visibility {
                pb::ServiceVisibility::Public => "Public",
                pb::ServiceVisibility::NamespaceLocal => "NamespaceLocal",
            },
        }
    }
}

impl<'a> EndpointDump<'a> {
    /// `w` as an endpoint of the service `key`, with the ports it serves it on.
    pub fn new(w: &'a Workload, key: &str) -> Self {
        let ports = w.services.get(key).map_or(&[][..], Vec::as_slice);
        EndpointDump {
            workload_uid: &w.uid,
            port: port_map(ports),
            status: status(w.status),
        }
    }
}

fn scope(s: &load_balancing::Scope) -> &'static str {
    match s {
        load_balancing::Scope::UnspecifiedScope => "Unspecified",
        load_balancing::Scope::Region => "Region",
        load_balancing::Scope::Zone => "Zone",
        load_balancing::Scope::Subzone => "Subzone",
        load_balancing::Scope::Node => "Node",
        load_balancing::Scope::Cluster => "Cluster",
        load_balancing::Scope::Network => "Network",
    }
}
