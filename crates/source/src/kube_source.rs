//! [`KubeSource`]: cluster state from the Kubernetes API, one `kube` runtime watcher per kind.
//!
//! Each watcher lists, then watches from the list's resource version, and lists again when the
//! watch cannot resume (410 Gone, a dropped connection past the history). A re-list is diffed
//! against what was sent before: objects that vanished are sent as `Deleted`, changed ones as
//! `Applied`, unchanged ones not at all. `Synced` is sent once, when every kind has completed
//! its first list. Kinds served by CRDs (Istio's and Gateway API's) start only once the API
//! server serves them; until then they count as synced and are looked for again every
//! [`KubeOptions::crd_poll`].

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use mesh_api::{Kind, Object, ObjectKey};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::error::{Problem, SourceError};
use crate::{ClusterSource, SourceEvent, SourceFuture};

/// What a [`KubeSource`] watches.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// The kinds to watch.
    pub kinds: Vec<Kind>,
    /// A field selector for Pods (the node agent watches `spec.nodeName=<node>`).
    pub pod_field_selector: Option<String>,
    /// How often a kind whose CRD is missing is looked for again.
    pub crd_poll: Duration,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            kinds: Kind::ALL.to_vec(),
            pod_field_selector: None,
            crd_poll: Duration::from_secs(5),
        }
    }
}

/// Reads the cluster through the API server, then follows its changes.
#[derive(Clone)]
pub struct KubeSource {
    client: Client,
    options: KubeOptions,
    stats: Arc<KubeSourceStats>,
}

/// Counters of what the watchers saw, for the integrator to export as metrics.
#[derive(Debug, Default)]
pub struct KubeSourceStats {
    /// (kind, event) -> count; events are `add`, `update`, `delete` (changes the source
    /// passed on), `relist` (a list started: the first sync, or after a 410 or a reconnect),
    /// `watch_error` and `invalid` (an object that does not decode).
    counts: std::sync::Mutex<std::collections::BTreeMap<(Kind, &'static str), u64>>,
}

impl KubeSourceStats {
    fn count(&self, kind: Kind, event: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry((kind, event)).or_default() += 1;
    }

    /// Every (kind, event, count) so far.
    pub fn snapshot(&self) -> Vec<(Kind, &'static str, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.iter().map(|((k, e), n)| (*k, *e, *n)).collect()
    }
}

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSource")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl KubeSource {
    pub fn new(client: Client, options: KubeOptions) -> Self {
        KubeSource {
            client,
            options,
            stats: Arc::default(),
        }
    }

    /// The watchers' counters (shared: read them while the source runs).
    pub fn stats(&self) -> Arc<KubeSourceStats> {
        Arc::clone(&self.stats)
    }
}

/// The plural resource name of a kind, as its API serves it.
pub fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::Namespace => "namespaces",
        Kind::Pod => "pods",
        Kind::Service => "services",
        Kind::ServiceEntry => "serviceentries",
        Kind::WorkloadEntry => "workloadentries",
        Kind::AuthorizationPolicy => "authorizationpolicies",
        Kind::PeerAuthentication => "peerauthentications",
        Kind::Gateway => "gateways",
        Kind::HttpRoute => "httproutes",
        Kind::Deployment => "deployments",
        Kind::ServiceAccount => "serviceaccounts",
        Kind::GatewayClass => "gatewayclasses",
        Kind::VirtualService => "virtualservices",
        Kind::DestinationRule => "destinationrules",
        Kind::GrpcRoute => "grpcroutes",
        Kind::TcpRoute => "tcproutes",
        Kind::Node => "nodes",
        Kind::EndpointSlice => "endpointslices",
        Kind::RequestAuthentication => "requestauthentications",
        Kind::Sidecar => "sidecars",
        Kind::IstioGateway => "gateways",
        Kind::Secret => "secrets",
    }
}

/// Whether the kind comes from a CRD (and so may not be served yet).
fn from_crd(kind: Kind) -> bool {
    let api_version = kind.api_version();
    api_version.contains(".istio.io/") || api_version.starts_with("gateway.networking.k8s.io/")
}

pub(crate) fn api_resource(kind: Kind) -> ApiResource {
    let api_version = kind.api_version();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind.as_str());
    ApiResource::from_gvk_with_plural(&gvk, plural(kind))
}

/// What the per-kind watchers tell the aggregator.
enum Msg {
    Event(Kind, Box<watcher::Event<DynamicObject>>),
    /// The kind is not served (yet): it counts as synced.
    Absent(Kind),
}

impl ClusterSource for KubeSource {
    fn run(self: Box<Self>, tx: mpsc::Sender<SourceEvent>) -> SourceFuture {
        Box::pin(async move {
            let (mtx, mut mrx) = mpsc::channel(1024);
            let mut tasks = Vec::new();
            for kind in self.options.kinds.iter().copied() {
                tasks.push(tokio::spawn(watch_kind(
                    self.client.clone(),
                    kind,
                    self.options.clone(),
                    mtx.clone(),
                    self.stats.clone(),
                )));
            }
            drop(mtx);
            let mut agg = Aggregator::new(
                self.options.kinds.iter().copied().collect(),
                self.stats.clone(),
            );
            while let Some(msg) = mrx.recv().await {
                for ev in agg.handle(msg) {
                    if tx.send(ev).await.is_err() {
                        tasks.iter().for_each(|t| t.abort());
                        return;
                    }
                }
            }
        })
    }
}

/// Whether the API server serves `kind` now.
async fn served(client: &Client, kind: Kind) -> bool {
    match client.list_api_group_resources(&kind.api_version()).await {
        Ok(list) => list.resources.iter().any(|r| r.name == plural(kind)),
        Err(e) => {
            debug!(kind = %kind, error = %e, "API group not served");
            false
        }
    }
}

/// The Secrets istiod does not read.
pub const SECRET_FIELDS: &str =
    "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token";

async fn watch_kind(
    client: Client,
    kind: Kind,
    options: KubeOptions,
    tx: mpsc::Sender<Msg>,
    stats: Arc<KubeSourceStats>,
) {
    if from_crd(kind) && !served(&client, kind).await {
        info!(kind = %kind, "kind not served (no CRD yet); looking again every {:?}", options.crd_poll);
        if tx.send(Msg::Absent(kind)).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(options.crd_poll).await;
            if served(&client, kind).await {
                info!(kind = %kind, "kind now served; starting its watcher");
                break;
            }
        }
    }
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource(kind));
    let mut config = watcher::Config::default();
    if kind == Kind::Pod {
        if let Some(f) = &options.pod_field_selector {
            config = config.fields(f);
        }
    }
    if kind == Kind::Secret {
        // As Istio's: not the (large, many) Helm release records nor service account tokens.
        config = config.fields(SECRET_FIELDS);
    }
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                if tx.send(Msg::Event(kind, Box::new(ev))).await.is_err() {
                    return;
                }
            }
            // The watcher lists again after this (with backoff); the last state stays served.
            Err(e) => {
                stats.count(kind, "watch_error");
                warn!(kind = %kind, error = %e, "watch failed; retrying");
            }
        }
    }
}

/// Turns watcher events into source events: diffs re-lists, tracks the first sync.
struct Aggregator {
    known: HashMap<ObjectKey, Arc<Object>>,
    relisting: HashMap<Kind, HashMap<ObjectKey, Arc<Object>>>,
    /// Objects that failed to decode, by the resource version reported (reported once each).
    invalid: HashMap<ObjectKey, String>,
    /// Invalid objects seen in the list in progress (their last good version stays).
    relisted_invalid: HashMap<Kind, BTreeSet<ObjectKey>>,
    unsynced: BTreeSet<Kind>,
    synced_sent: bool,
    stats: Arc<KubeSourceStats>,
}

impl Aggregator {
    fn new(kinds: BTreeSet<Kind>, stats: Arc<KubeSourceStats>) -> Self {
        Aggregator {
            stats,
            known: HashMap::new(),
            relisting: HashMap::new(),
            invalid: HashMap::new(),
            relisted_invalid: HashMap::new(),
            unsynced: kinds,
            synced_sent: false,
        }
    }

    /// Decodes `obj`. On failure, the object's key and the problem, which is given once per
    /// object version (a re-list of an object still broken the same way says nothing new).
    fn decode_once(
        &mut self,
        kind: Kind,
        obj: DynamicObject,
    ) -> Result<Arc<Object>, (ObjectKey, Option<Box<SourceError>>)> {
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        match Self::decode(kind, obj) {
            Ok(o) => {
                self.invalid.remove(&o.key());
                Ok(o)
            }
            Err(e) => {
                let key = e
                    .key
                    .clone()
                    .unwrap_or_else(|| ObjectKey::new(kind, "", ""));
                let new = self.invalid.insert(key.clone(), rv.clone()) != Some(rv);
                if new {
                    self.stats.count(kind, "invalid");
                }
                Err((key, new.then_some(e)))
            }
        }
    }

    fn decode(kind: Kind, obj: DynamicObject) -> Result<Arc<Object>, Box<SourceError>> {
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        let mut value = serde_json::to_value(&obj).unwrap_or_default();
        // List items carry no type; the watch knows it.
        value["apiVersion"] = serde_json::Value::String(kind.api_version());
        value["kind"] = serde_json::Value::String(kind.as_str().to_string());
        Object::from_value(value).map(Arc::new).map_err(|e| {
            let location = if ns.is_empty() {
                format!("kubernetes:{}/{}", plural(kind), name)
            } else {
                format!("kubernetes:{}/{}/{}", plural(kind), ns, name)
            };
            let mut err = SourceError::file(PathBuf::from(location), Problem::InvalidObject(e));
            err.key = Some(ObjectKey::new(kind, ns, name));
            Box::new(err)
        })
    }

    fn handle(&mut self, msg: Msg) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        let (kind, ev) = match msg {
            Msg::Absent(kind) => {
                self.mark_synced(kind, &mut out);
                return out;
            }
            Msg::Event(kind, ev) => (kind, *ev),
        };
        match ev {
            watcher::Event::Init => {
                self.stats.count(kind, "relist");
                self.relisting.insert(kind, HashMap::new());
            }
            watcher::Event::InitApply(obj) => match self.decode_once(kind, obj) {
                Ok(o) => {
                    self.relisting.entry(kind).or_default().insert(o.key(), o);
                }
                Err((key, problem)) => {
                    self.relisted_invalid.entry(kind).or_default().insert(key);
                    out.extend(problem.map(|e| SourceEvent::Invalid(*e)));
                }
            },
            watcher::Event::InitDone => {
                let listed = self.relisting.remove(&kind).unwrap_or_default();
                let broken = self.relisted_invalid.remove(&kind).unwrap_or_default();
                // Gone from the list: deleted. Listed but undecodable: its last good version stays.
                let vanished: Vec<ObjectKey> = (self.known.keys())
                    .filter(|k| k.kind == kind && !listed.contains_key(k) && !broken.contains(k))
                    .cloned()
                    .collect();
                for key in vanished {
                    self.known.remove(&key);
                    self.stats.count(kind, "delete");
                    out.push(SourceEvent::Deleted(key));
                }
                for (key, obj) in listed {
                    self.apply(key, obj, &mut out);
                }
                self.mark_synced(kind, &mut out);
            }
            watcher::Event::Apply(obj) => match self.decode_once(kind, obj) {
                Ok(o) => self.apply(o.key(), o, &mut out),
                // The last good version stays.
                Err((_, problem)) => out.extend(problem.map(|e| SourceEvent::Invalid(*e))),
            },
            watcher::Event::Delete(obj) => {
                let ns = if kind.namespaced() {
                    obj.metadata.namespace.clone().unwrap_or_default()
                } else {
                    String::new()
                };
                let key = ObjectKey::new(kind, ns, obj.metadata.name.clone().unwrap_or_default());
                self.invalid.remove(&key);
                if self.known.remove(&key).is_some() {
                    self.stats.count(kind, "delete");
                    out.push(SourceEvent::Deleted(key));
                }
            }
        }
        out
    }

    fn apply(&mut self, key: ObjectKey, obj: Arc<Object>, out: &mut Vec<SourceEvent>) {
        let event = match self.known.get(&key) {
            Some(old) if **old == *obj => return,
            Some(_) => "update",
            None => "add",
        };
        self.stats.count(key.kind, event);
        self.known.insert(key, obj.clone());
        out.push(SourceEvent::Applied(obj));
    }

    fn mark_synced(&mut self, kind: Kind, out: &mut Vec<SourceEvent>) {
        self.unsynced.remove(&kind);
        if self.unsynced.is_empty() && !self.synced_sent {
            self.synced_sent = true;
            info!(objects = self.known.len(), "Kubernetes API source synced");
            out.push(SourceEvent::Synced);
        }
    }
}
