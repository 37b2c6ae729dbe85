//! Debounced publication of model snapshots, with Istio's semantics
//! (`PILOT_DEBOUNCE_AFTER`, `PILOT_DEBOUNCE_MAX`, is:pilot/pkg/xds/discovery.go):
//!
//! - nothing is published before the source says it has synced ([`ModelEvent::Synced`]); the
//!   first full snapshot is then published at once;
//! - afterwards, the first event of a burst starts a debounce: the snapshot is built and
//!   published when no event arrived for `after` (quiet period), or when `max` has passed since
//!   that first event, whichever comes first.

use std::sync::Arc;
use std::time::Duration;

use mesh_api::{Object, ObjectKey};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::model::{Model, Snapshot};

/// Istio's default `PILOT_DEBOUNCE_AFTER`.
pub const DEFAULT_DEBOUNCE_AFTER: Duration = Duration::from_millis(100);
/// Istio's default `PILOT_DEBOUNCE_MAX`.
pub const DEFAULT_DEBOUNCE_MAX: Duration = Duration::from_secs(10);

/// One change from the source.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    /// An object was added or changed.
    Applied(std::sync::Arc<Object>),
    /// An object was deleted.
    Deleted(ObjectKey),
    /// The source has delivered its initial state.
    Synced,
    /// The model's settings changed (the mesh config).
    Reconfigure(Box<crate::model::ModelConfig>),
}

/// Debounce timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DebounceConfig {
    /// Quiet period: publish when no event arrived for this long.
    pub after: Duration,
    /// Longest delay after the first event of a burst.
    pub max: Duration,
}

impl Default for DebounceConfig {
    fn default() -> Self {
        DebounceConfig {
            after: DEFAULT_DEBOUNCE_AFTER,
            max: DEFAULT_DEBOUNCE_MAX,
        }
    }
}

/// What one push did; the integrator turns it into metrics
/// (`pilot_debounce_time`, `pilot_xds_push_time`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PushStats {
    /// Version of the published snapshot.
    pub version: u64,
    /// Source events merged into this push.
    pub events: u64,
    /// From the burst's first event to the start of the build.
    pub debounce: Duration,
    /// Time spent building the snapshot.
    pub build: Duration,
    /// Source objects recomputed.
    pub recomputed: u64,
    /// Resources added, updated or removed.
    pub changed: u64,
    /// Whether this is the first snapshot after the source synced.
    pub initial: bool,
}

/// Feeds `events` into `model` and publishes snapshots on `out` until the event channel
/// closes (pending changes are then published first). `on_push` sees every push's stats.
/// Returns the model, for inspection.
pub async fn run(
    mut model: Model,
    cfg: DebounceConfig,
    mut events: mpsc::Receiver<ModelEvent>,
    out: watch::Sender<Arc<Snapshot>>,
    mut on_push: impl FnMut(&PushStats) + Send,
) -> Model {
    let mut synced = false;
    let mut merged = 0u64;
    let mut first_at = Instant::now();
    while let Some(event) = events.recv().await {
        if merged == 0 {
            first_at = Instant::now();
        }
        merged += 1;
        if !apply(&mut model, event, &mut synced) {
            continue; // before sync: only collect
        }
        let initial = model.version() == 0;
        let closed = if initial {
            false
        } else {
            debounce(
                &mut model,
                &cfg,
                &mut events,
                &mut merged,
                first_at,
                &mut synced,
            )
            .await
        };
        publish(&mut model, &out, merged, first_at, initial, &mut on_push);
        merged = 0;
        if closed {
            break;
        }
    }
    model
}

/// Applies one event; returns whether the model may be published (the source has synced).
fn apply(model: &mut Model, event: ModelEvent, synced: &mut bool) -> bool {
    match event {
        ModelEvent::Applied(obj) => model.apply(obj),
        ModelEvent::Deleted(key) => model.delete(&key),
        ModelEvent::Reconfigure(cfg) => model.reconfigure(*cfg),
        ModelEvent::Synced => {
            if !*synced {
                tracing::info!("source synced: publishing the first snapshot");
            }
            *synced = true;
        }
    }
    *synced
}

/// Timing of one burst of events: when it started and when the last event came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Burst {
    first: Instant,
    last: Instant,
}

impl Burst {
    pub(crate) fn new(first: Instant) -> Burst {
        Burst { first, last: first }
    }

    pub(crate) fn event(&mut self, now: Instant) {
        self.last = now;
    }

    /// When to publish if nothing else arrives: end of the quiet period, capped by `max`.
    pub(crate) fn deadline(&self, cfg: &DebounceConfig) -> Instant {
        (self.last + cfg.after).min(self.first + cfg.max)
    }
}

/// Absorbs events until the quiet period or the max delay ends. Returns whether the channel
/// closed.
async fn debounce(
    model: &mut Model,
    cfg: &DebounceConfig,
    events: &mut mpsc::Receiver<ModelEvent>,
    merged: &mut u64,
    first_at: Instant,
    synced: &mut bool,
) -> bool {
    let mut burst = Burst::new(first_at);
    loop {
        match tokio::time::timeout_at(burst.deadline(cfg), events.recv()).await {
            Ok(Some(event)) => {
                *merged += 1;
                apply(model, event, synced);
                burst.event(Instant::now());
            }
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

fn publish(
    model: &mut Model,
    out: &watch::Sender<Arc<Snapshot>>,
    events: u64,
    first_at: Instant,
    initial: bool,
    on_push: &mut impl FnMut(&PushStats),
) {
    let build_start = Instant::now();
    let snapshot = model.build();
    let build_done = Instant::now();
    let s = snapshot.stats();
    let stats = PushStats {
        version: snapshot.version,
        events,
        debounce: build_start.saturating_duration_since(first_at),
        build: build_done.saturating_duration_since(build_start),
        recomputed: s.recomputed,
        changed: s.changed,
        initial,
    };
    tracing::info!(
        version = stats.version,
        events = stats.events,
        debounce_ms = stats.debounce.as_millis() as u64,
        build_ms = stats.build.as_millis() as u64,
        recomputed = stats.recomputed,
        changed = stats.changed,
        initial = stats.initial,
        "push"
    );
    out.send_replace(snapshot);
    on_push(&stats);
}

#[cfg(test)]
mod tests;
