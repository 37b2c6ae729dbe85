//! Cluster objects by key, indexed by (kind, namespace), plus the node -> identities index.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use mesh_api::{pod_service_account, Kind, Namespace, Object, ObjectKey, Pod};

/// Labels of nothing, for objects without labels.
pub(crate) static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// (node, namespace, service account) -> number of live pods with that identity on that node.
pub(crate) type NodeIdentities = imbl::OrdMap<(String, String, String), u32>;

/// (namespace, name) -> what the CA needs to know of a pod that calls it.
pub(crate) type PodIndex = imbl::OrdMap<(String, String), Arc<PodFacts>>;

/// The facts of a pod the CA checks a bound service-account token against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub service_account: String,
    /// `spec.nodeName`, once scheduled.
    pub node: Option<String>,
}

/// Every object the model knows, with the indexes the incremental rebuild needs.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Shared with the source that delivered them: one copy of each object in istiod.
    objects: HashMap<ObjectKey, Arc<Object>>,
    by_namespace: HashMap<(Kind, String), BTreeSet<String>>,
    pub node_identities: NodeIdentities,
    pub pods: PodIndex,
}

impl State {
    /// Stores `obj`, returning the object it replaced.
    pub fn insert(&mut self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let key = obj.key();
        self.by_namespace
            .entry((key.kind, key.namespace.clone()))
            .or_default()
            .insert(key.name.clone());
        if let Object::Pod(pod) = &*obj {
            self.add_identity(pod, 1);
            self.pods.insert(
                (key.namespace.clone(), key.name.clone()),
                Arc::new(pod_facts(pod)),
            );
        }
        let old = self.objects.insert(key, obj);
        if let Some(Object::Pod(pod)) = old.as_deref() {
            self.add_identity(pod, -1);
        }
        old
    }

    /// Removes the object with `key`, returning it.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Arc<Object>> {
        let old = self.objects.remove(key)?;
        let index_key = (key.kind, key.namespace.clone());
        if let Some(names) = self.by_namespace.get_mut(&index_key) {
            names.remove(&key.name);
            if names.is_empty() {
                self.by_namespace.remove(&index_key);
            }
        }
        if let Object::Pod(pod) = &*old {
            self.add_identity(pod, -1);
            self.pods.remove(&(key.namespace.clone(), key.name.clone()));
        }
        Some(old)
    }

    /// Every object's key.
    pub fn keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        self.objects.keys().cloned()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Object> {
        self.objects.get(key).map(|o| &**o)
    }

    pub fn namespace(&self, name: &str) -> Option<&Namespace> {
        match self.get(&ObjectKey::new(Kind::Namespace, "", name)) {
            Some(Object::Namespace(ns)) => Some(ns),
            _ => None,
        }
    }

    /// Keys of the objects of `kind` in `namespace`.
    pub fn keys_in(&self, kind: Kind, namespace: &str) -> impl Iterator<Item = ObjectKey> + '_ {
        let ns = namespace.to_string();
        self.by_namespace
            .get(&(kind, ns.clone()))
            .into_iter()
            .flatten()
            .map(move |name| ObjectKey::new(kind, ns.clone(), name.clone()))
    }

    /// Objects of `kind` in `namespace`.
    pub fn objects_in(&self, kind: Kind, namespace: &str) -> impl Iterator<Item = &Object> + '_ {
        self.keys_in(kind, namespace)
            .filter_map(move |key| self.get(&key))
    }

    /// Namespaces that hold at least one object of `kind`.
    pub fn namespaces_with(&self, kind: Kind) -> Vec<String> {
        self.by_namespace
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, ns)| ns.clone())
            .collect()
    }

    /// Whether any object of `kind` exists.
    pub fn any_of(&self, kind: Kind) -> bool {
        self.by_namespace.keys().any(|(k, _)| *k == kind)
    }

    fn add_identity(&mut self, pod: &Pod, delta: i64) {
        let Some(id) = pod_identity(pod) else {
            return;
        };
        let count = i64::from(self.node_identities.get(&id).copied().unwrap_or(0)) + delta;
        if count <= 0 {
            self.node_identities.remove(&id);
        } else {
            self.node_identities
                .insert(id, u32::try_from(count).unwrap_or(u32::MAX));
        }
    }
}

fn pod_facts(pod: &Pod) -> PodFacts {
    let spec = pod.spec.as_ref();
    PodFacts {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        service_account: pod_service_account(pod),
        node: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
    }
}

/// (node, namespace, service account) of a scheduled pod that has not terminated.
fn pod_identity(pod: &Pod) -> Option<(String, String, String)> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    Some((node, ns, pod_service_account(pod)))
}

/// Labels of an object's metadata (empty when it has none).
pub(crate) fn meta_labels(meta: &mesh_api::ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}
