//! Debounce tests. `tokio::time::pause()` needs tokio's `test-util` feature, which istiod's
//! dev-dependencies do not enable; so the timing rule is proven on [`Burst`] with synthetic
//! instants, and the async loop with real time and wide margins (no tight timing assertions).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::*;
use crate::model::testing::pod;
use crate::model::{Model, ModelConfig, Snapshot};

fn cfg(after_ms: u64, max_ms: u64) -> DebounceConfig {
    DebounceConfig {
        after: Duration::from_millis(after_ms),
        max: Duration::from_millis(max_ms),
    }
}

#[test]
fn defaults_are_istios() {
    let c = DebounceConfig::default();
    assert_eq!(c.after, Duration::from_millis(100));
    assert_eq!(c.max, Duration::from_secs(10));
}

#[test]
fn burst_waits_for_quiet_period_after_last_event() {
    let c = cfg(100, 10_000);
    let t0 = Instant::now();
    let mut b = Burst::new(t0);
    assert_eq!(b.deadline(&c), t0 + Duration::from_millis(100));
    b.event(t0 + Duration::from_millis(60));
    assert_eq!(b.deadline(&c), t0 + Duration::from_millis(160));
    b.event(t0 + Duration::from_millis(150));
    assert_eq!(b.deadline(&c), t0 + Duration::from_millis(250));
}

#[test]
fn burst_is_capped_by_max_since_first_event() {
    let c = cfg(100, 300);
    let t0 = Instant::now();
    let mut b = Burst::new(t0);
    for ms in (50..=1000).step_by(50) {
        b.event(t0 + Duration::from_millis(ms));
        assert!(b.deadline(&c) <= t0 + Duration::from_millis(300));
    }
    assert_eq!(b.deadline(&c), t0 + Duration::from_millis(300));
}

type Pushes = Arc<Mutex<Vec<PushStats>>>;

fn start(
    c: DebounceConfig,
) -> (
    mpsc::Sender<ModelEvent>,
    watch::Receiver<Arc<Snapshot>>,
    Pushes,
    tokio::task::JoinHandle<Model>,
) {
    let (tx, rx) = mpsc::channel(1024);
    let (out, watch_rx) = watch::channel(Snapshot::empty());
    let pushes: Pushes = Arc::default();
    let p = pushes.clone();
    let model = Model::new(ModelConfig::default());
    let task = tokio::spawn(run(model, c, rx, out, move |s| {
        p.lock().expect("lock").push(*s)
    }));
    (tx, watch_rx, pushes, task)
}

fn event(i: usize) -> ModelEvent {
    let ip = format!("10.0.{}.{}", i / 250, i % 250 + 1);
    ModelEvent::Applied(pod("ns", &format!("p{i}"), &ip, serde_json::json!({})).into())
}

async fn next_snapshot(rx: &mut watch::Receiver<Arc<Snapshot>>) -> Arc<Snapshot> {
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("a snapshot must be published")
        .expect("publisher alive");
    rx.borrow_and_update().clone()
}

#[tokio::test]
async fn nothing_is_published_before_synced_then_first_snapshot_at_once() {
    let (tx, mut rx, pushes, task) = start(cfg(20, 10_000));
    for i in 0..3 {
        tx.send(event(i)).await.expect("send");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!rx.has_changed().expect("alive"), "published before sync");
    assert_eq!(rx.borrow().version, 0);
    tx.send(ModelEvent::Synced).await.expect("send");
    let snap = next_snapshot(&mut rx).await;
    assert_eq!(snap.version, 1);
    assert_eq!(snap.addresses().len(), 3);
    let stats = pushes.lock().expect("lock")[0];
    assert!(stats.initial);
    assert_eq!(stats.events, 4);
    assert_eq!(stats.recomputed, 3);
    drop(tx);
    task.await.expect("task");
}

#[tokio::test]
async fn burst_within_quiet_period_is_one_push() {
    let (tx, mut rx, pushes, task) = start(cfg(500, 10_000));
    tx.send(ModelEvent::Synced).await.expect("send");
    next_snapshot(&mut rx).await;
    for i in 0..5 {
        tx.send(event(i)).await.expect("send");
    }
    let snap = next_snapshot(&mut rx).await;
    assert_eq!(snap.version, 2);
    assert_eq!(snap.addresses().len(), 5);
    let stats = pushes.lock().expect("lock")[1];
    assert_eq!(stats.events, 5, "the burst must be merged into one push");
    assert!(stats.debounce >= Duration::from_millis(500), "{stats:?}");
    assert!(!stats.initial);
    drop(tx);
    task.await.expect("task");
}

#[tokio::test]
async fn steady_stream_is_pushed_at_max_period() {
    let (tx, mut rx, pushes, task) = start(cfg(300, 600));
    tx.send(ModelEvent::Synced).await.expect("send");
    next_snapshot(&mut rx).await;
    // An event every 20 ms for 2 s never leaves a 300 ms quiet period.
    for i in 0..100 {
        tx.send(event(i)).await.expect("send");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during_stream = pushes.lock().expect("lock").len() - 1;
    assert!(
        during_stream >= 2,
        "max period must force pushes, got {during_stream}"
    );
    drop(tx);
    let model = task.await.expect("task");
    let all = pushes.lock().expect("lock").clone();
    let events: u64 = all.iter().skip(1).map(|s| s.events).sum();
    assert_eq!(events, 100, "every event is in exactly one push");
    assert_eq!(model.version(), all.len() as u64);
}

#[tokio::test]
async fn closing_the_channel_publishes_pending_changes() {
    let (tx, mut rx, _pushes, task) = start(cfg(5_000, 10_000));
    tx.send(ModelEvent::Synced).await.expect("send");
    next_snapshot(&mut rx).await;
    tx.send(event(1)).await.expect("send");
    drop(tx);
    let model = task.await.expect("task");
    assert_eq!(model.version(), 2);
    assert_eq!(rx.borrow().addresses().len(), 1);
}
