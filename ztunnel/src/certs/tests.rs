//! Prefetch of local workloads' certificates against the fake CA.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_identity::Identity;
use mesh_testutil::FakeCa;

use super::*;
use crate::state::SharedState;

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa).expect("identity")
}

/// Polls `check` every 50 ms until it holds or `limit` passes.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

#[tokio::test]
async fn local_workloads_are_prefetched_forgotten_and_gate_readiness() {
    let ca = FakeCa::start().await.expect("start fake CA");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("token"), "token-1\n").expect("write token");
    let config = CaClientConfig {
        root_cert_path: dir.path().join("missing-root.pem"),
        token_path: Some(dir.path().join("token")),
        ..CaClientConfig::new(ca.url())
    };
    let client = GrpcCaClient::new(config).expect("client");
    let manager = CertManager::new(Arc::new(client), CertManagerOptions::default());
    let state = SharedState::default();
    // (pod index, service account, node)
    let yaml = |pods: &[(u8, &str, &str)]| {
        let mut out = String::from("workloads:\n");
        for (i, sa, node) in pods {
            out.push_str(&format!(
                "- uid: c//Pod/default/p{i}\n  name: p{i}\n  namespace: default\n  serviceAccount: {sa}\n  workloadIps: [10.0.0.{i}]\n  node: {node}\n"
            ));
        }
        out
    };
    let load = |y: String| {
        state
            .update(|st| st.load_local_yaml(std::path::Path::new("t.yaml"), &y))
            .expect("load");
    };
    load(yaml(&[(1, "a", "node1"), (2, "b", "node2")]));
    let (ready_tx, mut ready) = tokio::sync::watch::channel(false);
    let (trigger, shutdown) = mesh_runtime::signal::channel();
    let task = tokio::spawn(super::prefetch::run(
        state.clone(),
        manager.clone(),
        "node1".into(),
        ready_tx,
        shutdown.wait(),
    ));
    tokio::time::timeout(Duration::from_secs(5), ready.wait_for(|r| *r))
        .await
        .expect("ready in time")
        .expect("ready");
    assert_eq!(manager.identities(), vec![id("a")], "only node1's identity");
    // A new local workload with a new identity: not ready until its cert is in.
    load(yaml(&[(3, "c", "node1")]));
    let both = eventually(Duration::from_secs(5), || {
        manager.has_valid(&id("a")) && manager.has_valid(&id("c"))
    })
    .await;
    assert!(both, "{:?}", manager.snapshot());
    tokio::time::timeout(Duration::from_secs(5), ready.wait_for(|r| *r))
        .await
        .expect("ready again")
        .expect("ready");
    // The workload of `a` leaves the node: its certificate is dropped.
    state
        .update(|st| st.apply_address("c//Pod/default/p1", None))
        .expect("remove p1");
    assert!(
        eventually(Duration::from_secs(5), || manager.identities()
            == vec![id("c")])
        .await,
        "{:?}",
        manager.identities()
    );
    trigger.trigger();
    task.await.expect("task ends on shutdown");
}
