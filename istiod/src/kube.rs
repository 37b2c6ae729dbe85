//! istiod's controllers that write to the Kubernetes API (when it reads the cluster from the
//! API rather than a YAML directory), each under Istio's leader-election lock so that one
//! replica writes.

use std::future::Future;
use std::sync::Arc;

use mesh_kube::{LeaderElection, LockKind};
use mesh_runtime::signal::Shutdown;
use mesh_runtime::task::AbortOnDrop;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::watch;

use crate::metrics::StatusWriteLabels;
use crate::model::Snapshot;

pub mod ca_secret;
pub mod injector_config;
pub mod root_cert;
pub mod status;
pub mod validation_config;

/// The lock of the namespace controller (root certificate distribution), a ConfigMap.
pub const NAMESPACE_CONTROLLER_LOCK: &str = "istio-namespace-controller-election";

/// What the status writer reads (the model's snapshots) and counts its writes in.
pub type StatusInputs = (
    watch::Receiver<Arc<Snapshot>>,
    Family<StatusWriteLabels, Counter>,
);

/// What the writing controllers need.
pub struct Controllers {
    pub client: kube::Client,
    /// This replica's holder identity (the pod name).
    pub identity: String,
    /// Where the locks live (istiod's namespace).
    pub namespace: String,
    pub revision: String,
    /// `ENABLE_LEADER_ELECTION`: false runs every controller in every replica.
    pub leader_election: bool,
    /// The roots workloads trust, told of every change (a rotated root).
    pub roots: watch::Receiver<String>,
    /// `AMBIENT_ENABLE_STATUS`: write status conditions from the model's snapshots.
    pub status: Option<StatusInputs>,
}

impl Controllers {
    /// Runs until `stop`; a leader then releases its locks.
    pub async fn run(self, stop: Shutdown) {
        // Every replica keeps its webhook configurations (the same values: no lock).
        let webhooks = tokio::spawn(validation_config::run(
            self.client.clone(),
            self.revision.clone(),
            self.namespace.clone(),
            self.roots.clone(),
        ));
        let _stop_webhooks = AbortOnDrop(webhooks);
        let injector = tokio::spawn(injector_config::run(
            self.client.clone(),
            self.revision.clone(),
            self.roots.clone(),
        ));
        let _stop_injector = AbortOnDrop(injector);
        let (client, roots) = (self.client.clone(), self.roots.clone());
        let root_certs = move || root_cert::run(client.clone(), roots.clone());
        let root_certs = self.elect(
            LockKind::ConfigMap,
            NAMESPACE_CONTROLLER_LOCK,
            root_certs,
            &stop,
        );
        let status = async {
            if let Some((snapshots, writes)) = self.status.clone() {
                let client = self.client.clone();
                let work = move || status::run(client.clone(), snapshots.clone(), writes.clone());
                self.elect(LockKind::Lease, status::STATUS_LOCK, work, &stop)
                    .await;
            }
        };
        tokio::join!(root_certs, status);
    }

    /// Runs `work` under the lock `name` (or, without leader election, in this replica) until
    /// `stop`.
    async fn elect<W, F>(&self, kind: LockKind, name: &str, mut work: W, stop: &Shutdown)
    where
        W: FnMut() -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        if !self.leader_election {
            tokio::select! {
                _ = stop.clone().wait() => {}
                _ = work() => {}
            }
            return;
        }
        LeaderElection::new(
            self.client.clone(),
            kind,
            &self.namespace,
            name,
            &self.identity,
        )
        .with_holder_key(&self.revision)
        .run(work, stop.clone().wait())
        .await;
    }
}
