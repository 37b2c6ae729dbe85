//! A simple HBONE connection pool: connections keyed by (source identity, destination
//! identities, source IP, destination address), each carrying at most
//! [`H2Settings::max_streams_per_connection`] streams. No pool-wide lock is held across a dial
//! or a handshake; dials for one key are serialized by that key's own lock (as upstream's
//! per-destination write lock), and a caller that waited re-checks for room before dialing,
//! so a burst of connections to one destination opens one HBONE connection per
//! `max_streams_per_connection` streams, not one per caller.
//!
//! A connection whose last stream ends leaves the pool at once when another connection for the
//! same key is still there, and then closes: a key keeps at most one idle connection, so a
//! burst's extra connections (and their file descriptors and buffers) go as soon as the burst
//! ends, as upstream's pool, which never keeps a connection at its stream limit. The one idle
//! connection left, and closed ones, are dropped at the next checkout for their key once
//! unused for `pool_unused_release_timeout`.
//!
//! The source IP is part of the key because, in shared mode, a connection is dialed from the
//! source pod's network namespace ([`Pool::dial`] with that pod's socket factory): two pods
//! must never share one.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use mesh_identity::Identity;
use rustls::ClientConfig;

use super::client::{ConnectRequest, Connection, StreamCount, StreamSlot, Tunnel};
use super::{H2Settings, HboneError};
use crate::socket::{LocalSockets, SocketFactory};

/// What makes two tunnels share a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Identity whose certificate the client presents.
    pub src: Identity,
    /// Identities the destination may prove (sorted, deduplicated).
    pub dst_identities: Vec<Identity>,
    /// IP of the source workload (`None`: connections dialed from ztunnel's own netns).
    pub src_ip: Option<IpAddr>,
    /// The HBONE endpoint (`pod IP:15008`).
    pub dst: SocketAddr,
}

impl PoolKey {
    /// A key for connections dialed from ztunnel's own network namespace; `dst_identities` is
    /// normalised so that order does not matter.
    pub fn new(src: Identity, dst_identities: Vec<Identity>, dst: SocketAddr) -> Self {
        Self::for_source(src, None, dst_identities, dst)
    }

    /// A key for connections on behalf of the workload at `src_ip` (upstream's key).
    pub fn for_source(
        src: Identity,
        src_ip: Option<IpAddr>,
        mut dst_identities: Vec<Identity>,
        dst: SocketAddr,
    ) -> Self {
        dst_identities.sort();
        dst_identities.dedup();
        PoolKey {
            src,
            dst_identities,
            src_ip,
            dst,
        }
    }
}

struct Entry {
    conn: Connection,
    last_used: Instant,
}

type Conns = Mutex<HashMap<PoolKey, Vec<Entry>>>;

/// Pooled HBONE connections.
pub struct Pool {
    settings: H2Settings,
    conns: Arc<Conns>,
    /// One dial at a time per key; entries live while someone holds or waits for them.
    dialing: Mutex<HashMap<PoolKey, Arc<tokio::sync::Mutex<()>>>>,
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
            conns: Arc::new(Mutex::new(HashMap::new())),
            dialing: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a tunnel for `request` on a pooled connection for `key`, dialing a new one (from
    /// ztunnel's own network namespace) with `tls` (source certificate + `key.dst_identities`
    /// as expected SANs) when none has room.
    pub async fn open(
        &self,
        key: &PoolKey,
        tls: Arc<ClientConfig>,
        request: &ConnectRequest,
    ) -> Result<Tunnel, HboneError> {
        if let Some(result) = self.reuse(key, request).await {
            return result;
        }
        self.dial(&LocalSockets::default(), key, tls, request).await
    }

    /// Opens a tunnel on a pooled connection for `key` with room, if there is one.
    pub async fn reuse(
        &self,
        key: &PoolKey,
        request: &ConnectRequest,
    ) -> Option<Result<Tunnel, HboneError>> {
        let (conn, slot) = self.checkout(key)?;
        tracing::trace!(dst = %key.dst, "reusing pooled HBONE connection");
        Some(conn.open_reserved(request, slot).await)
    }

    /// Dials a new connection for `key` with a socket made by `sockets`, pools it and opens
    /// the tunnel on it -- unless, after waiting for another dial to the same key, a pooled
    /// connection has room. Only this key's lock is held while dialing.
    pub async fn dial(
        &self,
        sockets: &dyn SocketFactory,
        key: &PoolKey,
        tls: Arc<ClientConfig>,
        request: &ConnectRequest,
    ) -> Result<Tunnel, HboneError> {
        let key_lock = self.dial_lock(key);
        let result = {
            let _dialing = key_lock.lock().await;
            match self.reuse(key, request).await {
                Some(result) => result,
                None => self.dial_locked(sockets, key, tls, request).await,
            }
        };
        self.release_dial_lock(key, key_lock);
        result
    }

    fn dial_lock(&self, key: &PoolKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut dialing = self.dialing.lock().unwrap_or_else(PoisonError::into_inner);
        dialing.entry(key.clone()).or_default().clone()
    }

    /// Forgets the key's lock once nobody else holds or waits for it (clones are only made
    /// under the map's mutex, so the count cannot grow while it is checked).
    fn release_dial_lock(&self, key: &PoolKey, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut dialing = self.dialing.lock().unwrap_or_else(PoisonError::into_inner);
        if Arc::strong_count(&lock) == 2 {
            dialing.remove(key);
        }
    }

    async fn dial_locked(
        &self,
        sockets: &dyn SocketFactory,
        key: &PoolKey,
        tls: Arc<ClientConfig>,
        request: &ConnectRequest,
    ) -> Result<Tunnel, HboneError> {
        let conn = Connection::connect_via(sockets, key.dst, tls, &self.settings).await?;
        let conns = Arc::downgrade(&self.conns);
        let idle_key = key.clone();
        conn.on_idle(move |streams| {
            if let Some(conns) = conns.upgrade() {
                release_if_spare(&conns, &idle_key, streams);
            }
        });
        let slot = conn.try_reserve(self.max_streams());
        self.lock().entry(key.clone()).or_default().push(Entry {
            conn: conn.clone(),
            last_used: Instant::now(),
        });
        tracing::debug!(dst = %key.dst, src = %key.src, src_ip = ?key.src_ip, "new pooled HBONE connection");
        match slot {
            Some(slot) => conn.open_reserved(request, slot).await,
            None => conn.open(request).await,
        }
    }

    /// Keys with a dial in progress or waited for (for tests).
    pub fn dials_in_progress(&self) -> usize {
        self.dialing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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
        lock(&self.conns)
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

fn lock(conns: &Conns) -> MutexGuard<'_, HashMap<PoolKey, Vec<Entry>>> {
    conns.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection counted by `streams` just carried its last stream: it leaves the pool (and
/// closes, once nothing else holds it) when another open connection for `key` remains. A
/// stream reserved meanwhile (reservations are made under the pool's lock) keeps it.
fn release_if_spare(conns: &Conns, key: &PoolKey, streams: &StreamCount) {
    let mut conns = lock(conns);
    let Some(entries) = conns.get_mut(key) else {
        return;
    };
    let Some(index) = entries.iter().position(|e| e.conn.same_as(streams)) else {
        return;
    };
    let others = entries
        .iter()
        .enumerate()
        .any(|(i, e)| i != index && !e.conn.is_closed());
    if others && entries[index].conn.active_streams() == 0 {
        let spare = entries.swap_remove(index);
        tracing::debug!(dst = %key.dst, src = %key.src, "releasing a spare idle HBONE connection");
        drop(conns);
        drop(spare);
    }
}
