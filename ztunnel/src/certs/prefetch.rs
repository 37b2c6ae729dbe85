//! Keeps the certificates of this node's workloads warm: every identity of a workload whose
//! `node` is this node is prefetched (low priority) as soon as WDS names it, and forgotten when
//! no local workload has it any more. Also tells readiness when every local identity holds a
//! valid certificate.

use std::collections::BTreeSet;
use std::time::Duration;

use mesh_identity::Identity;
use tokio::sync::watch;

use super::CertManager;
use crate::state::SharedState;

/// How often readiness is re-checked while some local certificate is missing.
const READY_POLL: Duration = Duration::from_millis(100);

/// The identities of workloads on `node` (invalid identities are skipped: WDS checked them).
pub fn local_identities(state: &SharedState, node: &str) -> BTreeSet<Identity> {
    state
        .read()
        .workloads()
        .filter(|w| w.node == node)
        .filter_map(|w| w.identity().ok())
        .collect()
}

/// Runs until `shutdown`: prefetches local identities on every state change and publishes
/// `true` on `ready` whenever all of them hold valid certificates.
pub async fn run(
    state: SharedState,
    certs: CertManager,
    node: String,
    ready: watch::Sender<bool>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut changed = state.changed();
    let mut held: BTreeSet<Identity> = BTreeSet::new();
    tokio::pin!(shutdown);
    loop {
        let wanted = local_identities(&state, &node);
        for id in wanted.difference(&held) {
            tracing::debug!(identity = %id, "prefetching certificate of a local workload");
            certs.prefetch(id);
        }
        for id in held.difference(&wanted) {
            certs.forget(id);
        }
        held = wanted;
        let all_ready = held.iter().all(|id| certs.has_valid(id));
        ready.send_if_modified(|r| std::mem::replace(r, all_ready) != all_ready);
        let poll = async {
            if all_ready {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep(READY_POLL).await
            }
        };
        tokio::select! {
            _ = &mut shutdown => return,
            r = changed.changed() => if r.is_err() { return },
            _ = poll => {}
        }
    }
}
