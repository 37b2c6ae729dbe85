//! The node agent: decides which pods are enrolled, applies their capture through a
//! [`Redirector`], hands them to ztunnel over ZDS, and keeps that true as the cluster changes
//! and across restarts.
//!
//! * CNI ADD ([`CniAddHandler`]): the pod is looked up in the cluster source (waiting up to
//!   [`AgentOptions::pod_wait`] for it to appear), remembered with its netns and IPs whether
//!   enrolled or not (so a later label enrolls it while it runs), and if selected
//!   (`selection`) goes `pending` -> `Redirector::enroll` -> ZDS add -> `enabled`. Any failure
//!   undoes the capture and the ZDS entry, forgets the pod and returns the error (its text
//!   goes back to the plugin, which fails the ADD; the kubelet retries).
//! * Source events ([`Agent::run`]): a Pod or Namespace change compares intent (labels) with
//!   the recorded status, as istio-cni's informer does: newly selected running pods are
//!   enrolled, deselected ones unenrolled (capture removed, ZDS `Del`), deleted or terminated
//!   pods removed. Nothing is torn down before the source has synced. When ztunnel
//!   (re)connects, pods whose enrollment failed earlier are retried.
//! * Restart ([`Agent::restore`]): the state file is loaded; pods whose netns is gone are
//!   dropped; enrolled pods get their capture re-applied (idempotent; unless
//!   `reconcile_on_start` is off) and go into the ZDS cache, so ztunnel gets them in its
//!   snapshot. After the source synced, every record is reconciled against the labels.
//! * With `node_name` set, selected pods on this node that have no record (running before
//!   the agent ever saw them) get their netns from `/proc` (`state::procscan`) and are
//!   enrolled.
//!
//! Operations are serialized (one lock over the records), so no two operations on a pod
//! ever overlap. The `ambient.istio.io/redirection` status lives in the state file; on
//! Kubernetes ([`AgentOptions::annotator`]) it is also written to the Pod (`annotate`).

mod annotate;
mod cluster;
mod ops;
mod readyz;

pub use annotate::{PodAnnotator, REDIRECTION_ANNOTATION};
pub use readyz::serve_probes;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mesh_api::{Kind, Object};
use mesh_source::SourceEvent;
use tokio::sync::{mpsc, watch, Mutex};
use tracing::{info, warn};

use crate::config::Config;
use crate::event::{BoxFuture, CniAddEvent, CniAddHandler, HandlerError};
use crate::redirect::{RedirectError, Redirector};
use crate::selection::SelectionConfig;
use crate::state::{PodRecord, StateError, StateStore};
use crate::zds_server::{ZdsError, ZdsHandle};
use cluster::{ClusterView, PodKey};

/// What the agent watches on Kubernetes, as istio-cni: the pods of its node, all namespaces.
pub fn kube_watches(node: Option<&str>) -> mesh_source::KubeOptions {
    mesh_source::KubeOptions {
        kinds: vec![Kind::Namespace, Kind::Pod],
        pod_field_selector: node.map(|n| format!("spec.nodeName={n}")),
        ..mesh_source::KubeOptions::default()
    }
}

/// How long a CNI ADD waits for its Pod to appear in the cluster source.
pub const POD_WAIT: Duration = Duration::from_secs(5);

/// What the agent needs besides its collaborators.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub state_dir: PathBuf,
    pub selection: SelectionConfig,
    pub pod_wait: Duration,
    /// Re-apply the capture of recorded pods at start.
    pub reconcile_on_start: bool,
    /// This node; enables the `/proc` lookup of unrecorded selected pods on it.
    pub node_name: Option<String>,
    pub host_proc: PathBuf,
    /// Writes the redirection status to the Pods (Kubernetes); `None` keeps it in the state
    /// file only.
    pub annotator: Option<PodAnnotator>,
}

impl AgentOptions {
    /// Defaults with the state in `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> AgentOptions {
        AgentOptions {
            state_dir: state_dir.into(),
            selection: SelectionConfig::default(),
            pod_wait: POD_WAIT,
            reconcile_on_start: true,
            node_name: None,
            host_proc: PathBuf::from("/proc"),
            annotator: None,
        }
    }

    pub fn from_config(config: &Config) -> AgentOptions {
        AgentOptions {
            state_dir: config.state_dir.clone(),
            selection: config.selection.clone(),
            pod_wait: POD_WAIT,
            reconcile_on_start: config.reconcile_on_start,
            node_name: config.node_name.clone(),
            host_proc: config.host_proc.clone(),
            annotator: None,
        }
    }
}

/// Why a pod could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("pod {namespace}/{name} is not in the cluster source after {waited:?}; is its YAML in CLUSTER_CONFIG_DIR (with the same uid)?")]
    PodNotFound {
        namespace: String,
        name: String,
        waited: Duration,
    },
    #[error("pod {pod}: bad IP {value:?} in the CNI event; expected address/prefix")]
    BadIp { pod: String, value: String },
    #[error("pod {pod}: cannot apply traffic capture: {source}")]
    Redirect {
        pod: String,
        #[source]
        source: RedirectError,
    },
    #[error("pod {pod}: {source}")]
    Zds {
        pod: String,
        #[source]
        source: ZdsError,
    },
    #[error("pod {pod}: its network namespace {} disappeared during enrollment; the capture and ztunnel's copy were undone", netns.display())]
    NetnsGone { pod: String, netns: PathBuf },
    #[error("pod {pod}: cannot set up sidecar capture: {source}")]
    SidecarConfig {
        pod: String,
        #[source]
        source: crate::sidecar::SidecarError,
    },
    #[error("pod {pod}: cannot write sidecar capture in {}: {source}", netns.display())]
    SidecarCapture {
        pod: String,
        netns: PathBuf,
        #[source]
        source: crate::sidecar::ApplyError,
    },
    #[error("pod {pod}: the redirector task failed: {detail}")]
    Task { pod: String, detail: String },
    #[error(transparent)]
    State(#[from] StateError),
}

impl AgentError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AgentError::PodNotFound { .. } => "pod_not_found",
            AgentError::BadIp { .. } => "bad_ip",
            AgentError::Redirect { source, .. } => source.reason(),
            AgentError::Zds { source, .. } => source.reason(),
            AgentError::NetnsGone { .. } => "netns_gone",
            AgentError::SidecarConfig { .. } => "sidecar_annotation",
            AgentError::SidecarCapture { source, .. } => source.reason(),
            AgentError::Task { .. } => "task",
            AgentError::State(e) => e.reason(),
        }
    }
}

/// What [`Agent::restore`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Records kept (netns still there).
    pub kept: usize,
    /// Records dropped (netns gone).
    pub dropped: usize,
    /// Enrolled pods whose capture was re-applied and that went into the ZDS cache.
    pub reenrolled: usize,
    /// Enrolled pods whose capture could not be re-applied (retried after the source syncs).
    pub failed: usize,
}

type Records = BTreeMap<PodKey, PodRecord>;

struct Inner {
    options: AgentOptions,
    redirector: Arc<dyn Redirector>,
    zds: ZdsHandle,
    store: StateStore,
    cluster: ClusterView,
    /// Every operation on pods holds this lock: they are serialized.
    records: Mutex<Records>,
    ready: watch::Sender<bool>,
}

/// The node agent; cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("state_dir", &self.inner.options.state_dir)
            .field("redirector", &self.inner.redirector.name())
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent with no pods yet; call [`Agent::restore`] before serving.
    pub fn new(options: AgentOptions, redirector: Arc<dyn Redirector>, zds: ZdsHandle) -> Agent {
        let store = StateStore::new(&options.state_dir);
        Agent {
            inner: Arc::new(Inner {
                options,
                redirector,
                zds,
                store,
                cluster: ClusterView::new(),
                records: Mutex::new(Records::new()),
                ready: watch::Sender::new(false),
            }),
        }
    }

    /// Loads the state file and re-applies the capture of enrolled pods (see the module
    /// documentation). Call once, before [`Agent::run`] and before ztunnel can connect.
    pub async fn restore(&self) -> Result<RestoreSummary, AgentError> {
        ops::restore(&self.inner).await
    }

    /// Follows the cluster source until `shutdown` resolves or `events` closes. Capture is
    /// left in place when it returns (as upstream: pods stay captured across agent restarts).
    pub async fn run(
        &self,
        mut events: mpsc::Receiver<SourceEvent>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut connected = self.inner.zds.connected();
        let mut zds_alive = true;
        let mut synced = false;
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                event = events.recv() => match event {
                    Some(event) => self.on_event(event, &mut synced).await,
                    None => {
                        warn!("the cluster source stopped");
                        break;
                    }
                },
                changed = connected.changed(), if zds_alive => {
                    zds_alive = changed.is_ok();
                    let now = zds_alive && *connected.borrow_and_update();
                    if now && synced {
                        info!("ztunnel connected; retrying pods not enrolled yet");
                        ops::reconcile_all(&self.inner).await;
                    }
                }
            }
        }
        info!("agent stopped; pod capture left in place");
    }

    /// True once the source synced and the recorded pods were reconciled against it.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    /// Every pod the agent knows, by namespace and name.
    pub async fn pods(&self) -> Vec<PodRecord> {
        self.inner.records.lock().await.values().cloned().collect()
    }

    async fn on_event(&self, event: SourceEvent, synced: &mut bool) {
        let inner = &self.inner;
        match event {
            SourceEvent::Applied(object) => match &*object {
                Object::Pod(pod) => {
                    let key = (
                        pod.metadata
                            .namespace
                            .clone()
                            .unwrap_or_else(|| "default".into()),
                        pod.metadata.name.clone().unwrap_or_default(),
                    );
                    inner
                        .cluster
                        .upsert_pod(key.clone(), Arc::new((**pod).clone()));
                    if *synced {
                        ops::reconcile_keys(inner, vec![key]).await;
                    }
                }
                Object::Namespace(ns) => {
                    let name = ns.metadata.name.clone().unwrap_or_default();
                    inner
                        .cluster
                        .upsert_namespace(name.clone(), Arc::new((**ns).clone()));
                    if *synced {
                        ops::reconcile_namespace(inner, &name).await;
                    }
                }
                _ => {}
            },
            SourceEvent::Deleted(key) => match key.kind {
                Kind::Pod => {
                    let key = (key.namespace, key.name);
                    inner.cluster.remove_pod(&key);
                    if *synced {
                        ops::reconcile_keys(inner, vec![key]).await;
                    }
                }
                Kind::Namespace => {
                    inner.cluster.remove_namespace(&key.name);
                    if *synced {
                        ops::reconcile_namespace(inner, &key.name).await;
                    }
                }
                _ => {}
            },
            SourceEvent::Synced => {
                if !*synced {
                    *synced = true;
                    ops::reconcile_all(inner).await;
                    inner.ready.send_replace(true);
                    info!("cluster source synced; recorded pods reconciled; agent ready");
                }
            }
            SourceEvent::Invalid(_) => {}
        }
    }
}

impl CniAddHandler for Agent {
    fn cni_add(&self, event: CniAddEvent) -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let pod = format!("{}/{}", event.pod_namespace, event.pod_name);
            ops::cni_add(&self.inner, event).await.map_err(|e| {
                warn!(%pod, error = %e, reason = e.reason(), "CNI ADD failed");
                HandlerError::from(e)
            })
        })
    }
}

/// Parses the plugin's `address/prefix` IPs (a bare address is accepted too).
fn parse_ips(pod: &str, values: &[String]) -> Result<Vec<IpAddr>, AgentError> {
    values
        .iter()
        .map(|value| {
            let addr = value.split_once('/').map_or(value.as_str(), |(a, _)| a);
            addr.trim().parse().map_err(|_| AgentError::BadIp {
                pod: pod.to_string(),
                value: value.clone(),
            })
        })
        .collect()
}
