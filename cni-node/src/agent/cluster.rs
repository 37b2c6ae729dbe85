//! The agent's view of the cluster source: Pods by namespace/name and Namespaces by name,
//! with a change counter the CNI ADD path waits on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mesh_api::{Namespace, Pod};
use tokio::sync::watch;

/// `(namespace, name)` of a pod.
pub(crate) type PodKey = (String, String);

#[derive(Default)]
struct Objects {
    pods: HashMap<PodKey, Arc<Pod>>,
    namespaces: HashMap<String, Arc<Namespace>>,
}

pub(crate) struct ClusterView {
    objects: Mutex<Objects>,
    changed: watch::Sender<u64>,
}

impl ClusterView {
    pub(crate) fn new() -> ClusterView {
        ClusterView {
            objects: Mutex::new(Objects::default()),
            changed: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|c| *c += 1);
    }

    pub(crate) fn upsert_pod(&self, key: PodKey, pod: Arc<Pod>) {
        self.lock().pods.insert(key, pod);
        self.bump();
    }

    pub(crate) fn remove_pod(&self, key: &PodKey) {
        self.lock().pods.remove(key);
        self.bump();
    }

    pub(crate) fn upsert_namespace(&self, name: String, ns: Arc<Namespace>) {
        self.lock().namespaces.insert(name, ns);
        self.bump();
    }

    pub(crate) fn remove_namespace(&self, name: &str) {
        self.lock().namespaces.remove(name);
        self.bump();
    }

    pub(crate) fn pod(&self, key: &PodKey) -> Option<Arc<Pod>> {
        self.lock().pods.get(key).cloned()
    }

    pub(crate) fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.lock().namespaces.get(name).cloned()
    }

    /// Keys of pods in `namespace`.
    pub(crate) fn pods_in(&self, namespace: &str) -> Vec<PodKey> {
        self.lock()
            .pods
            .keys()
            .filter(|(ns, _)| ns == namespace)
            .cloned()
            .collect()
    }

    /// Keys of every pod known.
    pub(crate) fn pod_keys(&self) -> Vec<PodKey> {
        self.lock().pods.keys().cloned().collect()
    }

    /// Keys of pods scheduled on `node`.
    pub(crate) fn pods_on(&self, node: &str) -> Vec<PodKey> {
        self.lock()
            .pods
            .iter()
            .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Waits up to `timeout` for the pod to be known (with `uid`, when both the caller and
    /// the source have one).
    pub(crate) async fn wait_pod(
        &self,
        key: &PodKey,
        uid: Option<&str>,
        timeout: Duration,
    ) -> Option<Arc<Pod>> {
        let mut changed = self.changed.subscribe();
        let found = || {
            self.pod(key).filter(|pod| {
                match (uid, pod.metadata.uid.as_deref().filter(|u| !u.is_empty())) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                }
            })
        };
        let wait = async {
            loop {
                if let Some(pod) = found() {
                    return Some(pod);
                }
                if changed.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}
