//! Leader election against the fake API server: one leader among candidates, takeover at
//! once after a clean stop (the lock is released) and only after the lease after a crash, on
//! both lock kinds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mesh_kube::leader::{CONFIGMAP_LEADER_ANNOTATION, LEASE_HOLDER_KEY_ANNOTATION};
use mesh_kube::{LeaderElection, LockKind};
use mesh_testutil::kube_api::{core_types, FakeApiServer};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(1000);
const RETRY: Duration = Duration::from_millis(100);

/// A fake API server with the istio-system namespace.
async fn api() -> FakeApiServer {
    let server = FakeApiServer::start(core_types()).await.expect("fake");
    server
        .seed(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "istio-system"}}))
        .expect("namespace");
    server
}

struct Candidate {
    leading: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// How many times its work started.
    started: Arc<AtomicUsize>,
}

fn candidate(server: &FakeApiServer, kind: LockKind, lock: &str, id: &str) -> Candidate {
    let election = LeaderElection::new(server.client(), kind, "istio-system", lock, id)
        .with_holder_key("default")
        .with_timing(LEASE, RENEW, RETRY);
    let leading = election.leading();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let started = Arc::new(AtomicUsize::new(0));
    let count = started.clone();
    let task = tokio::spawn(election.run(
        move || {
            count.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>()
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    Candidate {
        leading,
        stop: Some(stop_tx),
        task,
        started,
    }
}

async fn wait_leading(c: &mut Candidate, within: Duration) -> bool {
    tokio::time::timeout(within, c.leading.wait_for(|l| *l))
        .await
        .is_ok()
}

fn holder(server: &FakeApiServer, kind: LockKind, lock: &str) -> String {
    match kind {
        LockKind::Lease => server
            .get("coordination.k8s.io/v1", "Lease", "istio-system", lock)
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string)),
        LockKind::ConfigMap => server
            .get("v1", "ConfigMap", "istio-system", lock)
            .and_then(|c| {
                let raw = c["metadata"]["annotations"][CONFIGMAP_LEADER_ANNOTATION].as_str()?;
                let v: serde_json::Value = serde_json::from_str(raw).ok()?;
                v["holderIdentity"].as_str().map(str::to_string)
            }),
    }
    .unwrap_or_default()
}

async fn one_leader_then_takeover(kind: LockKind, lock: &str) {
    let server = api().await;
    let mut a = candidate(&server, kind, lock, "istiod-a");
    assert!(
        wait_leading(&mut a, Duration::from_secs(5)).await,
        "a leads"
    );
    let mut b = candidate(&server, kind, lock, "istiod-b");
    // b never leads while a renews (several lease durations).
    assert!(
        !wait_leading(&mut b, LEASE * 2).await,
        "b waits while a renews"
    );
    assert_eq!(holder(&server, kind, lock), "istiod-a");
    assert_eq!(a.started.load(Ordering::SeqCst), 1);
    assert_eq!(b.started.load(Ordering::SeqCst), 0);

    // a stops cleanly: it releases, and b takes over well within one lease.
    a.stop.take().map(|s| s.send(()));
    a.task.await.expect("a stops");
    assert!(!*a.leading.borrow());
    assert!(
        wait_leading(&mut b, LEASE / 2).await,
        "b takes over at once"
    );
    assert_eq!(holder(&server, kind, lock), "istiod-b");
    assert_eq!(b.started.load(Ordering::SeqCst), 1);

    // b crashes (no release): c must wait for the lease to run out.
    let mut c = candidate(&server, kind, lock, "istiod-c");
    b.task.abort();
    let crashed = std::time::Instant::now();
    assert!(
        wait_leading(&mut c, LEASE * 3).await,
        "c takes over after b's lease"
    );
    assert!(
        crashed.elapsed() >= LEASE - RETRY,
        "c took over after {:?}, before the lease ran out",
        crashed.elapsed()
    );
    assert_eq!(holder(&server, kind, lock), "istiod-c");
    c.stop.take().map(|s| s.send(()));
    c.task.await.expect("c stops");
}

#[tokio::test]
async fn lease_lock_has_one_leader_and_hands_over() {
    one_leader_then_takeover(LockKind::Lease, "istio-status-leader").await;
}

#[tokio::test]
async fn configmap_lock_has_one_leader_and_hands_over() {
    one_leader_then_takeover(LockKind::ConfigMap, "istio-namespace-controller-election").await;
}

#[tokio::test]
async fn the_records_are_client_gos() {
    let server = api().await;
    let mut lease = candidate(
        &server,
        LockKind::Lease,
        "istio-gateway-deployment-default",
        "p1",
    );
    let mut cm = candidate(&server, LockKind::ConfigMap, "istio-leader", "p1");
    assert!(wait_leading(&mut lease, Duration::from_secs(5)).await);
    assert!(wait_leading(&mut cm, Duration::from_secs(5)).await);
    let l = server
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "istio-system",
            "istio-gateway-deployment-default",
        )
        .expect("lease");
    assert_eq!(l["spec"]["holderIdentity"], "p1");
    assert_eq!(l["spec"]["leaseDurationSeconds"], 2);
    assert_eq!(l["spec"]["leaseTransitions"], 0);
    assert!(l["spec"]["renewTime"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert_eq!(
        l["metadata"]["annotations"][LEASE_HOLDER_KEY_ANNOTATION],
        "default"
    );
    let c = server
        .get("v1", "ConfigMap", "istio-system", "istio-leader")
        .expect("configmap");
    let raw = c["metadata"]["annotations"][CONFIGMAP_LEADER_ANNOTATION]
        .as_str()
        .expect("record");
    let record: serde_json::Value = serde_json::from_str(raw).expect("json");
    assert_eq!(record["holderIdentity"], "p1");
    assert_eq!(record["holderKey"], "default");
    assert_eq!(record["leaseDurationSeconds"], 2);
    for key in ["acquireTime", "renewTime"] {
        assert!(
            record[key].as_str().is_some_and(|t| t.ends_with('Z')),
            "{key}"
        );
    }
}
