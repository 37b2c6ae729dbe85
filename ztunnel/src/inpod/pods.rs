//! The table of pod proxies and what each ZDS request does to it.
//!
//! Snapshot phase (after every (re)connect): `Add` starts a proxy (or keeps the running one
//! when its netns is the same), `Keep` keeps a running proxy, `SnapshotSent` drains every proxy
//! the snapshot did not name. Afterwards `Add`/`Del` come live. A proxy whose start failed is
//! NACKed and kept as pending, retried until it starts or is deleted.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

use tokio::task::JoinHandle;

use super::netns::{InPodSockets, Netns, NetnsError, NetnsId};
use super::protocol::WorkloadMessage;
use super::status::{InPodMetrics, InPodStatus, ProxyState};
use crate::config::Config;
use crate::proxy::{PodInfo, PodListeners, PodProxy, PodProxyStarter, StartError};
use crate::socket::{SharedSocketFactory, SocketOptions};

/// Why a request was NACKed.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("cannot create sockets in the netns of {pod}: {source}")]
    Netns {
        pod: String,
        #[source]
        source: NetnsError,
    },
    #[error("cannot bind the in-pod listeners of {pod}: {source}; is another process holding them without SO_REUSEPORT (INPOD_PORT_REUSE)?")]
    Listeners {
        pod: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the proxy of {pod}: {source}")]
    Start {
        pod: String,
        #[source]
        source: StartError,
    },
    #[error("KeepWorkload for {uid} after SnapshotSent; Keep is only valid in a snapshot")]
    KeepAfterSnapshot { uid: String },
    #[error("SnapshotSent received twice on one connection")]
    SnapshotTwice,
}

impl PodError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PodError::Netns { .. } => "netns",
            PodError::Listeners { .. } => "listeners",
            PodError::Start { .. } => "start",
            PodError::KeepAfterSnapshot { .. } => "keep_after_snapshot",
            PodError::SnapshotTwice => "snapshot_twice",
        }
    }
}

struct Running {
    pod: PodInfo,
    netns: NetnsId,
    proxy: PodProxy,
    serial: u64,
}

struct Pending {
    pod: PodInfo,
    netns: Netns,
    serial: u64,
}

/// Every pod proxy of this ztunnel.
pub(super) struct Pods {
    config: Arc<Config>,
    starter: Arc<dyn PodProxyStarter>,
    metrics: InPodMetrics,
    status: InPodStatus,
    running: HashMap<String, Running>,
    pending: HashMap<String, Pending>,
    draining: Vec<JoinHandle<()>>,
    snapshot_names: HashSet<String>,
    snapshot_received: bool,
    next_serial: u64,
}

impl Pods {
    pub fn new(
        config: Arc<Config>,
        starter: Arc<dyn PodProxyStarter>,
        metrics: InPodMetrics,
        status: InPodStatus,
    ) -> Pods {
        Pods {
            config,
            starter,
            metrics,
            status,
            running: HashMap::new(),
            pending: HashMap::new(),
            draining: Vec::new(),
            snapshot_names: HashSet::new(),
            snapshot_received: false,
            next_serial: 0,
        }
    }

    /// A new connection: a new snapshot follows.
    pub fn new_connection(&mut self) {
        self.snapshot_names.clear();
        self.snapshot_received = false;
        for (_, p) in self.pending.drain() {
            self.status.remove(p.serial);
        }
        self.update();
    }

    pub fn snapshot_received(&self) -> bool {
        self.snapshot_received
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Applies one request.
    pub fn handle(&mut self, msg: WorkloadMessage) -> Result<(), PodError> {
        let result = match msg {
            WorkloadMessage::Add { pod, netns } => {
                if !self.snapshot_received {
                    self.snapshot_names.insert(pod.uid.clone());
                }
                self.add(pod, netns)
            }
            WorkloadMessage::Keep { uid } => {
                if self.snapshot_received {
                    return Err(PodError::KeepAfterSnapshot { uid });
                }
                tracing::debug!(uid, "pod kept by the snapshot");
                self.snapshot_names.insert(uid);
                Ok(())
            }
            WorkloadMessage::Del { uid } => {
                self.snapshot_names.remove(&uid);
                self.del(&uid);
                Ok(())
            }
            WorkloadMessage::SnapshotSent => self.reconcile(),
        };
        self.update();
        result
    }

    fn add(&mut self, pod: PodInfo, netns: Netns) -> Result<(), PodError> {
        if let Some(running) = self.running.get(&pod.uid) {
            if running.netns == netns.id() {
                tracing::debug!(%pod, "pod already has a proxy in this netns");
                return Ok(());
            }
            tracing::info!(%pod, old = %running.netns, new = %netns.id(), "pod has a new netns; replacing its proxy");
            self.del(&pod.uid);
        }
        if let Some(p) = self.pending.remove(&pod.uid) {
            self.status.remove(p.serial);
        }
        match self.start(&pod, &netns) {
            Ok(proxy) => {
                let serial = self.serial();
                tracing::info!(%pod, netns = %netns.id(), "pod proxy started");
                self.metrics.started.inc();
                self.status.set(serial, &pod, ProxyState::Up);
                let netns = netns.id();
                let uid = pod.uid.clone();
                let running = Running {
                    pod,
                    netns,
                    proxy,
                    serial,
                };
                self.running.insert(uid, running);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(%pod, error = %e, reason = e.reason(), "pod proxy did not start; will retry");
                let serial = self.serial();
                self.status.set(serial, &pod, ProxyState::Pending);
                let uid = pod.uid.clone();
                self.pending.insert(uid, Pending { pod, netns, serial });
                Err(e)
            }
        }
    }

    fn start(&self, pod: &PodInfo, netns: &Netns) -> Result<PodProxy, PodError> {
        let options = SocketOptions {
            mark: self.config.packet_mark,
            reuse_port: self.config.inpod_port_reuse,
            keepalive: Some(self.config.keepalive),
            transparent: true,
        };
        let sockets =
            InPodSockets::new(netns.clone(), options).map_err(|source| PodError::Netns {
                pod: pod.to_string(),
                source,
            })?;
        let listeners = PodListeners::bind(&sockets, &self.config.ports).map_err(|source| {
            PodError::Listeners {
                pod: pod.to_string(),
                source,
            }
        })?;
        let sockets: SharedSocketFactory = Arc::new(sockets);
        self.starter
            .start(pod.clone(), sockets, listeners)
            .map_err(|source| PodError::Start {
                pod: pod.to_string(),
                source,
            })
    }

    fn del(&mut self, uid: &str) {
        if let Some(p) = self.pending.remove(uid) {
            self.status.remove(p.serial);
        }
        match self.running.remove(uid) {
            Some(running) => self.begin_drain(running),
            None => tracing::debug!(uid, "delete of a pod without a proxy"),
        }
    }

    /// Drains every proxy the snapshot did not name.
    fn reconcile(&mut self) -> Result<(), PodError> {
        if self.snapshot_received {
            return Err(PodError::SnapshotTwice);
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|uid| !self.snapshot_names.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            tracing::info!(
                uid,
                "pod not in the node agent's snapshot; draining its proxy"
            );
            self.del(&uid);
        }
        self.snapshot_names.clear();
        self.snapshot_received = true;
        tracing::info!(
            running = self.running.len(),
            pending = self.pending.len(),
            "ZDS snapshot received"
        );
        Ok(())
    }

    /// Tries to start the pending proxies again.
    pub fn retry_pending(&mut self) {
        let pending: Vec<Pending> = self.pending.drain().map(|(_, p)| p).collect();
        for p in pending {
            self.status.remove(p.serial);
            tracing::info!(pod = %p.pod, "retrying pod proxy start");
            // add() puts it back in `pending` on failure.
            let _ = self.add(p.pod, p.netns);
        }
        self.update();
    }

    /// Signals the proxy to drain before returning (so the listeners are being closed when the
    /// request is acked); the rest of the drain runs in a task.
    fn begin_drain(&mut self, running: Running) {
        let Running {
            pod, proxy, serial, ..
        } = running;
        tracing::info!(%pod, "draining pod proxy");
        self.status.set(serial, &pod, ProxyState::Draining);
        let (status, stopped) = (self.status.clone(), self.metrics.stopped.clone());
        let mut drain = Box::pin(proxy.drain(self.config.termination_deadline));
        // The first poll sends the drain signal.
        let first = drain.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        let finish = move || {
            stopped.inc();
            status.remove(serial);
            tracing::debug!(%pod, "pod proxy stopped");
        };
        if first.is_ready() {
            finish();
            return;
        }
        self.draining.retain(|t| !t.is_finished());
        self.draining.push(tokio::spawn(async move {
            drain.await;
            finish();
        }));
    }

    /// Drains every proxy concurrently (shutdown) and waits for all drains to end.
    pub async fn drain_all(mut self) {
        let running: Vec<Running> = self.running.drain().map(|(_, r)| r).collect();
        tracing::info!(
            count = running.len(),
            deadline = ?self.config.termination_deadline,
            "draining every pod proxy"
        );
        for r in running {
            self.begin_drain(r);
        }
        for (_, p) in self.pending.drain() {
            self.status.remove(p.serial);
        }
        self.update();
        for task in std::mem::take(&mut self.draining) {
            let _ = task.await;
        }
    }

    /// Refreshes the count metrics.
    fn update(&self) {
        self.metrics.active.set(gauge(self.running.len()));
        self.metrics.pending.set(gauge(self.pending.len()));
    }

    fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
