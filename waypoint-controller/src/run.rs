//! The controller's loop: take the source's events, wait out a burst, reconcile once synced.

use std::future::Future;
use std::time::{Duration, SystemTime};

use mesh_runtime::task::AbortOnDrop;
use mesh_source::{ClusterSource, ObjectWriter, SourceEvent};
use tracing::{info, warn};

use crate::{Controller, ControllerOptions};

/// Quiet time after the last change before a reconcile pass.
pub const DEBOUNCE: Duration = Duration::from_millis(30);

/// Why the loop ended before `stop`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the source stopped")]
    SourceStopped,
}

/// Runs the controller on `source`'s events, writing through `writer`, until `stop`.
pub async fn run<W: ObjectWriter>(
    source: Box<dyn ClusterSource>,
    writer: W,
    opts: ControllerOptions,
    stop: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let mut controller = Controller::new(writer, opts);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let source_task = tokio::spawn(source.run(tx));
    let _abort = AbortOnDrop(source_task);
    tokio::pin!(stop);
    let mut synced = false;
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            () = &mut stop => return Ok(()),
        };
        let Some(event) = event else {
            return Err(RunError::SourceStopped);
        };
        synced |= matches!(event, SourceEvent::Synced);
        let mut changed = controller.observe(event);
        // Take the rest of the burst before reconciling.
        while let Ok(Some(event)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
            synced |= matches!(event, SourceEvent::Synced);
            changed |= controller.observe(event);
        }
        if !synced || !changed {
            continue;
        }
        let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let report = controller.reconcile(&now).await;
        for e in &report.errors {
            warn!("{e}");
        }
        if !report.applied.is_empty() || !report.deleted.is_empty() || !report.statuses.is_empty() {
            info!(
                applied = report.applied.len(),
                deleted = report.deleted.len(),
                statuses = report.statuses.len(),
                skipped = report.skipped.len(),
                "reconciled"
            );
        }
    }
}
