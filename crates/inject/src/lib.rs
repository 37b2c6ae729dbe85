//! Sidecar injection as Istio's injector does it, for the webhook in istiod (`/inject`) and
//! `istioctl kube-inject`: which pods ([`decide`]), and what a pod gets ([`inject`]): the
//! `istio-proxy` container (`pilot-agent proxy sidecar`, uid 1337), the init step that sets up
//! capture (`istio-init`, or `istio-validation` when cni-node does it), the volumes for the
//! token, root certificate and agent state, the kubelet probes rewritten through the agent, the
//! `sidecar.istio.io/status` annotation and the labels Istio adds. Injection is idempotent: what
//! an earlier injection added (as its status annotation lists) is removed first. Pods annotated
//! `inject.istio.io/templates: gateway` get the gateway template instead (`pilot-agent proxy
//! router`, see the `gateway` module).

pub mod config;
pub mod decide;
mod gateway;
pub mod probes;
pub mod selector;
mod sidecar;

pub use config::{InjectConfig, Policy};
pub use decide::{decide, Decision};
pub use gateway::TEMPLATES_ANNOTATION;
pub use sidecar::{inject, Workload};

use serde_json::Value;

/// Why a pod cannot be injected.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("the pod spec has no containers")]
    NoContainers,
    #[error("{field} is not {expected}")]
    Shape {
        field: &'static str,
        expected: &'static str,
    },
    #[error("annotation {annotation} is {value:?}: {why}")]
    BadAnnotation {
        annotation: String,
        value: String,
        why: String,
    },
}

impl InjectError {
    pub fn reason(&self) -> &'static str {
        match self {
            InjectError::NoContainers => "no_containers",
            InjectError::Shape { .. } => "shape",
            InjectError::BadAnnotation { .. } => "bad_annotation",
        }
    }
}

/// The JSON patch (RFC 6902) from `original` to `injected`, as the webhook answers.
pub fn patch(original: &Value, injected: &Value) -> Value {
    serde_json::to_value(json_patch::diff(original, injected)).unwrap_or(Value::Array(vec![]))
}
