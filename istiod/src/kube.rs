//! istiod's controllers that write to the Kubernetes API (when it reads the cluster from the
//! API rather than a YAML directory), each under Istio's leader-election lock so that one
//! replica writes.

use std::future::Future;

use mesh_kube::{LeaderElection, LockKind};
use mesh_runtime::task::AbortOnDrop;
use tokio::sync::watch;

pub mod root_cert;
pub mod validation_config;

/// The lock of the namespace controller (root certificate distribution), a ConfigMap.
pub const NAMESPACE_CONTROLLER_LOCK: &str = "istio-namespace-controller-election";

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
}

impl Controllers {
    /// Runs until `stop` resolves; a leader then releases its locks.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        // Every replica keeps its webhook configurations (the same values: no lock).
        let webhooks = tokio::spawn(validation_config::run(
            self.client.clone(),
            self.revision.clone(),
            self.namespace.clone(),
            self.roots.clone(),
        ));
        let _stop_webhooks = AbortOnDrop(webhooks);
        let root_rx = self.roots.clone();
        let client = self.client.clone();
        let root_certs = move || root_cert::run(client.clone(), root_rx.clone());
        if !self.leader_election {
            tokio::select! {
                _ = stop => {}
                _ = root_certs() => {}
            }
            return;
        }
        LeaderElection::new(
            self.client.clone(),
            LockKind::ConfigMap,
            &self.namespace,
            NAMESPACE_CONTROLLER_LOCK,
            &self.identity,
        )
        .with_holder_key(&self.revision)
        .run(root_certs, stop)
        .await;
    }
}
