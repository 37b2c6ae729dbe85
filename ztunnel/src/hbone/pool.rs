//! A simple HBONE connection pool: connections keyed by (source identity, destination
//! identities, destination address), each carrying at most
//! [`H2Settings::max_streams_per_connection`] streams. No lock is held across a dial or a
//! handshake, so two concurrent misses for one key may each open a connection; both are kept.
//! Closed connections, and connections unused for `pool_unused_release_timeout`, are dropped
//! at the next checkout for their key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use mesh_identity::Identity;
use rustls::ClientConfig;

use super::client::{ConnectRequest, Connection, StreamSlot, Tunnel};
use super::{H2Settings, HboneError};

/// What makes two tunnels share a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Identity whose certificate the client presents.
    pub src: Identity,
    /// Identities the destination may prove (sorted, deduplicated).
    pub dst_identities: Vec<Identity>,
    /// The HBONE endpoint (`pod IP:15008`).
    pub dst: SocketAddr,
}

impl PoolKey {
    /// A key; `dst_identities` is normalised so that order does not matter.
    pub fn new(src: Identity, mut dst_identities: Vec<Identity>, dst: SocketAddr) -> Self {
        dst_identities.sort();
        dst_identities.dedup();
        PoolKey {
            src,
            dst_identities,
            dst,
        }
    }
}

struct Entry {
    conn: Connection,
    last_used: Instant,
}

/// Pooled HBONE connections.
pub struct Pool {
    settings: H2Settings,
    conns: Mutex<HashMap<PoolKey, Vec<Entry>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("settings", &self.settings)
            .field("keys", &self.lock().len())
            .finish()
    }
}

impl Pool {
    /// An empty pool.
    pub fn new(settings: H2Settings) -> Self {
        Pool {
            settings,
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a tunnel for `request` on a pooled connection for `key`, dialing a new one with
    /// `tls` (source certificate + `key.dst_identities` as expected SANs) when none has room.
    pub async fn open(
        &self,
        key: &PoolKey,
        tls: Arc<ClientConfig>,
        request: &ConnectRequest,
    ) -> Result<Tunnel, HboneError> {
        if let Some((conn, slot)) = self.checkout(key) {
            tracing::trace!(dst = %key.dst, "reusing pooled HBONE connection");
            return conn.open_reserved(request, slot).await;
        }
        let conn = Connection::connect(key.dst, tls, &self.settings).await?;
        let slot = conn.try_reserve(self.max_streams());
        self.lock().entry(key.clone()).or_default().push(Entry {
            conn: conn.clone(),
            last_used: Instant::now(),
        });
        tracing::debug!(dst = %key.dst, src = %key.src, "new pooled HBONE connection");
        match slot {
            Some(slot) => conn.open_reserved(request, slot).await,
            None => conn.open(request).await,
        }
    }

    /// Open (not closed) connections for `key`.
    pub fn connections(&self, key: &PoolKey) -> usize {
        self.lock().get(key).map_or(0, |entries| {
            entries.iter().filter(|e| !e.conn.is_closed()).count()
        })
    }

    fn max_streams(&self) -> usize {
        self.settings.max_streams_per_connection.max(1)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PoolKey, Vec<Entry>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Prunes dead and long-unused connections for `key`, then reserves a stream on the first
    /// connection with room.
    fn checkout(&self, key: &PoolKey) -> Option<(Connection, StreamSlot)> {
        let max = self.max_streams();
        let idle_limit = self.settings.pool_unused_release_timeout;
        let mut conns = self.lock();
        let entries = conns.get_mut(key)?;
        entries.retain(|e| {
            !e.conn.is_closed()
                && (e.conn.active_streams() > 0 || e.last_used.elapsed() < idle_limit)
        });
        let found = entries.iter_mut().find_map(|e| {
            let slot = e.conn.try_reserve(max)?;
            e.last_used = Instant::now();
            Some((e.conn.clone(), slot))
        });
        if entries.is_empty() {
            conns.remove(key);
        }
        found
    }
}
