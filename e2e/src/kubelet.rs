//! The harness as kubelet (and ReplicaSet controller) for the Deployments a controller writes
//! into the objects directory: each proxy Deployment (image `<hub>/proxyv2:<tag>`) gets one pod
//! in a network namespace, its `istio-proxy` container started as `pilot-agent` from the
//! container spec ([`Waypoint::from_container`]), its readiness probe polled, and the
//! Deployment's status (`readyReplicas`) written back through the status store. A changed pod
//! template replaces the pod; a deleted Deployment deletes it.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mesh_api::{Deployment, Kind, Object, ObjectKey};
use mesh_source::{load_directory, DirectoryWriter};
use mesh_testutil::http_request;

use crate::cluster::{MeshCluster, PodSpec};
use crate::waypoint::Waypoint;

struct Running {
    template_hash: String,
    pod: String,
    proxy: Waypoint,
    ready: Option<bool>,
}

/// Runs the pods of proxy Deployments on one node of a [`MeshCluster`].
pub struct Kubelet {
    node: String,
    extra_env: Vec<(String, String)>,
    running: BTreeMap<ObjectKey, Running>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("node", &self.node)
            .field("running", &self.running.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn is_proxy(d: &Deployment) -> bool {
    let containers = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    containers.iter().any(|c| {
        c.name == "istio-proxy" && c.image.as_deref().is_some_and(|i| i.contains("/proxyv2:"))
    })
}

/// A short stable hash of the pod template (as Kubernetes' `pod-template-hash`).
fn template_hash(d: &Deployment) -> String {
    let text = serde_json::to_string(&d.spec.as_ref().map(|s| &s.template)).unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    format!("{:x}", h.finish())[..9].to_string()
}

impl Kubelet {
    /// A kubelet for `node`; `extra_env` is added to every proxy container (test settings).
    pub fn new(node: &str, extra_env: &[(&str, &str)]) -> Kubelet {
        Kubelet {
            node: node.into(),
            extra_env: extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            running: BTreeMap::new(),
        }
    }

    /// One pass: start, replace or delete pods to match the Deployments, then report readiness.
    pub fn sync(&mut self, c: &mut MeshCluster) {
        let (objects, _) = load_directory(c.objects().path());
        let deployments: BTreeMap<ObjectKey, Deployment> = objects
            .into_iter()
            .filter_map(|(_, o)| match &*o {
                Object::Deployment(d) if is_proxy(d) => Some((o.key(), (**d).clone())),
                _ => None,
            })
            .collect();
        let gone: Vec<ObjectKey> = (self.running.keys())
            .filter(|k| !deployments.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.stop(c, &key);
        }
        for (key, d) in &deployments {
            let hash = template_hash(d);
            if self
                .running
                .get(key)
                .is_some_and(|r| r.template_hash != hash)
            {
                self.stop(c, key);
            }
            if !self.running.contains_key(key) {
                self.start(c, key, d, hash);
            }
        }
        let writer = DirectoryWriter::new(c.objects().path(), "kubelet");
        for (key, running) in &mut self.running {
            let ready = probe_ready(&running.proxy);
            if running.ready != Some(ready) {
                let n = i32::from(ready);
                let status = serde_json::json!({
                    "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                    "readyReplicas": n, "availableReplicas": n,
                });
                writer
                    .write_status(key, Some(&status))
                    .expect("deployment status");
                running.ready = Some(ready);
            }
        }
    }

    /// Syncs every 200 ms until `done` holds (panics with the proxies' logs after `limit`).
    pub fn run_until(
        &mut self,
        c: &mut MeshCluster,
        limit: Duration,
        mut done: impl FnMut(&MeshCluster) -> bool,
    ) {
        let start = Instant::now();
        loop {
            self.sync(c);
            if done(c) {
                return;
            }
            if start.elapsed() > limit {
                let logs: String = (self.running.values())
                    .map(|r| format!("--- {}\n{}", r.pod, r.proxy.log()))
                    .collect();
                panic!(
                    "not done after {limit:?}; kubelet {self:?}\n{logs}\n{}",
                    c.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The proxy of Deployment `namespace/name`.
    pub fn proxy(&self, namespace: &str, name: &str) -> &Waypoint {
        let key = ObjectKey::new(Kind::Deployment, namespace, name);
        &self
            .running
            .get(&key)
            .unwrap_or_else(|| panic!("no pod for {key}"))
            .proxy
    }

    /// Takes the proxy of Deployment `namespace/name` out of the kubelet's hands (to stop it).
    pub fn take_proxy(&mut self, namespace: &str, name: &str) -> Waypoint {
        let key = ObjectKey::new(Kind::Deployment, namespace, name);
        self.running
            .remove(&key)
            .unwrap_or_else(|| panic!("no pod for {key}"))
            .proxy
    }

    /// The pod name running Deployment `namespace/name`.
    pub fn pod_name(&self, namespace: &str, name: &str) -> Option<String> {
        let key = ObjectKey::new(Kind::Deployment, namespace, name);
        self.running.get(&key).map(|r| r.pod.clone())
    }

    fn start(&mut self, c: &mut MeshCluster, key: &ObjectKey, d: &Deployment, hash: String) {
        let Some(template) = d.spec.as_ref().map(|s| &s.template) else {
            return;
        };
        let Some(pod_spec) = template.spec.as_ref() else {
            return;
        };
        let meta = template.metadata.clone().unwrap_or_default();
        let replica_set = format!("{}-{hash}", key.name);
        let pod_name = format!("{replica_set}-0");
        let mut spec = PodSpec::new(
            &key.namespace,
            &pod_name,
            &self.node,
            pod_spec
                .service_account_name
                .as_deref()
                .unwrap_or("default"),
        )
        .owned_by("ReplicaSet", &replica_set);
        spec.labels = meta.labels.unwrap_or_default();
        spec.labels.insert("pod-template-hash".into(), hash.clone());
        spec.annotations = meta.annotations.unwrap_or_default();
        let pod = c
            .add_pod(spec)
            .unwrap_or_else(|e| panic!("pod {pod_name}: {e}"));
        let container = (pod_spec.containers.iter())
            .find(|c| c.name == "istio-proxy")
            .expect("an istio-proxy container");
        let extra: Vec<(&str, &str)> = (self.extra_env.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let volumes = pod_spec.volumes.clone().unwrap_or_default();
        let proxy = Waypoint::from_container(&pod, &c.istiod, container, &volumes, &extra);
        self.running.insert(
            key.clone(),
            Running {
                template_hash: hash,
                pod: pod_name,
                proxy,
                ready: None,
            },
        );
    }

    fn stop(&mut self, c: &mut MeshCluster, key: &ObjectKey) {
        if let Some(mut running) = self.running.remove(key) {
            running.proxy.stop(Duration::from_secs(10));
            let _ = c.remove_pod(&running.pod);
        }
        let writer = DirectoryWriter::new(c.objects().path(), "kubelet");
        let _ = writer.write_status(key, None);
    }
}

/// Whether the Gateway `namespace/name` in the objects directory `dir` has `Programmed=True`.
pub fn gateway_programmed(dir: &std::path::Path, namespace: &str, name: &str) -> bool {
    let key = ObjectKey::new(Kind::Gateway, namespace, name);
    load_directory(dir).0.iter().any(|(_, o)| match &**o {
        Object::Gateway(g) if o.key() == key => g.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Programmed" && c.status == "True")
        }),
        _ => false,
    })
}

/// The container's readiness probe (`/healthz/ready` on 15021) answers 200.
fn probe_ready(proxy: &Waypoint) -> bool {
    let addr = SocketAddr::from((proxy.ip(), crate::waypoint::READINESS_PORT));
    http_request(
        proxy.netns(),
        addr,
        "GET",
        "/healthz/ready",
        &[],
        Duration::from_secs(1),
    )
    .is_some_and(|r| r.status == 200)
}
