//! Which pods are enrolled in the ambient mesh (docs/compatibility.md, enrollment): a pure function of the
//! Pod, its Namespace and the agent's configuration.
//!
//! Enrolled: pod label `istio.io/dataplane-mode=ambient`, or namespace label
//! `istio.io/dataplane-mode=ambient` and the pod label is not `none` (istio-cni's
//! `enablementSelectors`). Never enrolled: pods in an excluded namespace (`EXCLUDED_NAMESPACES`,
//! default `kube-system` as the chart), host-network pods, pods with a sidecar
//! (`sidecar.istio.io/status` annotation), and terminated pods (phase `Succeeded`/`Failed`).
//! A Namespace the source does not know counts as unlabeled.
//!
//! Per-pod option: annotation `ambient.istio.io/dns-capture: "true"|"false"` overrides the
//! configured DNS capture default (`AMBIENT_DNS_CAPTURE`, default true); another value is
//! ignored. Annotation `ambient.istio.io/bypass-inbound-capture: "true"` leaves the pod's
//! inbound connections uncaptured (outbound and HBONE as usual), as istio-cni.

use std::collections::BTreeSet;

use mesh_api::{label, Namespace, Pod};
use serde::Serialize;

/// Per-pod DNS capture override.
pub const DNS_CAPTURE_ANNOTATION: &str = "ambient.istio.io/dns-capture";
/// Per-pod opt-out of inbound capture.
pub const BYPASS_INBOUND_CAPTURE_ANNOTATION: &str = "ambient.istio.io/bypass-inbound-capture";
/// Namespaces never enrolled unless configured otherwise (the chart's `excludeNamespaces`).
pub const DEFAULT_EXCLUDED_NAMESPACES: &[&str] = &["kube-system"];

/// What selection needs from the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectionConfig {
    /// `AMBIENT_ENABLED`: with ambient off (the cni chart without the ambient profile) the
    /// plugin stays chained but no pod is enrolled.
    pub ambient_enabled: bool,
    pub excluded_namespaces: BTreeSet<String>,
    /// DNS capture for pods without the annotation.
    pub dns_capture: bool,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        SelectionConfig {
            ambient_enabled: true,
            excluded_namespaces: DEFAULT_EXCLUDED_NAMESPACES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            dns_capture: true,
        }
    }
}

/// The verdict for one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Enroll {
        dns_capture: bool,
        bypass_inbound: bool,
    },
    Skip(SkipReason),
}

impl Decision {
    pub fn is_enroll(&self) -> bool {
        matches!(self, Decision::Enroll { .. })
    }
}

/// Why a pod is not enrolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// The agent runs with `AMBIENT_ENABLED=false`.
    AmbientDisabled,
    /// Neither the pod nor its namespace asks for ambient.
    NotSelected,
    /// The pod label is `none`.
    OptedOut,
    /// The pod has a sidecar.
    SidecarInjected,
    HostNetwork,
    ExcludedNamespace,
    /// Phase `Succeeded` or `Failed`.
    Terminated,
}

impl SkipReason {
    /// Short label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::AmbientDisabled => "ambient_disabled",
            SkipReason::NotSelected => "not_selected",
            SkipReason::OptedOut => "opted_out",
            SkipReason::SidecarInjected => "sidecar",
            SkipReason::HostNetwork => "host_network",
            SkipReason::ExcludedNamespace => "excluded_namespace",
            SkipReason::Terminated => "terminated",
        }
    }
}

/// Decides whether `pod` (in `namespace`, if the source has it) is enrolled.
pub fn decide(pod: &Pod, namespace: Option<&Namespace>, config: &SelectionConfig) -> Decision {
    if !config.ambient_enabled {
        return Decision::Skip(SkipReason::AmbientDisabled);
    }
    let meta = &pod.metadata;
    let pod_ns = meta.namespace.as_deref().unwrap_or("default");
    if config.excluded_namespaces.contains(pod_ns) {
        return Decision::Skip(SkipReason::ExcludedNamespace);
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return Decision::Skip(SkipReason::HostNetwork);
    }
    if annotation(pod, label::SIDECAR_STATUS).is_some() {
        return Decision::Skip(SkipReason::SidecarInjected);
    }
    if is_terminated(pod) {
        return Decision::Skip(SkipReason::Terminated);
    }
    let pod_mode = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(label::DATAPLANE_MODE));
    let ns_mode = namespace
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(label::DATAPLANE_MODE));
    let selected = match pod_mode.map(String::as_str) {
        Some(label::DATAPLANE_MODE_AMBIENT) => true,
        Some(label::DATAPLANE_MODE_NONE) => return Decision::Skip(SkipReason::OptedOut),
        _ => ns_mode.map(String::as_str) == Some(label::DATAPLANE_MODE_AMBIENT),
    };
    if !selected {
        return Decision::Skip(SkipReason::NotSelected);
    }
    let dns_capture = match annotation(pod, DNS_CAPTURE_ANNOTATION).map(str::trim) {
        Some("true") => true,
        Some("false") => false,
        _ => config.dns_capture,
    };
    let bypass_inbound =
        annotation(pod, BYPASS_INBOUND_CAPTURE_ANNOTATION).map(str::trim) == Some("true");
    Decision::Enroll {
        dns_capture,
        bypass_inbound,
    }
}

/// Whether the pod's phase is terminal (its netns is gone or going).
pub fn is_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

#[cfg(test)]
mod tests;
