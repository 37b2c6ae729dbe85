//! What the real control plane does after a write, for the objects installers wait on:
//! - **CustomResourceDefinitions** (the apiextensions controllers): a CRD is checked when it is
//!   written (name `<plural>.<group>`, a kind, one storage version); shortly after, its names
//!   are accepted, it gets the `NamesAccepted` and `Established` conditions, and its served
//!   versions are served from then on. Deleting it deletes its objects and stops serving them.
//! - **Rollouts** (the Deployment and DaemonSet controllers with the kubelet), when turned on:
//!   every Deployment or DaemonSet whose `status.observedGeneration` lags its generation gets
//!   the status of a finished rollout (all replicas updated, ready and available; a DaemonSet
//!   is scheduled on every Node object, again whenever Nodes come or go).
//! - **Namespaces** (the namespace controller): deleting one deletes the objects in it, just
//!   after the namespace itself is gone (the real server keeps it `Terminating` until then).

use serde_json::{json, Value};
use std::sync::Arc;

use super::store::{resource_key, ApiStatus, Store, WatchEvent};
use super::{lock, ResourceType, Shared};

/// The resource key of CustomResourceDefinitions.
pub fn crd_key() -> String {
    resource_key("apiextensions.k8s.io", "v1", "customresourcedefinitions")
}

/// Refuses a CRD the real server would refuse (422), naming the field.
pub fn validate_crd(crd: &Value) -> Result<(), ApiStatus> {
    let invalid = |field: &str, why: &str| {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        Err(ApiStatus::new(
            422,
            "Invalid",
            format!("CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {field}: {why}"),
        ))
    };
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    if group.is_empty() {
        return invalid("spec.group", "Required value");
    }
    if plural.is_empty() {
        return invalid("spec.names.plural", "Required value");
    }
    if spec["names"]["kind"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        return invalid("spec.names.kind", "Required value");
    }
    if crd["metadata"]["name"].as_str() != Some(format!("{plural}.{group}").as_str()) {
        return invalid(
            "metadata.name",
            &format!(
                "Invalid value: must be spec.names.plural+\".\"+spec.group ({plural}.{group})"
            ),
        );
    }
    if !matches!(spec["scope"].as_str(), Some("Namespaced" | "Cluster")) {
        return invalid(
            "spec.scope",
            "Unsupported value: must be Namespaced or Cluster",
        );
    }
    let versions = spec["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if versions.is_empty() {
        return invalid("spec.versions", "Required value");
    }
    let storage = versions
        .iter()
        .filter(|v| v["storage"] == json!(true))
        .count();
    if storage != 1 {
        return invalid(
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        );
    }
    Ok(())
}

/// The types an (accepted) CRD serves: one per served version.
fn served_types(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == json!(true))
        .map(|v| ResourceType {
            group: s(&spec["group"]),
            version: s(&v["name"]),
            plural: s(&spec["names"]["plural"]),
            kind: s(&spec["names"]["kind"]),
            namespaced: spec["scope"] == json!("Namespaced"),
            status: !v["subresources"]["status"].is_null(),
            custom: true,
        })
        .collect()
}

/// Runs the controllers until the server stops.
pub async fn run(shared: Arc<Shared>) {
    let mut rx = shared.events.subscribe();
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                // Missed events: catch up on everything that may be waiting.
                let pending: Vec<String> = {
                    let store = lock(&shared.store);
                    store
                        .list(&crd_key(), &Default::default())
                        .iter()
                        .filter(|c| !is_established(c))
                        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
                        .collect()
                };
                for name in pending {
                    let ev = establish(&mut lock(&shared.store), &name);
                    if let Some(ev) = ev {
                        let _ = shared.events.send(ev);
                    }
                }
                if *lock(&shared.rollouts) {
                    roll_out_all(&shared);
                }
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        if ev.resource == crd_key() {
            crd_changed(&shared, &ev).await;
        } else if ev.kind == "DELETED" && ev.resource == resource_key("", "v1", "namespaces") {
            let events = {
                let mut store = lock(&shared.store);
                empty_namespace(&mut store, &ev.object)
            };
            for ev in events {
                let _ = shared.events.send(ev);
            }
        } else if ev.kind != "DELETED" && is_workload(&ev.resource) && *lock(&shared.rollouts) {
            roll_out(&shared, &ev.resource, &ev.namespace, &ev.object);
        } else if ev.kind != "MODIFIED"
            && ev.resource == resource_key("", "v1", "nodes")
            && *lock(&shared.rollouts)
        {
            // DaemonSets follow the nodes.
            roll_out_all(&shared);
        }
    }
}

fn is_workload(key: &str) -> bool {
    key == resource_key("apps", "v1", "deployments")
        || key == resource_key("apps", "v1", "daemonsets")
}

async fn crd_changed(shared: &Arc<Shared>, ev: &WatchEvent) {
    let name = ev.object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if ev.kind == "DELETED" {
        let events = {
            let mut store = lock(&shared.store);
            stop_serving(&mut store, &ev.object)
        };
        for ev in events {
            let _ = shared.events.send(ev);
        }
        return;
    }
    let established = is_established(&ev.object);
    if established
        && ev.kind == "MODIFIED"
        && ev.previous.as_ref().map(|p| &p["spec"]) == Some(&ev.object["spec"])
    {
        return;
    }
    let delay = *lock(&shared.crd_delay);
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let ev = {
            let mut store = lock(&shared.store);
            establish(&mut store, &name)
        };
        if let Some(ev) = ev {
            let _ = shared.events.send(ev);
        }
    });
}

fn is_established(crd: &Value) -> bool {
    crd["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == json!("Established") && c["status"] == json!("True"))
}

/// Accepts the CRD's names, serves its versions and marks it Established.
fn establish(store: &mut Store, name: &str) -> Option<WatchEvent> {
    let key = crd_key();
    let crd = store.get(&key, "", name).ok()?;
    let served = served_types(&crd);
    // Versions the CRD no longer serves stop being served (their objects stay stored, as
    // etcd keeps them, but are unreachable).
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    store.types.retain(|_, t| {
        !(t.custom && t.group == group && t.plural == plural)
            || served.iter().any(|s| s.version == t.version)
    });
    for t in served {
        store.types.insert(t.key(), t);
    }
    let names = &crd["spec"]["names"];
    let storage: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == json!(true))
        .map(|v| v["name"].clone())
        .collect();
    let mut next = crd.clone();
    next["status"] = json!({
        "acceptedNames": names,
        "storedVersions": storage,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": crd["metadata"]["creationTimestamp"]},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": crd["metadata"]["creationTimestamp"]},
        ],
    });
    store.update(&key, "", name, next, true).ok()?.1
}

/// Deletes every object of the CRD's types and stops serving them.
fn stop_serving(store: &mut Store, crd: &Value) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    for t in served_types(crd) {
        let key = t.key();
        for obj in store.list(&key, &Default::default()) {
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            if let Ok((_, ev)) = store.delete(&key, ns, name) {
                events.push(ev);
            }
        }
        store.types.remove(&key);
    }
    events
}

/// Deletes every object in the deleted namespace (the namespace controller's work).
fn empty_namespace(store: &mut Store, namespace: &Value) -> Vec<WatchEvent> {
    let ns = namespace["metadata"]["name"].as_str().unwrap_or_default();
    let selection = super::store::Selection {
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let namespaced: Vec<String> = store
        .types
        .iter()
        .filter(|(_, t)| t.namespaced)
        .map(|(k, _)| k.clone())
        .collect();
    let mut events = Vec::new();
    for key in namespaced {
        for obj in store.list(&key, &selection) {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            if let Ok((_, ev)) = store.delete(&key, ns, name) {
                events.push(ev);
            }
        }
    }
    events
}

/// Finishes the rollout of every Deployment and DaemonSet that lags.
pub fn roll_out_all(shared: &Shared) {
    for key in [
        resource_key("apps", "v1", "deployments"),
        resource_key("apps", "v1", "daemonsets"),
    ] {
        let workloads = lock(&shared.store).list(&key, &Default::default());
        for w in workloads {
            let ns = w["metadata"]["namespace"].as_str().unwrap_or_default();
            roll_out(shared, &key, ns, &w);
        }
    }
}

/// Writes the status of a finished rollout for the workload `object` of type `resource`, if
/// it lags.
fn roll_out(shared: &Shared, resource: &str, ns: &str, object: &Value) {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let mut store = lock(&shared.store);
    let Ok(current) = store.get(resource, ns, name) else {
        return;
    };
    let generation = current["metadata"]["generation"].clone();
    let nodes = store
        .list(&resource_key("", "v1", "nodes"), &Default::default())
        .len();
    let daemonset = resource.ends_with("/daemonsets");
    let settled = current["status"]["observedGeneration"] == generation
        && (!daemonset || current["status"]["desiredNumberScheduled"] == json!(nodes));
    if settled {
        return;
    }
    let mut next = current.clone();
    next["status"] = if resource.ends_with("/deployments") {
        let replicas = current["spec"]["replicas"].as_i64().unwrap_or(1);
        json!({
            "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
            "readyReplicas": replicas, "availableReplicas": replicas,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        })
    } else {
        json!({
            "observedGeneration": generation, "desiredNumberScheduled": nodes,
            "currentNumberScheduled": nodes, "updatedNumberScheduled": nodes,
            "numberReady": nodes, "numberAvailable": nodes, "numberMisscheduled": 0,
        })
    };
    let written = store.update(resource, ns, name, next, true);
    drop(store);
    if let Ok((_, Some(ev))) = written {
        let _ = shared.events.send(ev);
    }
}
