//! Writes the model's status conditions (waypoint binding on Services and ServiceEntries,
//! policy acceptance on AuthorizationPolicies) to the objects' `/status`, as Istio does: a
//! server-side apply per object and writer, forced, with the writer's field manager
//! (`istio-ambient-service`, `istio-ambient-ztunnel-policy`, `istio-ambient-waypoint-policy`),
//! `lastTransitionTime` set on each write. A write happens only when a writer's conditions for
//! an object changed; conditions that no longer apply are cleared by applying an empty list.
//! A failed write is retried with the next snapshot (and at most every [`RETRY`]); a vanished
//! object is not an error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mesh_api::{ObjectKey, StatusCondition};
use mesh_source::{KubeWriter, ObjectWriter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;
use tokio::sync::watch;

use crate::metrics::StatusWriteLabels;
use crate::model::status::{StatusWriter, Statuses};
use crate::model::Snapshot;

/// The Lease under which one istiod writes status.
pub const STATUS_LOCK: &str = "istio-status-leader";
/// How soon failed writes are tried again when no new snapshot comes.
pub const RETRY: Duration = Duration::from_secs(5);

/// Runs until `snapshots` closes.
pub async fn run(
    client: kube::Client,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    writes: Family<StatusWriteLabels, Counter>,
) {
    let writers: BTreeMap<StatusWriter, KubeWriter> = StatusWriter::ALL
        .iter()
        .map(|w| {
            (
                *w,
                KubeWriter::new(client.clone(), w.field_manager(), ("", "")),
            )
        })
        .collect();
    // What this leader wrote (without times); empty on taking the lead, so everything is
    // written once.
    let mut written: Statuses = Statuses::new();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        let all_written = sync(&writers, snapshot.statuses(), &mut written, &writes).await;
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY), if !all_written => {}
        }
    }
}

/// Writes what differs from `written`; false if any write failed.
async fn sync(
    writers: &BTreeMap<StatusWriter, KubeWriter>,
    desired: &Statuses,
    written: &mut Statuses,
    writes: &Family<StatusWriteLabels, Counter>,
) -> bool {
    let mut ok = true;
    let stale: Vec<(ObjectKey, StatusWriter)> = written
        .keys()
        .filter(|k| !desired.contains_key(k))
        .cloned()
        .collect();
    for key in stale {
        if write(writers, &key, &[], writes).await {
            written.remove(&key);
        } else {
            ok = false;
        }
    }
    for (key, conditions) in desired {
        if written.get(key) == Some(conditions) {
            continue;
        }
        if write(writers, key, conditions, writes).await {
            written.insert(key.clone(), conditions.clone());
        } else {
            ok = false;
        }
    }
    ok
}

async fn write(
    writers: &BTreeMap<StatusWriter, KubeWriter>,
    (key, writer): &(ObjectKey, StatusWriter),
    conditions: &[StatusCondition],
    writes: &Family<StatusWriteLabels, Counter>,
) -> bool {
    let Some(w) = writers.get(writer) else {
        return true;
    };
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let conditions: Vec<StatusCondition> = conditions
        .iter()
        .map(|c| StatusCondition {
            last_transition_time: Some(now.clone()),
            ..c.clone()
        })
        .collect();
    let status = json!({ "conditions": conditions });
    let result = w.write_status(key, Some(&status)).await;
    let labels = StatusWriteLabels {
        kind: key.kind.as_str().to_string(),
        result: if result.is_ok() { "ok" } else { "error" }.to_string(),
    };
    writes.get_or_create(&labels).inc();
    match result {
        Ok(()) => {
            tracing::debug!(object = %key, field_manager = writer.field_manager(), "status written");
            true
        }
        Err(e) => {
            tracing::warn!(object = %key, field_manager = writer.field_manager(), error = %e, "cannot write status; retrying");
            false
        }
    }
}
