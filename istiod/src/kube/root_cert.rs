//! Root certificate distribution: the ConfigMap `istio-ca-root-cert` (key `root-cert.pem`,
//! label `istio.io/config: "true"`) in every namespace but `kube-public`, `kube-node-lease` and
//! `local-path-storage`, as Istio's namespace controller keeps it. Pods mount it to trust
//! istiod. A new namespace gets it, an edited or deleted one is put back, and a new root is
//! written to all of them. Writes are server-side apply patches with field manager `istiod`.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

/// The ConfigMap's name, its data key and its label.
pub const CONFIGMAP: &str = "istio-ca-root-cert";
pub const ROOT_KEY: &str = "root-cert.pem";
pub const CONFIG_LABEL: &str = "istio.io/config";
/// Namespaces that never get it.
pub const EXCLUDED_NAMESPACES: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];
const FIELD_MANAGER: &str = "istiod";

enum Change {
    Namespace(String, bool),
    /// A ConfigMap of ours changed (or went away) in a namespace: check it.
    ConfigMap(String, Option<String>),
    Root,
}

/// Runs until `root` closes: keeps the ConfigMap in every namespace in step with the root.
pub async fn run(client: Client, mut root: watch::Receiver<String>) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let config_maps: Api<ConfigMap> = Api::all(client.clone());
    let ns_events = watcher(namespaces, watcher::Config::default())
        .default_backoff()
        .filter_map(|e| async move {
            match e {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                    n.metadata.name.map(|name| Change::Namespace(name, true))
                }
                Ok(watcher::Event::Delete(n)) => {
                    n.metadata.name.map(|name| Change::Namespace(name, false))
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "namespace watch failed; retrying");
                    None
                }
            }
        });
    let cm_config = watcher::Config::default().fields(&format!("metadata.name={CONFIGMAP}"));
    let cm_events = watcher(config_maps, cm_config)
        .default_backoff()
        .filter_map(|e| async move {
            match e {
                Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                    let data = c.data.as_ref().and_then(|d| d.get(ROOT_KEY).cloned());
                    c.metadata.namespace.map(|ns| Change::ConfigMap(ns, data))
                }
                Ok(watcher::Event::Delete(c)) => {
                    c.metadata.namespace.map(|ns| Change::ConfigMap(ns, None))
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "ConfigMap watch failed; retrying");
                    None
                }
            }
        });
    let mut changes = futures::stream::select(ns_events.boxed(), cm_events.boxed());
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        let change = tokio::select! {
            c = changes.next() => match c { Some(c) => c, None => return },
            r = root.changed() => match r { Ok(()) => Change::Root, Err(_) => return },
        };
        let pem = root.borrow().clone();
        let todo: Vec<String> = match change {
            Change::Namespace(ns, true) => {
                known.insert(ns.clone());
                vec![ns]
            }
            Change::Namespace(ns, false) => {
                known.remove(&ns);
                Vec::new()
            }
            Change::ConfigMap(ns, data)
                if known.contains(&ns) && data.as_deref() != Some(pem.as_str()) =>
            {
                vec![ns]
            }
            Change::ConfigMap(..) => Vec::new(),
            Change::Root => {
                tracing::info!(
                    namespaces = known.len(),
                    "the roots changed; rewriting every {CONFIGMAP}"
                );
                known.iter().cloned().collect()
            }
        };
        for ns in todo
            .into_iter()
            .filter(|n| !EXCLUDED_NAMESPACES.contains(&n.as_str()))
        {
            write(&client, &ns, &pem).await;
        }
    }
}

async fn write(client: &Client, ns: &str, pem: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let desired = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": ns, "labels": {CONFIG_LABEL: "true"}},
        "data": {ROOT_KEY: pem},
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for attempt in 0..3u32 {
        match api.patch(CONFIGMAP, &params, &Patch::Apply(&desired)).await {
            Ok(_) => {
                tracing::debug!(namespace = ns, "root certificate ConfigMap written");
                return;
            }
            Err(e) => {
                tracing::warn!(namespace = ns, attempt, error = %e, "cannot write the root certificate ConfigMap");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}
