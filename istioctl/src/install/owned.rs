//! The objects an install owns, found by their labels: what pruning after an install and
//! `istioctl uninstall` list and delete, kind by kind in Istio's order.

use mesh_charts::manifest::{owner_labels, Component, COMPONENT_LABEL, NOT_PRUNED_LABEL};
use serde_json::Value;

use crate::cluster::{Cluster, ClusterError};

/// Namespaced kinds, in the order they are deleted. Istio's list, plus the NetworkPolicy and
/// ResourceQuota the charts here can render, so an uninstall leaves none of them behind.
pub const NAMESPACED_KINDS: [(&str, &str); 14] = [
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Pod"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("policy/v1", "PodDisruptionBudget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("networking.istio.io/v1alpha3", "EnvoyFilter"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("v1", "ResourceQuota"),
];

/// Cluster-scoped kinds, deleted after the namespaced ones.
pub const CLUSTER_KINDS: [(&str, &str); 4] = [
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
    ),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
];

/// Removed only by `uninstall --purge`: the CRDs (and with them every user's Istio object).
pub const PURGE_KINDS: [(&str, &str); 2] = [
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition"),
];

/// One owned object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owned {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Its `operator.istio.io/component` label.
    pub component: String,
}

impl Owned {
    fn from_value(api_version: &str, kind: &str, object: &Value) -> Owned {
        let meta = &object["metadata"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Owned {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: s(&meta["namespace"]),
            name: s(&meta["name"]),
            component: s(&meta["labels"][COMPONENT_LABEL]),
        }
    }

    /// `Kind/name.namespace` (or `Kind/name`), as the removal lines name objects.
    pub fn removed_name(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.kind, self.name)
        } else {
            format!("{}/{}.{}", self.kind, self.name, self.namespace)
        }
    }
}

/// The selector of what an install by this istioctl for `revision` owns: its owner labels and
/// some component.
pub fn install_selector(revision: &str) -> String {
    let mut parts: Vec<String> = owner_labels(None, revision)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    parts.push(COMPONENT_LABEL.to_string());
    parts.join(",")
}

/// Lists the objects of `kinds` that match `selector`, in the order of `kinds`; objects
/// labelled not to be pruned are left out.
pub async fn find(
    cluster: &mut Cluster,
    kinds: &[(&str, &str)],
    selector: &str,
) -> Result<Vec<Owned>, ClusterError> {
    let mut found = Vec::new();
    for (api_version, kind) in kinds {
        let mut of_kind: Vec<Owned> = cluster
            .list(api_version, kind, selector)
            .await?
            .iter()
            .filter(|o| o["metadata"]["labels"][NOT_PRUNED_LABEL] != "true")
            .map(|o| Owned::from_value(api_version, kind, o))
            .collect();
        of_kind.sort();
        found.extend(of_kind);
    }
    Ok(found)
}

/// Whether `component` names one of the components this istioctl installs.
pub fn ours(component: &str) -> bool {
    Component::from_name(component).is_some()
}

/// Deletes each object in order, printing `  Removed ...` for each (or, in a dry run, what
/// would go).
pub async fn delete(
    cluster: &mut Cluster,
    objects: &[Owned],
    dry_run: bool,
) -> Result<(), ClusterError> {
    for o in objects {
        if dry_run {
            println!(
                "Not pruning object {} because of dry run.",
                o.removed_name()
            );
            continue;
        }
        if cluster
            .delete(&o.api_version, &o.kind, &o.namespace, &o.name)
            .await?
        {
            println!("  Removed {}.", o.removed_name());
        } else {
            println!(
                "object: {} is not being deleted because it no longer exists",
                o.removed_name()
            );
        }
    }
    Ok(())
}
