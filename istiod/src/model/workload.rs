//! Pod / WorkloadEntry / ServiceEntry endpoint -> `istio.workload.Workload` (docs/compatibility.md, workload discovery).

use std::collections::BTreeMap;
use std::net::IpAddr;

use mesh_api::{label, Namespace, Node, Pod, Service, ServiceEntry, WorkloadEntrySpec};
use mesh_proto::workload::{
    gateway_address, GatewayAddress, Locality, NamespacedHostname, NetworkMode, Port, PortList,
    TunnelProtocol, Workload, WorkloadStatus, WorkloadType,
};

use super::service::{app_protocol, service_hostname, target_port_ref, PortRef};
use super::state::{meta_labels, NO_LABELS};
use super::{ModelConfig, ModelError};

/// HBONE port of waypoints.
pub(crate) const HBONE_PORT: u32 = mesh_capture::HBONE_PORT as u32;

/// Everything a workload's conversion reads besides the object itself. The model fills it
/// from its indexes; tests fill it by hand.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadInputs<'a> {
    pub cfg: &'a ModelConfig,
    pub namespace: Option<&'a Namespace>,
    /// Kubernetes Services of the workload's namespace whose selector selects it.
    pub services: &'a [&'a Service],
    /// ServiceEntries of the workload's namespace whose `workloadSelector` selects it.
    pub service_entries: &'a [&'a ServiceEntry],
    /// Selector-scoped policies that select it, as `ns/name`, sorted.
    pub policies: &'a [String],
    /// The Node a pod runs on (its topology labels give the pod's locality).
    pub node: Option<&'a Node>,
}

impl WorkloadInputs<'_> {
    fn ns_labels(&self) -> &BTreeMap<String, String> {
        self.namespace
            .map(|n| meta_labels(&n.metadata))
            .unwrap_or(&NO_LABELS)
    }
}

/// `<cluster>//Pod/<ns>/<name>`.
pub fn pod_uid(cluster: &str, ns: &str, name: &str) -> String {
    format!("{cluster}//Pod/{ns}/{name}")
}

/// `<cluster>/networking.istio.io/WorkloadEntry/<ns>/<name>`.
pub fn workload_entry_uid(cluster: &str, ns: &str, name: &str) -> String {
    format!("{cluster}/networking.istio.io/WorkloadEntry/{ns}/{name}")
}

/// `<cluster>/networking.istio.io/ServiceEntry/<ns>/<name>/<address>` of an inline endpoint.
pub(crate) fn service_entry_endpoint_uid(
    cluster: &str,
    ns: &str,
    name: &str,
    addr: &str,
) -> String {
    format!("{cluster}/networking.istio.io/ServiceEntry/{ns}/{name}/{addr}")
}

/// Converts a Pod. `Ok(None)` for pods without an IP (Pending) or that have terminated.
pub fn pod_to_workload(
    inp: &WorkloadInputs<'_>,
    pod: &Pod,
) -> Result<Option<Workload>, ModelError> {
    let meta = &pod.metadata;
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let name = meta.name.as_deref().unwrap_or_default();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Ok(None);
    }
    let ips = pod_ips(pod);
    if ips.is_empty() {
        return Ok(None);
    }
    let addresses = parse_ips(&ips, &format!("Pod {ns}/{name}"), "status.podIPs")?;
    let labels = meta_labels(meta);
    let annotations = meta.annotations.as_ref().unwrap_or(&NO_LABELS);
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let (workload_name, workload_type) = workload_name_and_type(pod, name);
    let (canonical_name, canonical_revision) = canonical_service(labels, &workload_name);
    let ambient = ambient_enrolled(labels, annotations, inp.ns_labels(), host_network);
    let native = native_tunnel(labels);
    Ok(Some(Workload {
        uid: pod_uid(&inp.cfg.cluster_id, ns, name),
        name: name.to_string(),
        namespace: ns.to_string(),
        addresses,
        network: network_of(labels, inp.ns_labels(), inp.cfg),
        tunnel_protocol: tunnel(ambient || native) as i32,
        native_tunnel: native,
        trust_domain: inp.cfg.trust_domain.clone(),
        service_account: mesh_api::pod_service_account(pod),
        waypoint: waypoint_from_labels(labels, ns, inp.ns_labels(), &inp.cfg.domain_suffix),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        locality: inp.node.and_then(node_locality),
        canonical_name,
        canonical_revision,
        workload_type: workload_type as i32,
        workload_name,
        services: pod_services(inp, pod),
        authorization_policies: inp.policies.to_vec(),
        status: pod_status(pod) as i32,
        cluster_id: inp.cfg.cluster_id.clone(),
        network_mode: if host_network {
            NetworkMode::HostNetwork
        } else {
            NetworkMode::Standard
        } as i32,
        ..Default::default()
    }))
}

/// Converts a WorkloadEntry (or a ServiceEntry inline endpoint, with `uid` and `services`
/// supplied by the caller). `Ok(None)` when it has no IP address.
pub(crate) fn entry_to_workload(
    inp: &WorkloadInputs<'_>,
    uid: String,
    ns: &str,
    name: &str,
    spec: &WorkloadEntrySpec,
    services: BTreeMap<String, PortList>,
) -> Result<Option<Workload>, ModelError> {
    if spec.address.is_empty() {
        return Ok(None);
    }
    let Ok(ip) = spec.address.parse::<IpAddr>() else {
        // A DNS name: served by hostname, no address to claim.
        return Ok(Some(Workload {
            hostname: spec.address.clone(),
            ..entry_base(inp, uid, ns, name, spec, services)
        }));
    };
    Ok(Some(Workload {
        addresses: vec![ip_bytes(ip)],
        ..entry_base(inp, uid, ns, name, spec, services)
    }))
}

fn entry_base(
    inp: &WorkloadInputs<'_>,
    uid: String,
    ns: &str,
    name: &str,
    spec: &WorkloadEntrySpec,
    services: BTreeMap<String, PortList>,
) -> Workload {
    let labels = &spec.labels;
    let (canonical_name, canonical_revision) = canonical_service(labels, name);
    let network = if spec.network.is_empty() {
        network_of(labels, inp.ns_labels(), inp.cfg)
    } else {
        spec.network.clone()
    };
    let ambient = ambient_enrolled(labels, &NO_LABELS, inp.ns_labels(), false);
    Workload {
        uid,
        name: name.to_string(),
        namespace: ns.to_string(),
        network,
        tunnel_protocol: tunnel(ambient) as i32,
        trust_domain: inp.cfg.trust_domain.clone(),
        service_account: if spec.service_account.is_empty() {
            "default".into()
        } else {
            spec.service_account.clone()
        },
        waypoint: waypoint_from_labels(labels, ns, inp.ns_labels(), &inp.cfg.domain_suffix),
        locality: split_locality(&spec.locality),
        canonical_name,
        canonical_revision,
        workload_type: WorkloadType::Pod as i32,
        workload_name: name.to_string(),
        services,
        authorization_policies: inp.policies.to_vec(),
        status: WorkloadStatus::Healthy as i32,
        cluster_id: inp.cfg.cluster_id.clone(),
        ..Default::default()
    }
}

fn locality(region: &str, zone: &str, subzone: &str) -> Option<Locality> {
    let l = Locality {
        region: region.to_string(),
        zone: zone.to_string(),
        subzone: subzone.to_string(),
    };
    (!(l.region.is_empty() && l.zone.is_empty() && l.subzone.is_empty())).then_some(l)
}

/// A pod's locality: its Node's `topology.kubernetes.io/region`, `topology.kubernetes.io/zone`
/// and `topology.istio.io/subzone` labels (none when all three are missing).
pub(crate) fn node_locality(node: &Node) -> Option<Locality> {
    let labels = meta_labels(&node.metadata);
    let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or_default();
    locality(
        get(label::TOPOLOGY_REGION),
        get(label::TOPOLOGY_ZONE),
        get(label::TOPOLOGY_SUBZONE),
    )
}

/// A WorkloadEntry's `locality`: `region/zone/subzone`, trailing parts optional.
fn split_locality(value: &str) -> Option<Locality> {
    let mut parts = value.splitn(3, '/');
    let mut next = || parts.next().unwrap_or_default();
    let (region, zone, subzone) = (next(), next(), next());
    locality(region, zone, subzone)
}

/// The `services` map of a WorkloadEntry: Services and ServiceEntries that select it.
pub(crate) fn entry_services(
    inp: &WorkloadInputs<'_>,
    entry_ports: &BTreeMap<String, u32>,
) -> BTreeMap<String, PortList> {
    let mut out = BTreeMap::new();
    for svc in inp.services {
        let ports = kube_service_ports(svc, |name| entry_ports.get(name).copied());
        out.insert(service_key(svc, &inp.cfg.domain_suffix), PortList { ports });
    }
    for se in inp.service_entries {
        add_service_entry_ports(&mut out, se, |name| entry_ports.get(name).copied());
    }
    out
}

/// Adds `ns/host` -> ports of each host of `se`; a port's target is the workload's port of the
/// same name, else the entry's targetPort, else the service port.
pub(crate) fn add_service_entry_ports(
    out: &mut BTreeMap<String, PortList>,
    se: &ServiceEntry,
    named: impl Fn(&str) -> Option<u32>,
) {
    let ns = se.metadata.namespace.as_deref().unwrap_or("default");
    let ports: Vec<Port> = se
        .spec
        .ports
        .iter()
        .map(|p| Port {
            service_port: p.number,
            target_port: named(&p.name).or(p.target_port).unwrap_or(p.number),
            app_protocol: app_protocol(p.protocol.as_deref(), &p.name) as i32,
        })
        .collect();
    for host in &se.spec.hosts {
        out.insert(
            format!("{ns}/{host}"),
            PortList {
                ports: ports.clone(),
            },
        );
    }
}

fn service_key(svc: &Service, suffix: &str) -> String {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    format!("{ns}/{}", service_hostname(name, ns, suffix))
}

/// The `services` map of a Pod, keyed `ns/hostname`.
fn pod_services(inp: &WorkloadInputs<'_>, pod: &Pod) -> BTreeMap<String, PortList> {
    let container_port = |name: &str| -> Option<u32> {
        pod.spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u32::try_from(p.container_port).ok())
    };
    let mut out = BTreeMap::new();
    for svc in inp.services {
        let ports = kube_service_ports(svc, container_port);
        out.insert(service_key(svc, &inp.cfg.domain_suffix), PortList { ports });
    }
    for se in inp.service_entries {
        add_service_entry_ports(&mut out, se, |_| None);
    }
    out
}

/// Ports of a Kubernetes Service for one workload: numeric targetPort as is, a named one via
/// `named` (the port is left out when the workload has no port of that name), absent -> port.
fn kube_service_ports(svc: &Service, named: impl Fn(&str) -> Option<u32>) -> Vec<Port> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let mut ports = Vec::new();
    for p in spec.ports.iter().flatten() {
        let Ok(service_port) = u32::try_from(p.port) else {
            continue;
        };
        let target_port = match target_port_ref(p.target_port.as_ref()) {
            PortRef::Absent => service_port,
            PortRef::Number(n) => n,
            PortRef::Name(name) => match named(&name) {
                Some(n) => n,
                None => continue,
            },
        };
        let name = p.name.as_deref().unwrap_or_default();
        ports.push(Port {
            service_port,
            target_port,
            app_protocol: app_protocol(p.app_protocol.as_deref(), name) as i32,
        });
    }
    ports
}

/// `status.podIPs`, else `status.podIP`.
fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let ips: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if !ips.is_empty() {
        return ips;
    }
    status
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
        .into_iter()
        .collect()
}

fn parse_ips(ips: &[String], object: &str, field: &str) -> Result<Vec<Vec<u8>>, ModelError> {
    ips.iter()
        .map(|s| {
            s.parse::<IpAddr>()
                .map(ip_bytes)
                .map_err(|_| ModelError::InvalidAddress {
                    object: object.to_string(),
                    field: field.to_string(),
                    value: s.clone(),
                })
        })
        .collect()
}

/// An IP as wire bytes (4 or 16).
pub(crate) fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Wire bytes back to an IP (for alias keys and debug output).
pub(crate) fn bytes_ip(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(b).ok().map(IpAddr::from),
        _ => None,
    }
}

/// Whether the workload is captured by ztunnel: pod label `istio.io/dataplane-mode=ambient`, or
/// namespace label with the pod label not `none`; sidecar-injected and host-network pods never;
/// `ambient.istio.io/redirection: enabled` (set by the CNI agent) always.
pub(crate) fn ambient_enrolled(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    ns_labels: &BTreeMap<String, String>,
    host_network: bool,
) -> bool {
    if host_network || annotations.contains_key(label::SIDECAR_STATUS) {
        return false;
    }
    if annotations
        .get(label::AMBIENT_REDIRECTION)
        .map(String::as_str)
        == Some("enabled")
    {
        return true;
    }
    match labels.get(label::DATAPLANE_MODE).map(String::as_str) {
        Some(label::DATAPLANE_MODE_AMBIENT) => true,
        Some(label::DATAPLANE_MODE_NONE) => false,
        _ => {
            ns_labels.get(label::DATAPLANE_MODE).map(String::as_str)
                == Some(label::DATAPLANE_MODE_AMBIENT)
        }
    }
}

/// The label with which a pod says its own proxy takes HBONE (a comma-separated list of
/// tunnel protocols; the injector sets `http` for sidecars with `ISTIO_META_ENABLE_HBONE`).
pub const TUNNEL_LABEL: &str = mesh_api::label::TUNNEL;

/// Whether the pod's own proxy (a sidecar) accepts HBONE: its tunnel label lists `http`.
pub(crate) fn native_tunnel(labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels
        .get(TUNNEL_LABEL)
        .is_some_and(|v| v.split(',').any(|p| p.trim() == "http"))
}

fn tunnel(ambient: bool) -> TunnelProtocol {
    if ambient {
        TunnelProtocol::Hbone
    } else {
        TunnelProtocol::None
    }
}

/// `topology.istio.io/network` of the object, else of its namespace, else the configured one.
pub(crate) fn network_of(
    labels: &BTreeMap<String, String>,
    ns_labels: &BTreeMap<String, String>,
    cfg: &ModelConfig,
) -> String {
    labels
        .get(label::NETWORK)
        .or_else(|| ns_labels.get(label::NETWORK))
        .cloned()
        .unwrap_or_else(|| cfg.network.clone())
}

/// `istio.io/use-waypoint` on the object, else on its namespace (`none` opts out): the
/// waypoint's (namespace, name); the namespace comes from `istio.io/use-waypoint-namespace`
/// beside it. A waypoint's own pods and Service (labelled `gateway.networking.k8s.io/gateway-name`)
/// never use one.
pub(crate) fn named_waypoint<'a>(
    labels: &'a BTreeMap<String, String>,
    obj_ns: &'a str,
    ns_labels: &'a BTreeMap<String, String>,
) -> Option<(&'a str, &'a str)> {
    if labels.contains_key(mesh_api::GATEWAY_NAME_LABEL) {
        return None;
    }
    let source = if labels.contains_key(label::USE_WAYPOINT) {
        labels
    } else {
        ns_labels
    };
    let name = source.get(label::USE_WAYPOINT)?;
    if name.is_empty() || name == "none" {
        return None;
    }
    let wp_ns = source
        .get(label::USE_WAYPOINT_NAMESPACE)
        .filter(|n| !n.is_empty())
        .map_or(obj_ns, String::as_str);
    Some((wp_ns, name.as_str()))
}

/// The waypoint address of [`named_waypoint`], as WDS carries it.
pub(crate) fn waypoint_from_labels(
    labels: &BTreeMap<String, String>,
    obj_ns: &str,
    ns_labels: &BTreeMap<String, String>,
    suffix: &str,
) -> Option<GatewayAddress> {
    let (wp_ns, name) = named_waypoint(labels, obj_ns, ns_labels)?;
    Some(GatewayAddress {
        destination: Some(gateway_address::Destination::Hostname(NamespacedHostname {
            namespace: wp_ns.to_string(),
            hostname: service_hostname(name, wp_ns, suffix),
        })),
        hbone_mtls_port: HBONE_PORT,
    })
}

/// Istio's canonical service name and revision label precedence.
pub(crate) fn canonical_service(
    labels: &BTreeMap<String, String>,
    workload_name: &str,
) -> (String, String) {
    let first = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
    let name = first(&[label::CANONICAL_NAME, label::APP_K8S_NAME, label::APP])
        .unwrap_or_else(|| workload_name.to_string());
    let revision = first(&[
        label::CANONICAL_REVISION,
        label::APP_K8S_VERSION,
        label::VERSION,
    ])
    .unwrap_or_else(|| "latest".into());
    (name, revision)
}

/// Workload name and type from the controlling owner reference, as Istio derives them.
fn workload_name_and_type(pod: &Pod, pod_name: &str) -> (String, WorkloadType) {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let Some(owner) = owner else {
        return (pod_name.to_string(), WorkloadType::Pod);
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = meta_labels(&pod.metadata).get("pod-template-hash");
            let deployment = hash
                .filter(|h| !h.is_empty())
                .and_then(|h| owner.name.strip_suffix(&format!("-{h}")));
            match deployment {
                Some(d) => (d.to_string(), WorkloadType::Deployment),
                None => (pod_name.to_string(), WorkloadType::Pod),
            }
        }
        "Job" => match cron_job_name(&owner.name) {
            Some(cron) => (cron.to_string(), WorkloadType::Cronjob),
            None => (owner.name.clone(), WorkloadType::Job),
        },
        _ => (pod_name.to_string(), WorkloadType::Pod),
    }
}

/// A Job named `<cronjob>-<8 to 10 digits>` was created by that CronJob.
fn cron_job_name(job: &str) -> Option<&str> {
    let (base, stamp) = job.rsplit_once('-')?;
    let digits = (8..=10).contains(&stamp.len()) && stamp.bytes().all(|b| b.is_ascii_digit());
    (digits && !base.is_empty()).then_some(base)
}

/// HEALTHY iff Running, not being deleted, and Ready (a Running pod without conditions counts).
fn pod_status(pod: &Pod) -> WorkloadStatus {
    let Some(status) = pod.status.as_ref() else {
        return WorkloadStatus::Unhealthy;
    };
    let running = status.phase.as_deref() == Some("Running");
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let ready = match status.conditions.as_deref() {
        None | Some([]) => true,
        Some(conds) => conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
    };
    if running && ready && !deleting {
        WorkloadStatus::Healthy
    } else {
        WorkloadStatus::Unhealthy
    }
}

#[cfg(test)]
mod tests;
