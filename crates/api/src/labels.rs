//! Well-known label and annotation names (Istio's), and label selector matching.

use std::collections::BTreeMap;

/// Label and annotation keys, exactly as Istio spells them.
pub mod label {
    pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
    pub const DATAPLANE_MODE_AMBIENT: &str = "ambient";
    pub const DATAPLANE_MODE_NONE: &str = "none";
    pub const USE_WAYPOINT: &str = "istio.io/use-waypoint";
    pub const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
    pub const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
    pub const ISTIO_INJECTION: &str = "istio-injection";
    pub const SIDECAR_INJECT: &str = "sidecar.istio.io/inject";
    pub const SIDECAR_STATUS: &str = "sidecar.istio.io/status";
    pub const REV: &str = "istio.io/rev";
    pub const AMBIENT_REDIRECTION: &str = "ambient.istio.io/redirection";
    /// The tunnel protocols a pod's own proxy accepts (`http`: HBONE), set by the injector.
    pub const TUNNEL: &str = "networking.istio.io/tunnel";
    pub const CANONICAL_NAME: &str = "service.istio.io/canonical-name";
    pub const CANONICAL_REVISION: &str = "service.istio.io/canonical-revision";
    pub const APP_K8S_NAME: &str = "app.kubernetes.io/name";
    pub const APP_K8S_VERSION: &str = "app.kubernetes.io/version";
    pub const APP: &str = "app";
    pub const VERSION: &str = "version";
    pub const TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
    pub const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
    pub const TOPOLOGY_SUBZONE: &str = "topology.istio.io/subzone";
    pub const NETWORK: &str = "topology.istio.io/network";
}

/// Equality-based selector match: every selector entry must be present with the same value.
/// An empty selector matches everything.
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}
