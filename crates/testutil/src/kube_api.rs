//! An in-process fake Kubernetes API server on loopback, speaking the real wire protocol
//! (JSON over HTTP/1.1) so `kube` clients and watchers run against it unchanged.
//!
//! What it does as the real server does, because the mesh's Kubernetes code relies on it:
//! - one resource version counter for every object; lists carry it, objects carry theirs;
//! - `watch=true` from a resource version replays what happened since, then streams changes;
//!   `allowWatchBookmarks=true` adds BOOKMARK events; `timeoutSeconds` ends the stream;
//!   a resource version older than the last [`FakeApiServer::compact`] gets an ERROR event
//!   with a 410 `Status` (HTTP 200), which makes clients re-list;
//! - `limit` / `continue` pagination over one consistent snapshot;
//! - label selectors (`=`, `!=`, `in`, `notin`, exists, `!`) and field selectors
//!   (`metadata.name`, `metadata.namespace`, and Pods' `spec.nodeName`, `status.phase`, ...;
//!   others are refused with 400); with a selector, a change that makes an object match or stop
//!   matching is sent as ADDED or DELETED;
//! - POST (409 AlreadyExists), PUT (409 Conflict on a stale `resourceVersion`), DELETE, PATCH
//!   (merge, JSON patch, apply with a required `fieldManager`; apply creates), and the
//!   `/status` subresource, which alone writes status for types that have one;
//! - `Status` bodies with `reason` and `code` on every error;
//! - TokenReview (`authentication.k8s.io/v1`) against registered tokens, with audiences and
//!   the bound pod checked.
//!
//! - CustomResourceDefinitions are served as objects: a written CRD is checked, becomes
//!   `Established` shortly after ([`FakeApiServer::set_crd_delay`]) and only then are its
//!   versions served; deleting it deletes its objects (see `controllers`);
//! - `/version`, and SelfSubjectAccessReview answered from [`FakeApiServer::deny`];
//! - `pods/<name>/portforward` over WebSocket (`v4.channel.k8s.io`), to the pod's IP or to
//!   where [`FakeApiServer::forward_pod_port`] says.
//!
//! Known differences: no managed fields in objects (server-side apply keeps each manager's
//! configuration aside), strategic merge patches are merged as JSON merge patches, no
//! admission, no authorization (every request is allowed; only access reviews answer from the
//! deny list), each served version of a CRD holds its own objects (no conversion), and no
//! controllers but those of `controllers` (CRDs; rollouts only when
//! [`FakeApiServer::simulate_rollouts`] is on). Deleting a namespace removes it at once and its
//! objects just after (the real server keeps it `Terminating` until they are gone).

mod apply;
mod controllers;
mod http;
mod portforward;
mod select;
mod store;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast;

pub use store::{ApiStatus, WatchEvent};

/// One served resource type.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    /// Whether it has a `/status` subresource.
    pub status: bool,
    /// Served by a CRD: list items keep `apiVersion` and `kind` (built-in lists drop them).
    pub custom: bool,
}

impl ResourceType {
    pub fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            kind: kind.into(),
            namespaced,
            status: false,
            custom: false,
        }
    }

    /// Served by a CRD (with a status subresource, as Istio's and Gateway API's CRDs are).
    pub fn custom(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        ResourceType {
            status: true,
            custom: true,
            ..ResourceType::new(group, version, plural, kind, namespaced)
        }
    }

    /// With a `/status` subresource.
    pub fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn key(&self) -> String {
        store::resource_key(&self.group, &self.version, &self.plural)
    }

    /// `pods` or `httproutes.gateway.networking.k8s.io`, as error messages name it.
    fn plural_qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// The core and apps types the mesh reads and writes.
pub fn core_types() -> Vec<ResourceType> {
    vec![
        ResourceType::new("", "v1", "namespaces", "Namespace", false).with_status(),
        ResourceType::new("", "v1", "pods", "Pod", true).with_status(),
        ResourceType::new("", "v1", "services", "Service", true).with_status(),
        ResourceType::new("", "v1", "serviceaccounts", "ServiceAccount", true),
        ResourceType::new("", "v1", "configmaps", "ConfigMap", true),
        ResourceType::new("", "v1", "secrets", "Secret", true),
        ResourceType::new("", "v1", "nodes", "Node", false).with_status(),
        ResourceType::new(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
        ),
        ResourceType::new("apps", "v1", "deployments", "Deployment", true).with_status(),
        ResourceType::new("apps", "v1", "daemonsets", "DaemonSet", true).with_status(),
        ResourceType::new("coordination.k8s.io", "v1", "leases", "Lease", true),
        ResourceType::new("", "v1", "resourcequotas", "ResourceQuota", true).with_status(),
        ResourceType::new(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
        ),
        ResourceType::new(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
        ),
        ResourceType::new("rbac.authorization.k8s.io", "v1", "roles", "Role", true),
        ResourceType::new(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
        ),
        ResourceType::new(
            "autoscaling",
            "v2",
            "horizontalpodautoscalers",
            "HorizontalPodAutoscaler",
            true,
        )
        .with_status(),
        ResourceType::new(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
        )
        .with_status(),
        ResourceType::new(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
        ),
        ResourceType::new(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
        )
        .with_status(),
        ResourceType::new(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
        ),
        ResourceType::new(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
        ),
    ]
}

/// The Istio and Gateway API CRDs the mesh reads, at the versions it asks for.
pub fn mesh_crd_types() -> Vec<ResourceType> {
    let istio = |g: &str, p: &str, k: &str| ResourceType::custom(g, "v1", p, k, true);
    let gw = |v: &str, p: &str, k: &str, ns: bool| {
        ResourceType::custom("gateway.networking.k8s.io", v, p, k, ns)
    };
    vec![
        istio("networking.istio.io", "serviceentries", "ServiceEntry"),
        istio("networking.istio.io", "workloadentries", "WorkloadEntry"),
        istio("networking.istio.io", "virtualservices", "VirtualService"),
        istio("networking.istio.io", "destinationrules", "DestinationRule"),
        istio("networking.istio.io", "sidecars", "Sidecar"),
        istio("networking.istio.io", "gateways", "Gateway"),
        istio(
            "security.istio.io",
            "authorizationpolicies",
            "AuthorizationPolicy",
        ),
        istio(
            "security.istio.io",
            "peerauthentications",
            "PeerAuthentication",
        ),
        istio(
            "security.istio.io",
            "requestauthentications",
            "RequestAuthentication",
        ),
        gw("v1", "gateways", "Gateway", true),
        gw("v1", "gatewayclasses", "GatewayClass", false),
        gw("v1", "httproutes", "HTTPRoute", true),
        gw("v1", "grpcroutes", "GRPCRoute", true),
        gw("v1alpha2", "tcproutes", "TCPRoute", true),
    ]
}

/// A registered service-account token and what a TokenReview says of it.
#[derive(Debug, Clone)]
pub struct FakeToken {
    pub namespace: String,
    pub service_account: String,
    pub audiences: Vec<String>,
    /// The pod the token is bound to (name, uid): reviews fail once it is gone.
    pub pod: Option<(String, String)>,
    /// A user that is not a service account (a person's or a controller's credential): the
    /// review names this user, in the group `system:authenticated` only, and `namespace` and
    /// `service_account` are not used.
    pub user: Option<String>,
}

#[derive(Debug)]
struct Shared {
    store: Mutex<store::Store>,
    events: broadcast::Sender<WatchEvent>,
    tokens: Mutex<std::collections::HashMap<String, FakeToken>>,
    bookmark_every: Mutex<Duration>,
    /// `METHOD path?query` of every request, for tests that check what a client asked.
    requests: Mutex<Vec<String>>,
    /// When false, every request gets 503 (the API server is down).
    available: std::sync::atomic::AtomicBool,
    /// How long a written CRD waits before it is Established.
    crd_delay: Mutex<Duration>,
    /// Whether Deployments and DaemonSets get the status of a finished rollout.
    rollouts: Mutex<bool>,
    /// `major`, `minor` of `/version`.
    version: Mutex<(u32, u32)>,
    /// (verb, group, resource) that access reviews deny.
    denied: Mutex<Vec<(String, String, String)>>,
    /// (namespace, pod, port) -> where a port-forward to it connects.
    pod_ports: Mutex<std::collections::HashMap<(String, String, u16), SocketAddr>>,
}

/// The running fake API server. Stops when dropped.
#[derive(Debug)]
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeApiServer {
    /// Serves `types` on `127.0.0.1:<ephemeral>`; needs a Tokio runtime.
    pub async fn start(types: Vec<ResourceType>) -> std::io::Result<FakeApiServer> {
        let (events, _) = broadcast::channel(4096);
        let mut store = store::Store::default();
        for t in types {
            store.types.insert(t.key(), t);
        }
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            events,
            tokens: Mutex::default(),
            bookmark_every: Mutex::new(Duration::from_secs(1)),
            requests: Mutex::default(),
            available: std::sync::atomic::AtomicBool::new(true),
            crd_delay: Mutex::new(Duration::from_millis(20)),
            rollouts: Mutex::new(false),
            version: Mutex::new((1, 33)),
            denied: Mutex::default(),
            pod_ports: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = http::router(shared.clone());
        let controllers = controllers::run(shared.clone());
        let task = tokio::spawn(async move {
            let serve = async {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::warn!(error = %e, "fake API server stopped");
                }
            };
            tokio::join!(serve, controllers);
        });
        Ok(FakeApiServer { addr, shared, task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube` client for this server (no credentials).
    pub fn client(&self) -> kube::Client {
        let url = self
            .url()
            .parse()
            .unwrap_or_else(|e| panic!("fake API server URL: {e}"));
        kube::Client::try_from(kube::Config::new(url))
            .unwrap_or_else(|e| panic!("client for the fake API server: {e}"))
    }

    /// A kubeconfig pointing at this server (no credentials).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        )
    }

    /// Serves one more type from now on (a CRD being installed).
    pub fn add_type(&self, t: ResourceType) {
        lock(&self.shared.store).types.insert(t.key(), t);
    }

    /// Writes `obj` verbatim (status included) as controllers would; its type is found by
    /// `apiVersion` and `kind`.
    pub fn seed(&self, obj: Value) -> Result<(), ApiStatus> {
        let mut store = lock(&self.shared.store);
        let key = type_of(&store, &obj)?;
        let ev = store.seed(&key, obj)?;
        drop(store);
        let _ = self.shared.events.send(ev);
        Ok(())
    }

    /// Deletes an object (by `apiVersion`, `kind`, namespace and name of `obj`).
    pub fn remove(&self, obj: &Value) -> Result<(), ApiStatus> {
        let mut store = lock(&self.shared.store);
        let key = type_of(&store, obj)?;
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let (_, ev) = store.delete(&key, ns, name)?;
        drop(store);
        let _ = self.shared.events.send(ev);
        Ok(())
    }

    /// The stored object, if any.
    pub fn get(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let store = lock(&self.shared.store);
        let probe = serde_json::json!({"apiVersion": api_version, "kind": kind});
        let key = type_of(&store, &probe).ok()?;
        store.get(&key, ns, name).ok()
    }

    /// The history is compacted: watches from any resource version up to now get 410.
    pub fn compact(&self) {
        lock(&self.shared.store).compact();
    }

    /// Ends every open watch stream (as an API server restart does); clients re-watch.
    pub fn drop_watches(&self) {
        // A sentinel event no watch matches, with a marker the streams end on.
        let _ = self.shared.events.send(WatchEvent {
            rv: 0,
            previous: None,
            resource: http::DROP_WATCHES.into(),
            namespace: String::new(),
            kind: "ERROR",
            object: Value::Null,
        });
    }

    /// Takes the server down (every request gets 503 and open watches end) or back up. State
    /// is kept; [`FakeApiServer::seed`] and [`FakeApiServer::remove`] still work while down.
    pub fn set_available(&self, up: bool) {
        self.shared
            .available
            .store(up, std::sync::atomic::Ordering::SeqCst);
        if !up {
            self.drop_watches();
        }
    }

    /// The current resource version.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv
    }

    pub fn set_bookmark_interval(&self, every: Duration) {
        *lock(&self.shared.bookmark_every) = every;
    }

    /// How long a written CRD waits before it is Established (20 ms unless set).
    pub fn set_crd_delay(&self, delay: Duration) {
        *lock(&self.shared.crd_delay) = delay;
    }

    /// Turns the rollout controller on or off: when on, Deployments and DaemonSets (those
    /// written before too) get the status of a finished rollout as soon as they are written
    /// (a DaemonSet on every Node).
    pub fn simulate_rollouts(&self, on: bool) {
        *lock(&self.shared.rollouts) = on;
        if on {
            controllers::roll_out_all(&self.shared);
        }
    }

    /// The Kubernetes version `/version` reports (1.33 unless set).
    pub fn set_version(&self, major: u32, minor: u32) {
        *lock(&self.shared.version) = (major, minor);
    }

    /// Access reviews for `verb` on `resource` of `group` (`""`: core) answer "not allowed".
    pub fn deny(&self, verb: &str, group: &str, resource: &str) {
        lock(&self.shared.denied).push((verb.into(), group.into(), resource.into()));
    }

    /// Port-forwards to `port` of the pod connect to `to` (the pod's own localhost, as the
    /// kubelet reaches it); without this, they connect to the pod's `podIP`.
    pub fn forward_pod_port(&self, namespace: &str, pod: &str, port: u16, to: SocketAddr) {
        lock(&self.shared.pod_ports).insert((namespace.into(), pod.into(), port), to);
    }

    pub fn add_token(&self, token: &str, t: FakeToken) {
        lock(&self.shared.tokens).insert(token.to_string(), t);
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared.requests).clone()
    }
}

fn type_of(store: &store::Store, obj: &Value) -> Result<String, ApiStatus> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    store
        .types
        .iter()
        .find(|(_, t)| t.api_version() == api_version && t.kind == kind)
        .map(|(k, _)| k.clone())
        .ok_or_else(|| ApiStatus::new(404, "NotFound", format!("no type {api_version} {kind}")))
}
