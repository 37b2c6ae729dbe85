//! Service / ServiceEntry -> `istio.workload.Service` (docs/compatibility.md, workload discovery).

use std::collections::BTreeMap;
use std::net::IpAddr;

use mesh_api::{Namespace, Service, ServiceEntry};
use mesh_proto::workload::{AppProtocol, IpFamilies, NetworkAddress, Port, Service as WdsService};

use super::state::{meta_labels, NO_LABELS};
use super::workload::{ip_bytes, waypoint_from_labels};
use super::{ModelConfig, ModelError};

/// `<name>.<ns>.svc.<suffix>`.
pub(crate) fn service_hostname(name: &str, ns: &str, suffix: &str) -> String {
    format!("{name}.{ns}.svc.{suffix}")
}

/// A Service port's `targetPort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PortRef {
    Absent,
    Number(u32),
    Name(String),
}

/// Reads an `IntOrString` without naming k8s-openapi's type (istiod does not depend on it):
/// through its JSON form, which is a number or a string.
pub(crate) fn target_port_ref<T: serde::Serialize>(tp: Option<&T>) -> PortRef {
    match tp.and_then(|t| serde_json::to_value(t).ok()) {
        Some(serde_json::Value::Number(n)) => {
            match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(0) | None => PortRef::Absent,
                Some(n) => PortRef::Number(n),
            }
        }
        Some(serde_json::Value::String(s)) if !s.is_empty() => PortRef::Name(s),
        _ => PortRef::Absent,
    }
}

/// `appProtocol` (or a ServiceEntry's `protocol`), else the port name's prefix before `-`,
/// as Istio's protocol sniffing by name: http, http2/h2c, grpc; anything else is unknown.
pub(crate) fn app_protocol(explicit: Option<&str>, port_name: &str) -> AppProtocol {
    let name_prefix = port_name.split('-').next().unwrap_or_default();
    let raw = explicit.filter(|p| !p.is_empty()).unwrap_or(name_prefix);
    match raw.to_ascii_lowercase().as_str() {
        "http" | "http1" => AppProtocol::Http11,
        "http2" | "h2c" | "kubernetes.io/h2c" => AppProtocol::Http2,
        "grpc" | "grpc-web" => AppProtocol::Grpc,
        _ => AppProtocol::Unknown,
    }
}

/// Converts a Kubernetes Service. Headless services (`clusterIP: None`) have no addresses.
pub fn service_to_service(
    cfg: &ModelConfig,
    namespace: Option<&Namespace>,
    svc: &Service,
) -> Result<WdsService, ModelError> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let labels = meta_labels(&svc.metadata);
    let ns_labels = namespace
        .map(|n| meta_labels(&n.metadata))
        .unwrap_or(&NO_LABELS);
    let spec = svc.spec.clone().unwrap_or_default();
    let ips: Vec<String> = match spec.cluster_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips.to_vec(),
        _ => spec.cluster_ip.clone().into_iter().collect(),
    };
    let mut addresses = Vec::new();
    for ip in ips.iter().filter(|ip| !ip.is_empty() && *ip != "None") {
        let parsed = ip
            .parse::<IpAddr>()
            .map_err(|_| ModelError::InvalidAddress {
                object: format!("Service {ns}/{name}"),
                field: "spec.clusterIPs".into(),
                value: ip.clone(),
            })?;
        addresses.push(NetworkAddress {
            network: cfg.network.clone(),
            address: ip_bytes(parsed),
            length: None,
        });
    }
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            let service_port = u32::try_from(p.port).ok()?;
            let target_port = match target_port_ref(p.target_port.as_ref()) {
                PortRef::Absent => service_port,
                PortRef::Number(n) => n,
                PortRef::Name(_) => 0,
            };
            let pname = p.name.as_deref().unwrap_or_default();
            Some(Port {
                service_port,
                target_port,
                app_protocol: app_protocol(p.app_protocol.as_deref(), pname) as i32,
            })
        })
        .collect();
    Ok(WdsService {
        name: name.to_string(),
        namespace: ns.to_string(),
        hostname: service_hostname(name, ns, &cfg.domain_suffix),
        addresses,
        ports,
        waypoint: waypoint_from_labels(labels, ns, ns_labels, &cfg.domain_suffix),
        ip_families: ip_families(spec.ip_families.as_deref().unwrap_or_default()) as i32,
        ..Default::default()
    })
}

fn ip_families(families: &[String]) -> IpFamilies {
    match families {
        [one] if one == "IPv4" => IpFamilies::Ipv4Only,
        [one] if one == "IPv6" => IpFamilies::Ipv6Only,
        [_, _] => IpFamilies::Dual,
        _ => IpFamilies::Automatic,
    }
}

/// Converts a ServiceEntry into one Service per host. Invalid `spec.addresses` entries are
/// reported and left out; the rest is still served.
pub fn service_entry_to_services(
    cfg: &ModelConfig,
    namespace: Option<&Namespace>,
    se: &ServiceEntry,
) -> (Vec<WdsService>, Vec<ModelError>) {
    let ns = se.metadata.namespace.as_deref().unwrap_or("default");
    let name = se.metadata.name.as_deref().unwrap_or_default();
    let labels = meta_labels(&se.metadata);
    let ns_labels = namespace
        .map(|n| meta_labels(&n.metadata))
        .unwrap_or(&NO_LABELS);
    let mut errors = Vec::new();
    let mut addresses = Vec::new();
    for (i, raw) in se.spec.addresses.iter().enumerate() {
        match parse_network_address(raw, &cfg.network) {
            Some(a) => addresses.push(a),
            None => errors.push(ModelError::InvalidAddress {
                object: format!("ServiceEntry {ns}/{name}"),
                field: format!("spec.addresses[{i}]"),
                value: raw.clone(),
            }),
        }
    }
    let ports: Vec<Port> = se
        .spec
        .ports
        .iter()
        .map(|p| Port {
            service_port: p.number,
            target_port: p.target_port.unwrap_or(0),
            app_protocol: app_protocol(p.protocol.as_deref(), &p.name) as i32,
        })
        .collect();
    let waypoint = waypoint_from_labels(labels, ns, ns_labels, &cfg.domain_suffix);
    let services = se
        .spec
        .hosts
        .iter()
        .map(|host| WdsService {
            name: name.to_string(),
            namespace: ns.to_string(),
            hostname: host.clone(),
            addresses: addresses.clone(),
            ports: ports.clone(),
            subject_alt_names: se.spec.subject_alt_names.clone(),
            waypoint: waypoint.clone(),
            ..Default::default()
        })
        .collect();
    (services, errors)
}

/// An IP (host length) or a CIDR.
fn parse_network_address(raw: &str, network: &str) -> Option<NetworkAddress> {
    if let Ok(ip) = raw.parse::<IpAddr>() {
        return Some(NetworkAddress {
            network: network.to_string(),
            address: ip_bytes(ip),
            length: None,
        });
    }
    let net = raw.parse::<ipnet::IpNet>().ok()?;
    Some(NetworkAddress {
        network: network.to_string(),
        address: ip_bytes(net.network()),
        length: Some(u32::from(net.prefix_len())),
    })
}

/// Selector of a Kubernetes Service (`None` when it selects nothing: no or empty selector).
pub(crate) fn service_selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

/// Selector of a ServiceEntry's `workloadSelector` (`None` when absent).
pub(crate) fn service_entry_selector(se: &ServiceEntry) -> Option<&BTreeMap<String, String>> {
    se.spec.workload_selector.as_ref().map(|s| &s.labels)
}

#[cfg(test)]
mod tests;
