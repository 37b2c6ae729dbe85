//! What the in-pod manager shows the rest of ztunnel: readiness (the node agent's snapshot was
//! received and every pod in it started), the pods and their proxy state for `/config_dump`'s
//! `workloadState`, and the proxy count metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use mesh_runtime::metrics::Metrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio::sync::watch;

use crate::proxy::PodInfo;

/// State of one pod's proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ProxyState {
    /// Serving.
    Up,
    /// Its start failed; retried every few seconds.
    Pending,
    /// Deleted (or replaced, or left out of a snapshot): listeners closed, connections finishing.
    Draining,
}

/// One entry of `workloadState`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodState {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub state: ProxyState,
}

/// One entry of `/config_dump`'s `workloadState`, keyed by pod uid (upstream's shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkloadStateDump {
    pub state: ProxyState,
    pub info: WorkloadInfoDump,
}

/// Who the pod is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadInfoDump {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// A cheap, cloneable view of the in-pod manager.
#[derive(Clone, Debug)]
pub struct InPodStatus {
    inner: Arc<StatusInner>,
}

#[derive(Debug)]
struct StatusInner {
    /// Keyed by a serial per proxy, so a draining and a new proxy of one uid can coexist.
    pods: Mutex<BTreeMap<u64, PodState>>,
    ready: watch::Sender<bool>,
}

impl InPodStatus {
    pub(super) fn new() -> InPodStatus {
        InPodStatus {
            inner: Arc::new(StatusInner {
                pods: Mutex::new(BTreeMap::new()),
                ready: watch::Sender::new(false),
            }),
        }
    }

    /// True once the node agent's snapshot was received on the current connection and every
    /// pod in it has a running proxy; false while disconnected.
    pub fn snapshot_received(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    /// Every pod with a proxy, by uid.
    pub fn pods(&self) -> Vec<PodState> {
        let mut pods: Vec<PodState> = self.lock().values().cloned().collect();
        pods.sort_by(|a, b| a.uid.cmp(&b.uid));
        pods
    }

    /// `workloadState`: one entry per pod uid. While a replaced proxy drains next to its
    /// successor, the successor is shown; a pod whose only proxy drains shows `Draining`.
    pub fn dump(&self) -> BTreeMap<String, WorkloadStateDump> {
        let mut dump = BTreeMap::new();
        for pod in self.lock().values() {
            let entry = WorkloadStateDump {
                state: pod.state,
                info: WorkloadInfoDump {
                    name: pod.name.clone(),
                    namespace: pod.namespace.clone(),
                    service_account: pod.service_account.clone(),
                },
            };
            match dump.entry(pod.uid.clone()) {
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(entry);
                }
                std::collections::btree_map::Entry::Occupied(mut slot) => {
                    if slot.get().state == ProxyState::Draining {
                        slot.insert(entry);
                    }
                }
            }
        }
        dump
    }

    pub(super) fn set_ready(&self, ready: bool) {
        self.inner.ready.send_if_modified(|r| {
            let changed = *r != ready;
            *r = ready;
            changed
        });
    }

    pub(super) fn set(&self, serial: u64, pod: &PodInfo, state: ProxyState) {
        self.lock().insert(
            serial,
            PodState {
                uid: pod.uid.clone(),
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
                state,
            },
        );
    }

    pub(super) fn remove(&self, serial: u64) {
        self.lock().remove(&serial);
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, PodState>> {
        self.inner.pods.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Istio's in-pod proxy metrics.
#[derive(Clone, Debug, Default)]
pub(super) struct InPodMetrics {
    pub active: Gauge,
    pub pending: Gauge,
    pub started: Counter,
    pub stopped: Counter,
}

impl InPodMetrics {
    pub fn register(metrics: &Metrics) -> InPodMetrics {
        let m = InPodMetrics::default();
        metrics.register(|r| {
            r.register(
                "istio_active_proxy_count",
                "The number of active workload proxies",
                m.active.clone(),
            );
            r.register(
                "istio_pending_proxy_count",
                "The number of pending workload proxies",
                m.pending.clone(),
            );
            r.register(
                "istio_proxies_started",
                "The total number of proxies that were started",
                m.started.clone(),
            );
            r.register(
                "istio_proxies_stopped",
                "The total number of proxies that were stopped",
                m.stopped.clone(),
            );
        });
        m
    }
}
