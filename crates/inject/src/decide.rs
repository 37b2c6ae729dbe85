//! Which pods get a sidecar, as Istio's webhook decides once the webhook's selectors have let
//! the pod through: never host-network pods or pods of the system namespaces; the pod's
//! `sidecar.istio.io/inject` label (or, without it, the annotation of that name) says `true`
//! (or `y`, `yes`, `on`, in any case) or anything else (`false`); saying nothing follows the
//! injector's `neverInjectSelector` (a match skips), then its `alwaysInjectSelector` (a match
//! injects), then the policy.

use serde_json::Value;

use crate::config::{InjectConfig, Policy};
use crate::selector::any_matches;

/// Namespaces whose pods are never injected.
pub const IGNORED_NAMESPACES: [&str; 4] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "local-path-storage",
];

/// The decision, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Inject,
    Skip(String),
}

/// Whether the pod (`metadata` and `spec`) in `namespace` is injected under `cfg`'s policy and
/// selectors.
pub fn decide(pod: &Value, namespace: &str, cfg: &InjectConfig) -> Decision {
    let policy = cfg.policy;
    if pod["spec"]["hostNetwork"] == Value::Bool(true) {
        return Decision::Skip("the pod uses the host network".into());
    }
    if IGNORED_NAMESPACES.contains(&namespace) {
        return Decision::Skip(format!("namespace {namespace} is never injected"));
    }
    let key = mesh_api::label::SIDECAR_INJECT;
    let said = pod["metadata"]["labels"][key]
        .as_str()
        .or_else(|| pod["metadata"]["annotations"][key].as_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    // As Istio reads it: y, yes, true or on inject; any other value does not; none (or an
    // empty one) leaves it to the policy.
    if said.is_empty() {
        let labels = &pod["metadata"]["labels"];
        if any_matches(&cfg.never_inject, labels) {
            return Decision::Skip(
                "the pod's labels match the injector's neverInjectSelector".into(),
            );
        }
        if any_matches(&cfg.always_inject, labels) {
            return Decision::Inject;
        }
    }
    match (said.as_str(), policy) {
        ("y" | "yes" | "true" | "on", _) => Decision::Inject,
        ("", Policy::Enabled) => Decision::Inject,
        ("", Policy::Disabled) => Decision::Skip(format!(
            "the injection policy is disabled and the pod does not set {key}: \"true\""
        )),
        (other, _) => Decision::Skip(format!("{key} is {other:?}")),
    }
}
