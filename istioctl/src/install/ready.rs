//! When an installed object counts as ready, and the wait for a component's objects.
//!
//! As Istio's installer: a CRD when it is `Established`, a Namespace when `Active`, a
//! DaemonSet when its controller has seen the current generation and every scheduled pod is
//! updated and ready, a StatefulSet when its replicas are updated. A Deployment is judged from
//! its own status, as `kubectl rollout status` does (the controller has seen the current
//! generation, and updated and ready replicas reach `spec.replicas`), where Istio's installer
//! reads the newest ReplicaSet: the two agree once a rollout has finished.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{object_id, Cluster, ClusterError};

/// The kinds the installer waits for.
pub fn waits_for(kind: &str) -> bool {
    matches!(
        kind,
        "CustomResourceDefinition" | "Namespace" | "Deployment" | "DaemonSet" | "StatefulSet"
    )
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// `None` when `object` is ready, else why not.
pub fn not_ready(object: &Value) -> Option<String> {
    let status = &object["status"];
    let spec = &object["spec"];
    let generation = int(&object["metadata"]["generation"]);
    let observed = || {
        (int(&status["observedGeneration"]) < generation).then(|| {
            format!(
                "the controller has not seen generation {generation} yet (observed {})",
                int(&status["observedGeneration"])
            )
        })
    };
    match object["kind"].as_str().unwrap_or_default() {
        "CustomResourceDefinition" => {
            let established = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True");
            (!established).then(|| "not Established yet".to_string())
        }
        "Namespace" => (status["phase"] != "Active")
            .then(|| format!("phase {}", status["phase"].as_str().unwrap_or("unknown"))),
        "Deployment" => observed().or_else(|| {
            let want = spec["replicas"].as_i64().unwrap_or(1);
            let updated = int(&status["updatedReplicas"]);
            let ready = int(&status["readyReplicas"]);
            (updated < want || ready < want)
                .then(|| format!("{ready} of {want} replicas ready, {updated} updated"))
        }),
        "DaemonSet" => observed().or_else(|| {
            let desired = int(&status["desiredNumberScheduled"]);
            let updated = int(&status["updatedNumberScheduled"]);
            let ready = int(&status["numberReady"]);
            let on_delete = spec["updateStrategy"]["type"] == "OnDelete";
            if on_delete {
                (updated != desired)
                    .then(|| format!("{updated} of {desired} scheduled pods updated"))
            } else if desired == 0 {
                Some("no node runs it yet (0 pods scheduled)".to_string())
            } else {
                (ready < desired || updated != desired).then(|| {
                    format!("{ready} of {desired} scheduled pods ready, {updated} updated")
                })
            }
        }),
        "StatefulSet" => observed().or_else(|| {
            let want = spec["replicas"].as_i64().unwrap_or(1)
                - int(&spec["updateStrategy"]["rollingUpdate"]["partition"]);
            let updated = int(&status["updatedReplicas"]);
            (updated < want).then(|| format!("{updated} of {want} replicas updated"))
        }),
        _ => None,
    }
}

/// One object to wait for: what it is and where.
#[derive(Debug, Clone)]
pub struct Awaited {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl Awaited {
    pub fn id(&self) -> String {
        object_id(&self.kind, &self.namespace, &self.name)
    }
}

/// Why the wait ended without every object ready.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("resources not ready after {}: timed out\n{}", humantime::format_duration(*.timeout), .pending.join("\n"))]
    Timeout {
        timeout: Duration,
        /// `  Kind/ns/name (why)` for each object still not ready.
        pending: Vec<String>,
    },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// How often the objects are read again.
const POLL: Duration = Duration::from_millis(500);

/// Waits until every object is ready, reading them at once and then every half second;
/// `waiting` hears the ids still pending whenever that set changes.
pub async fn wait(
    cluster: &mut Cluster,
    objects: &[Awaited],
    timeout: Duration,
    mut waiting: impl FnMut(&[String]),
) -> Result<(), WaitError> {
    let start = Instant::now();
    let mut last: Vec<String> = Vec::new();
    loop {
        let mut pending = Vec::new();
        for o in objects {
            let found = cluster
                .get(&o.api_version, &o.kind, &o.namespace, &o.name)
                .await?;
            let why = match &found {
                None => Some("not found".to_string()),
                Some(object) => not_ready(object),
            };
            if let Some(why) = why {
                pending.push((o.id(), why));
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = pending.iter().map(|(id, _)| id.clone()).collect();
        if ids != last {
            waiting(&ids);
            last = ids;
        }
        if start.elapsed() >= timeout {
            return Err(WaitError::Timeout {
                timeout,
                pending: pending
                    .into_iter()
                    .map(|(id, why)| format!("  {id} ({why})"))
                    .collect(),
            });
        }
        tokio::time::sleep(POLL.min(timeout.saturating_sub(start.elapsed()))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_deployment_is_ready_once_its_rollout_finished() {
        let mut d = json!({"kind": "Deployment", "metadata": {"generation": 2},
            "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "updatedReplicas": 2, "readyReplicas": 2}});
        assert!(not_ready(&d).is_some_and(|w| w.contains("generation 2")));
        d["status"]["observedGeneration"] = json!(2);
        d["status"]["readyReplicas"] = json!(1);
        assert_eq!(
            not_ready(&d).as_deref(),
            Some("1 of 2 replicas ready, 2 updated")
        );
        d["status"]["readyReplicas"] = json!(2);
        assert_eq!(not_ready(&d), None);
    }

    #[test]
    fn a_daemonset_needs_every_scheduled_pod_and_at_least_one() {
        let mut ds = json!({"kind": "DaemonSet", "metadata": {"generation": 1},
            "spec": {}, "status": {"observedGeneration": 1, "desiredNumberScheduled": 0}});
        assert!(not_ready(&ds).is_some_and(|w| w.contains("0 pods scheduled")));
        ds["status"] = json!({"observedGeneration": 1, "desiredNumberScheduled": 3,
            "updatedNumberScheduled": 3, "numberReady": 2});
        assert_eq!(
            not_ready(&ds).as_deref(),
            Some("2 of 3 scheduled pods ready, 3 updated")
        );
        ds["status"]["numberReady"] = json!(3);
        assert_eq!(not_ready(&ds), None);
        // OnDelete: updated pods are enough.
        ds["spec"]["updateStrategy"]["type"] = json!("OnDelete");
        ds["status"]["numberReady"] = json!(0);
        assert_eq!(not_ready(&ds), None);
    }

    #[test]
    fn a_crd_waits_for_established_and_other_kinds_do_not_wait() {
        let mut crd = json!({"kind": "CustomResourceDefinition", "status": {"conditions": [
            {"type": "NamesAccepted", "status": "True"}]}});
        assert_eq!(not_ready(&crd).as_deref(), Some("not Established yet"));
        if let Some(conditions) = crd["status"]["conditions"].as_array_mut() {
            conditions.push(json!({"type": "Established", "status": "True"}));
        }
        assert_eq!(not_ready(&crd), None);
        assert_eq!(not_ready(&json!({"kind": "ConfigMap"})), None);
        assert!(!waits_for("ConfigMap"));
        assert!(waits_for("DaemonSet"));
    }
}
