//! `istioctl x precheck` against a cluster, as Istio's: the server's Kubernetes version, the
//! permissions to create what an install writes (SelfSubjectAccessReview), and the versions
//! the Gateway API CRDs serve. Findings are analysis messages (IST0142, IST0141, IST0156).

use std::process::ExitCode;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde_json::Value;

use crate::analyze::message::{codes, Level, Message, Origin};
use crate::cluster::{Cluster, ClusterError};

/// The oldest Kubernetes minor version (1.x) the mesh supports.
pub const MIN_KUBERNETES_MINOR: u32 = 28;

/// What the precheck could not find out.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCheckError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("failed to get the Kubernetes version: {0}")]
    Version(String),
    #[error("access review for {resource}: {source}")]
    Review {
        resource: String,
        #[source]
        source: kube::Error,
    },
}

/// What an install creates: (namespaced, group, resource).
const INSTALL_WRITES: [(bool, &str, &str); 11] = [
    (false, "", "namespaces"),
    (false, "rbac.authorization.k8s.io", "clusterroles"),
    (false, "rbac.authorization.k8s.io", "clusterrolebindings"),
    (false, "apiextensions.k8s.io", "customresourcedefinitions"),
    (true, "rbac.authorization.k8s.io", "roles"),
    (true, "", "serviceaccounts"),
    (true, "", "services"),
    (true, "apps", "deployments"),
    (true, "", "configmaps"),
    (
        false,
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
    ),
    (
        false,
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    ),
];

/// The major and minor version of a `/version` answer (`"28+"` as GKE writes it counts as 28).
pub fn minor_version(major: &str, minor: &str) -> Option<(u32, u32)> {
    let digits = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .ok()
    };
    Some((digits(major)?, digits(minor)?))
}

/// Every check's findings.
pub async fn messages(
    cluster: &mut Cluster,
    istio_namespace: &str,
) -> Result<Vec<Message>, ClusterCheckError> {
    let mut out = Vec::new();
    let info = cluster
        .client()
        .apiserver_version()
        .await
        .map_err(|e| ClusterCheckError::Version(e.to_string()))?;
    match minor_version(&info.major, &info.minor) {
        Some((1, minor)) if minor >= MIN_KUBERNETES_MINOR => {}
        Some((major, _)) if major > 1 => {}
        _ => out.push(codes::UNSUPPORTED_KUBERNETES_VERSION.message(
            Some(Origin::live("Cluster")),
            format!(
                "The Kubernetes Version {:?} is lower than the minimum version: 1.{MIN_KUBERNETES_MINOR}",
                info.git_version
            ),
        )),
    }
    let reviews: Api<SelfSubjectAccessReview> = Api::all(cluster.client().clone());
    for (namespaced, group, resource) in INSTALL_WRITES {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: namespaced.then(|| istio_namespace.to_string()),
                    verb: Some("create".into()),
                    group: Some(group.into()),
                    version: Some("v1".into()),
                    resource: Some(resource.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| ClusterCheckError::Review {
                resource: resource.to_string(),
                source,
            })?;
        let status = answer.status.unwrap_or_default();
        if !status.allowed {
            let reason = status
                .reason
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "permission denied".to_string());
            out.push(codes::INSUFFICIENT_PERMISSIONS.message(
                Some(Origin::live("Cluster")),
                format!("Missing required permission to create resource {resource} ({reason})"),
            ));
        }
    }
    for crd in cluster
        .list("apiextensions.k8s.io/v1", "CustomResourceDefinition", "")
        .await?
    {
        if let Some(m) = gateway_api_version(&crd) {
            out.push(m);
        }
    }
    Ok(out)
}

/// IST0156 for a Gateway API CRD that does not serve the version the mesh reads: `v1` for
/// Gateway, GatewayClass, HTTPRoute and GRPCRoute, `v1beta1` for ReferenceGrant.
pub fn gateway_api_version(crd: &Value) -> Option<Message> {
    let spec = &crd["spec"];
    if spec["group"] != "gateway.networking.k8s.io" {
        return None;
    }
    let needed = match spec["names"]["kind"].as_str()? {
        "Gateway" | "GatewayClass" | "HTTPRoute" | "GRPCRoute" => "v1",
        "ReferenceGrant" => "v1beta1",
        _ => return None,
    };
    let mut served: Vec<&str> = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == true)
        .filter_map(|v| v["name"].as_str())
        .collect();
    if served.contains(&needed) {
        return None;
    }
    served.sort_unstable();
    let has = if served.is_empty() {
        "none".to_string()
    } else {
        served.join(",")
    };
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    Some(codes::UNSUPPORTED_GATEWAY_API_VERSION.message(
        Some(Origin::live(format!("CustomResourceDefinition {name}"))),
        format!("The Gateway API CRD version {has} is lower than the minimum version: {needed}"),
    ))
}

/// Prints the findings as Istio's precheck does and says how it went.
pub fn report(messages: &[Message]) -> ExitCode {
    let shown: Vec<&Message> = messages
        .iter()
        .filter(|m| m.level <= Level::Warning)
        .collect();
    if shown.is_empty() {
        eprintln!("\u{2714} No issues found when checking the cluster. Istio is safe to install or upgrade!\n  To get started, check out https://istio.io/latest/docs/setup/getting-started/.");
        return ExitCode::SUCCESS;
    }
    for m in &shown {
        println!("{m}");
    }
    eprintln!("Error: Issues found when checking the cluster. Istio may not be safe to install or upgrade.\nSee https://istio.io/latest/docs/reference/config/analysis for more information about causes and resolutions.");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn versions_parse_as_the_api_server_writes_them() {
        assert_eq!(minor_version("1", "28"), Some((1, 28)));
        assert_eq!(minor_version("1", "30+"), Some((1, 30)));
        assert_eq!(minor_version("", "30"), None);
    }

    #[test]
    fn gateway_api_crds_must_serve_what_the_mesh_reads() {
        let crd = |kind: &str, versions: &[(&str, bool)]| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|(v, served)| json!({"name": v, "served": served}))
                .collect();
            json!({"metadata": {"name": "x.gateway.networking.k8s.io"},
                   "spec": {"group": "gateway.networking.k8s.io", "names": {"kind": kind},
                            "versions": versions}})
        };
        assert!(
            gateway_api_version(&crd("HTTPRoute", &[("v1", true), ("v1beta1", true)])).is_none()
        );
        let m = gateway_api_version(&crd("HTTPRoute", &[("v1", false), ("v1beta1", true)]))
            .expect("v1 not served");
        assert_eq!(
            m.to_string(),
            "Error [IST0156] (CustomResourceDefinition x.gateway.networking.k8s.io) The Gateway API CRD version v1beta1 is lower than the minimum version: v1"
        );
        assert!(gateway_api_version(&crd("ReferenceGrant", &[("v1beta1", true)])).is_none());
        assert!(gateway_api_version(&crd("TCPRoute", &[("v1alpha2", true)])).is_none());
        let mut other = crd("Gateway", &[]);
        other["spec"]["group"] = json!("example.com");
        assert!(gateway_api_version(&other).is_none());
    }
}
