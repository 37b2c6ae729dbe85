//! Facts of a Pod that several components read the same way.

use crate::Pod;

/// The pod's `spec.serviceAccountName`, `default` when unset (as the API server defaults it).
pub fn pod_service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}
