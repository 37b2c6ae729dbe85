//! Sidecar capture for injected pods (istio-cni's sidecar path): when the injector chose
//! `istio-validation` over `istio-init` because cni-node runs on the node, the CNI ADD writes
//! the pod's `istio-iptables` rules instead, from the pod's `traffic.sidecar.istio.io/*`
//! annotations and its `istio-proxy` container, before any container starts.
//!
//! A pod gets them when it has the `sidecar.istio.io/status` annotation, an `istio-proxy`
//! container (regular or native sidecar) running `proxy sidecar`, no `istio-init` init
//! container (the init step writes them itself), no `DISABLE_ENVOY=true`, and no
//! `sidecar.istio.io/inject` saying false (the label wins over the annotation).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use mesh_api::k8s_openapi::api::core::v1::{Container, Pod};
use mesh_api::label;
use mesh_capture::netns::{run_in, EnterError};
use mesh_sidecar_capture::config::{self, CaptureConfig, ConfigError, PROXY_UID};
use mesh_sidecar_capture::CaptureError;

pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
pub const REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
pub const KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";

pub const STATUS_PORT_ANNOTATION: &str = "status.sidecar.istio.io/port";

/// The agent's own ports, never captured inbound (istio-cni adds them to the pod's list).
const AGENT_PORTS: [u16; 3] = [15020, 15021, 15090];
/// The status port, never captured outbound by default.
const STATUS_PORT: &str = "15020";

/// Why a pod gets no sidecar capture from cni-node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    NotInjected,
    InitContainer,
    NoProxy,
    NotSidecar,
    EnvoyDisabled,
    InjectionOff,
    /// `sidecar.istio.io/interceptionMode: NONE`: the pod asked for no capture.
    InterceptionNone,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotInjected => "not_injected",
            Skip::InitContainer => "istio_init_present",
            Skip::NoProxy => "no_istio_proxy",
            Skip::NotSidecar => "proxy_not_sidecar",
            Skip::EnvoyDisabled => "envoy_disabled",
            Skip::InjectionOff => "injection_off",
            Skip::InterceptionNone => "interception_none",
        }
    }
}

/// A pod's annotation that cannot be applied; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SidecarError {
    #[error("annotation {annotation}: {source}")]
    Annotation {
        annotation: &'static str,
        #[source]
        source: ConfigError,
    },
    #[error("{0} is set but rerouting virtual interfaces is not supported")]
    VirtualInterfaces(&'static str),
}

/// What cni-node writes for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidecarCapture {
    pub config: CaptureConfig,
    /// The proxy asks for DNS capture (`ISTIO_META_DNS_CAPTURE`), which is not written: the
    /// agent has no DNS proxy, and the pod's DNS keeps working uncaptured.
    pub dns_requested: bool,
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn pod_label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn env<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "y" | "yes" | "true" | "on"
    )
}

/// Whether cni-node writes `pod`'s sidecar capture, and with which settings. `ips` are the
/// pod's addresses (an IPv6 one adds the IPv6 rules).
pub fn decide(pod: &Pod, ips: &[IpAddr]) -> Result<Result<SidecarCapture, Skip>, SidecarError> {
    if annotation(pod, label::SIDECAR_STATUS).is_none() {
        return Ok(Err(Skip::NotInjected));
    }
    let spec = pod.spec.as_ref();
    let inits = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    if inits.iter().any(|c| c.name == "istio-init") {
        return Ok(Err(Skip::InitContainer));
    }
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let Some(proxy) = containers
        .iter()
        .chain(inits)
        .find(|c| c.name == "istio-proxy")
    else {
        return Ok(Err(Skip::NoProxy));
    };
    if env(proxy, "DISABLE_ENVOY").is_some_and(truthy) {
        return Ok(Err(Skip::EnvoyDisabled));
    }
    let args = proxy.args.as_deref().unwrap_or_default();
    if args.first().map(String::as_str) == Some("proxy")
        && args.get(1).is_some_and(|kind| kind != "sidecar")
    {
        return Ok(Err(Skip::NotSidecar));
    }
    let inject = pod_label(pod, label::SIDECAR_INJECT).or(annotation(pod, label::SIDECAR_INJECT));
    if inject.is_some_and(|v| !truthy(v)) {
        return Ok(Err(Skip::InjectionOff));
    }
    let mode = annotation(pod, INTERCEPTION_MODE).unwrap_or("REDIRECT");
    if mode.trim() == "NONE" {
        return Ok(Err(Skip::InterceptionNone));
    }
    for key in [REROUTE_VIRTUAL_INTERFACES, KUBEVIRT_INTERFACES] {
        if annotation(pod, key).is_some_and(|v| !v.trim().is_empty()) {
            return Err(SidecarError::VirtualInterfaces(key));
        }
    }
    let read = |key: &'static str, default: &'static str| annotation(pod, key).unwrap_or(default);
    let at = |annotation: &'static str| {
        move |source: ConfigError| SidecarError::Annotation { annotation, source }
    };
    let mut exclude_inbound = config::parse_ports(read(EXCLUDE_INBOUND_PORTS, STATUS_PORT))
        .map_err(at(EXCLUDE_INBOUND_PORTS))?;
    // A custom status port is the agent's too (the injector excludes it from `istio-init`).
    let status_port = match annotation(pod, STATUS_PORT_ANNOTATION).map(str::trim) {
        None | Some("0") => Vec::new(),
        Some(port) => config::parse_ports(port).map_err(at(STATUS_PORT_ANNOTATION))?,
    };
    let mut seen: BTreeSet<u16> = exclude_inbound.iter().copied().collect();
    exclude_inbound.extend(
        AGENT_PORTS
            .iter()
            .chain(&status_port)
            .filter(|p| seen.insert(**p)),
    );
    let security = proxy.security_context.as_ref();
    let uid = security
        .and_then(|s| s.run_as_user)
        .and_then(|u| u32::try_from(u).ok())
        .unwrap_or(PROXY_UID);
    let gid = security
        .and_then(|s| s.run_as_group)
        .and_then(|g| u32::try_from(g).ok())
        .unwrap_or(uid);
    let cfg = CaptureConfig {
        proxy_uids: vec![uid],
        proxy_gids: vec![gid],
        mode: mode.parse().map_err(at(INTERCEPTION_MODE))?,
        include_outbound_cidrs: config::parse_cidr_selection(read(INCLUDE_OUTBOUND_IP_RANGES, "*"))
            .map_err(at(INCLUDE_OUTBOUND_IP_RANGES))?,
        exclude_outbound_cidrs: config::parse_exclude_cidrs(
            read(EXCLUDE_OUTBOUND_IP_RANGES, ""),
            EXCLUDE_OUTBOUND_IP_RANGES,
        )
        .map_err(at(EXCLUDE_OUTBOUND_IP_RANGES))?,
        include_inbound_ports: config::parse_port_selection(read(INCLUDE_INBOUND_PORTS, "*"))
            .map_err(at(INCLUDE_INBOUND_PORTS))?,
        exclude_inbound_ports: exclude_inbound,
        include_outbound_ports: config::parse_ports(read(INCLUDE_OUTBOUND_PORTS, ""))
            .map_err(at(INCLUDE_OUTBOUND_PORTS))?,
        exclude_outbound_ports: config::parse_ports(read(EXCLUDE_OUTBOUND_PORTS, STATUS_PORT))
            .map_err(at(EXCLUDE_OUTBOUND_PORTS))?,
        exclude_interfaces: config::parse_interfaces(read(EXCLUDE_INTERFACES, ""))
            .map_err(at(EXCLUDE_INTERFACES))?,
        ipv6: ips.iter().any(|ip| ip.to_canonical().is_ipv6())
            || env(proxy, "ISTIO_DUAL_STACK").is_some_and(truthy),
        ..CaptureConfig::default()
    };
    Ok(Ok(SidecarCapture {
        config: cfg,
        dns_requested: env(proxy, "ISTIO_META_DNS_CAPTURE").is_some_and(truthy),
    }))
}

/// Why the rules could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Netns(#[from] EnterError),
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

impl ApplyError {
    pub fn reason(&self) -> &'static str {
        match self {
            ApplyError::Netns(e) => e.reason(),
            ApplyError::Capture(e) => e.reason(),
        }
    }
}

/// Writes `cfg`'s rules in the network namespace at `netns` (blocking: netlink in the pod's
/// namespace). Returns the number of rules.
pub fn apply(netns: &Path, cfg: &CaptureConfig) -> Result<usize, ApplyError> {
    Ok(run_in(netns, || mesh_sidecar_capture::apply(cfg))??)
}

#[cfg(test)]
mod tests;
