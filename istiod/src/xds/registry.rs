//! The connected proxies, for `/debug/syncz` and the `pilot_xds` gauge.
//!
//! Each connection's [`DeltaStream`] lives here behind a `std::sync::Mutex` that its own task
//! locks only for synchronous bookkeeping (never across an await), so a debug read sees the
//! same state the task works on without copying it on every push.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use mesh_xds::{DeltaStream, NackRecord, TypeStatus};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{json, Value};

use super::node::NodeId;

/// The proxy behind a connection, from its first request.
#[derive(Debug, Clone)]
pub(crate) struct NodeInfo {
    pub raw: String,
    pub parsed: Option<NodeId>,
    pub version: String,
}

/// One connection as the registry sees it.
#[derive(Debug)]
pub(crate) struct ConnectionEntry {
    pub id: String,
    pub peer: Option<SocketAddr>,
    pub connected_at: SystemTime,
    pub node: Mutex<Option<NodeInfo>>,
    pub stream: Mutex<DeltaStream>,
    /// Snapshot version the connection last computed against (0: none yet).
    pub pushed_version: AtomicU64,
}

impl ConnectionEntry {
    pub fn stream(&self) -> MutexGuard<'_, DeltaStream> {
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn node(&self) -> MutexGuard<'_, Option<NodeInfo>> {
        self.node.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn syncz(&self) -> Value {
        let node = self.node().clone();
        let types: Vec<Value> = self.stream().status().iter().map(type_json).collect();
        json!({
            "id": self.id,
            "nodeId": node.as_ref().map(|n| n.raw.clone()),
            "proxyVersion": node.as_ref().map(|n| n.version.clone()),
            "proxy": node.as_ref().and_then(|n| n.parsed.as_ref()).map(|p| json!({
                "type": p.kind.to_string(),
                "ip": p.ip.to_string(),
                "pod": p.pod,
                "namespace": p.namespace,
            })),
            "peer": self.peer.map(|p| p.to_string()),
            "connectedSince": unix_seconds(self.connected_at),
            "snapshotVersion": match self.pushed_version.load(Ordering::Relaxed) {
                0 => None,
                v => Some(v),
            },
            "types": types,
        })
    }
}

fn type_json(t: &TypeStatus) -> Value {
    json!({
        "typeUrl": t.type_url,
        "wildcard": t.wildcard,
        "names": t.names,
        "resourcesKnown": t.resources_known,
        "resourcesSent": t.resources_sent,
        "responsesSent": t.responses_sent,
        "nonceSent": t.nonce_sent,
        "nonceAcked": t.nonce_acked,
        "versionSent": t.version_sent,
        "versionAcked": t.version_acked,
        "nack": t.nack.as_ref().map(nack_json),
        "nackHistory": t.nack_history.iter().map(nack_json).collect::<Vec<_>>(),
    })
}

fn nack_json(n: &NackRecord) -> Value {
    json!({
        "nonce": n.nonce,
        "code": n.code,
        "message": n.message,
        "at": unix_seconds(n.at),
    })
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// All live connections.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    conns: Mutex<BTreeMap<String, Arc<ConnectionEntry>>>,
}

impl Registry {
    fn conns(&self) -> MutexGuard<'_, BTreeMap<String, Arc<ConnectionEntry>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `entry`; it is removed when the returned guard drops.
    pub fn insert(self: &Arc<Self>, entry: Arc<ConnectionEntry>) -> RegistryGuard {
        self.conns().insert(entry.id.clone(), Arc::clone(&entry));
        RegistryGuard {
            registry: Arc::clone(self),
            id: entry.id.clone(),
            connected: None,
        }
    }

    pub fn len(&self) -> usize {
        self.conns().len()
    }

    pub fn syncz(&self) -> Value {
        // Copy the list first so no connection lock is taken under the registry lock.
        let entries: Vec<Arc<ConnectionEntry>> = self.conns().values().cloned().collect();
        Value::Array(entries.iter().map(|e| e.syncz()).collect())
    }
}

/// Removes a connection from the registry (and the `pilot_xds` gauge) when it ends.
#[derive(Debug)]
pub(crate) struct RegistryGuard {
    registry: Arc<Registry>,
    id: String,
    connected: Option<Gauge>,
}

impl RegistryGuard {
    /// Counts the connection in `gauge` until it ends.
    pub fn count_in(&mut self, gauge: Gauge) {
        gauge.inc();
        if let Some(old) = self.connected.replace(gauge) {
            old.dec();
        }
    }
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        self.registry.conns().remove(&self.id);
        if let Some(g) = self.connected.take() {
            g.dec();
        }
    }
}
