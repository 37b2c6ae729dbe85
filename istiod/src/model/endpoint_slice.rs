//! EndpointSlice -> workloads, for endpoints that are not pods (docs/compatibility.md, workload
//! discovery): a Service without a selector whose endpoints someone wrote by hand (or another
//! controller did), as Istio's ambient index turns them into workloads.
//!
//! - The slice must be for a Service (label `kubernetes.io/service-name`) that exists in its
//!   namespace, and of address type IPv4 or IPv6 (FQDN is not supported).
//! - Its ports are matched to the Service's by name: service port -> the slice's port. Only TCP
//!   ports count.
//! - Each endpoint without a Pod `targetRef` becomes one workload with the uid
//!   `<cluster>/discovery.k8s.io/EndpointSlice/<ns>/<slice>/<first address>`. Its network mode
//!   is host network: the address is opaque and may be shared, so it claims no IP. It has no
//!   service account, waypoint or policies, and is unhealthy when `conditions.ready` is false.
//! - Endpoints that are pods are skipped, since the pods give those workloads.
//! - An address that does not parse drops its endpoint, and the error names it. A repeated first
//!   address in one slice is ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use mesh_api::{EndpointSlice, Service};
use mesh_proto::workload::{NetworkMode, Port, PortList, Workload, WorkloadStatus};

use super::service::service_hostname;
use super::workload::ip_bytes;
use super::{ModelConfig, ModelError};

/// The label naming a slice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Service a slice belongs to, by its label.
pub(crate) fn slice_service(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// The workloads of `slice`, whose Service is `svc`, and the problems found.
pub fn slice_to_workloads(
    cfg: &ModelConfig,
    svc: &Service,
    slice: &EndpointSlice,
) -> (Vec<Workload>, Vec<ModelError>) {
    let ns = slice.metadata.namespace.as_deref().unwrap_or("default");
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let mut errors = Vec::new();
    if slice.address_type == "FQDN" {
        return (Vec::new(), errors);
    }
    let Some(svc_name) = slice_service(slice) else {
        return (Vec::new(), errors);
    };
    let service_key = format!(
        "{ns}/{}",
        service_hostname(svc_name, ns, &cfg.domain_suffix)
    );
    let service_ports: BTreeMap<&str, u32> = svc
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|p| {
            let port = u32::try_from(p.port).ok()?;
            Some((p.name.as_deref().unwrap_or_default(), port))
        })
        .collect();
    let ports: Vec<Port> = slice
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref() == Some("TCP"))
        .filter_map(|p| {
            let target = u32::try_from(p.port?).ok()?;
            let service_port = *service_ports.get(p.name.as_deref()?)?;
            Some(Port {
                service_port,
                target_port: target,
                ..Port::default()
            })
        })
        .collect();
    let services = BTreeMap::from([(service_key, PortList { ports })]);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for ep in &slice.endpoints {
        if ep.target_ref.as_ref().and_then(|r| r.kind.as_deref()) == Some("Pod") {
            continue;
        }
        let Some(first) = ep.addresses.first() else {
            continue;
        };
        let mut addresses = Vec::with_capacity(ep.addresses.len());
        for a in &ep.addresses {
            match a.parse::<IpAddr>() {
                Ok(ip) => addresses.push(ip_bytes(ip)),
                Err(_) => errors.push(ModelError::InvalidAddress {
                    object: format!("EndpointSlice {ns}/{name}"),
                    field: "endpoints[].addresses".into(),
                    value: a.clone(),
                }),
            }
        }
        if addresses.len() != ep.addresses.len() || !seen.insert(first.clone()) {
            continue;
        }
        let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        out.push(Workload {
            uid: format!(
                "{}/discovery.k8s.io/EndpointSlice/{ns}/{name}/{first}",
                cfg.cluster_id
            ),
            name: name.to_string(),
            namespace: ns.to_string(),
            addresses,
            network: cfg.network.clone(),
            trust_domain: cfg.trust_domain.clone(),
            services: services.clone(),
            status: if ready {
                WorkloadStatus::Healthy
            } else {
                WorkloadStatus::Unhealthy
            } as i32,
            cluster_id: cfg.cluster_id.clone(),
            network_mode: NetworkMode::HostNetwork as i32,
            ..Default::default()
        });
    }
    (out, errors)
}

#[cfg(test)]
mod tests;
