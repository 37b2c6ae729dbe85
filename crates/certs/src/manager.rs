//! The certificate manager: one background task per identity that fetches, refreshes at
//! half-life and retries with backoff; callers read its state through a watch channel, so
//! concurrent callers for one identity share one CA request and never wait on other identities.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use base64::prelude::{Engine, BASE64_STANDARD};
use mesh_identity::Identity;
use serde::Serialize;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use mesh_identity::tls::parse_certs;

use super::x509::{cert_info, rfc3339};
use super::{CaClient, CertError, WorkloadCert};

/// First retry delay after a failed request (docs/compatibility.md, certificates).
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Retry delays double up to this.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(150);
/// Low-priority (prefetch and refresh) requests in flight at once.
pub const DEFAULT_PREFETCH_CONCURRENCY: usize = 4;

/// Tuning of the manager.
#[derive(Clone, Copy, Debug)]
pub struct CertManagerOptions {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub prefetch_concurrency: usize,
}

impl Default for CertManagerOptions {
    fn default() -> Self {
        CertManagerOptions {
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            prefetch_concurrency: DEFAULT_PREFETCH_CONCURRENCY,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Priority {
    /// Prefetch for a local workload: waits for a low-priority slot.
    Low,
    /// Someone is waiting on the data path.
    High,
}

/// What the background task of one identity publishes.
#[derive(Clone, Default)]
struct Slot {
    cert: Option<Arc<WorkloadCert>>,
    last_error: Option<Arc<CertError>>,
    /// A request is queued or running.
    in_flight: bool,
}

struct Entry {
    state: watch::Receiver<Slot>,
    priority: watch::Sender<Priority>,
    task: AbortHandle,
}

struct Inner {
    client: Arc<dyn CaClient>,
    options: CertManagerOptions,
    low_priority: Arc<Semaphore>,
    entries: Mutex<HashMap<Identity, Entry>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let entries = self
            .entries
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for entry in entries.values() {
            entry.task.abort();
        }
    }
}

/// Workload certificates for the identities of this node. Cheap to clone; the background tasks
/// stop when the last clone is dropped. Must be used within a Tokio runtime.
#[derive(Clone)]
pub struct CertManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager")
            .field("options", &self.inner.options)
            .field("identities", &self.lock().len())
            .finish()
    }
}

impl CertManager {
    pub fn new(client: Arc<dyn CaClient>, options: CertManagerOptions) -> CertManager {
        let permits = options.prefetch_concurrency.max(1);
        CertManager {
            inner: Arc::new(Inner {
                client,
                options,
                low_priority: Arc::new(Semaphore::new(permits)),
                entries: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A valid certificate for `identity`: the cached one, or the result of the request in
    /// flight for it (started now at high priority if none is). Fails fast with the last error
    /// while the identity is backing off without a valid certificate.
    pub async fn fetch_certificate(
        &self,
        identity: &Identity,
    ) -> Result<Arc<WorkloadCert>, CertError> {
        let mut state = self.entry(identity, Priority::High);
        loop {
            if let Some(answer) = decide(identity, &state.borrow_and_update(), SystemTime::now()) {
                return answer;
            }
            if state.changed().await.is_err() {
                return Err(CertError::Forgotten {
                    identity: identity.to_string(),
                });
            }
        }
    }

    /// Starts fetching `identity` in the background at low priority (a local workload that may
    /// need it soon). No effect if the identity is already held.
    pub fn prefetch(&self, identity: &Identity) {
        self.entry(identity, Priority::Low);
    }

    /// Stops refreshing `identity` and drops its certificate (no pod on the node needs it).
    /// Returns whether it was held.
    pub fn forget(&self, identity: &Identity) -> bool {
        let removed = self.lock().remove(identity);
        if let Some(entry) = &removed {
            entry.task.abort();
            tracing::debug!(%identity, "forgot workload certificate");
        }
        removed.is_some()
    }

    /// Whether a currently valid certificate for `identity` is held (never starts a request).
    pub fn has_valid(&self, identity: &Identity) -> bool {
        self.lock().get(identity).is_some_and(|entry| {
            entry
                .state
                .borrow()
                .cert
                .as_ref()
                .is_some_and(|c| c.is_valid_at(SystemTime::now()))
        })
    }

    /// The identities held (in any state).
    pub fn identities(&self) -> Vec<Identity> {
        let mut ids: Vec<Identity> = self.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The held certificates for `/config_dump`, sorted by identity.
    pub fn snapshot(&self) -> Vec<CertDump> {
        let entries = self.lock();
        let mut dump: Vec<CertDump> = entries
            .iter()
            .map(|(id, entry)| CertDump::new(id, &entry.state.borrow()))
            .collect();
        drop(entries);
        dump.sort_by(|a, b| a.identity.cmp(&b.identity));
        dump
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Identity, Entry>> {
        self.inner
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state of `identity`, creating its task if needed and raising its priority.
    fn entry(&self, identity: &Identity, priority: Priority) -> watch::Receiver<Slot> {
        let mut entries = self.lock();
        if let Some(entry) = entries.get(identity) {
            entry.priority.send_if_modified(|p| {
                let raise = *p < priority;
                if raise {
                    *p = priority;
                }
                raise
            });
            return entry.state.clone();
        }
        let (state_tx, state_rx) = watch::channel(Slot {
            in_flight: true,
            ..Slot::default()
        });
        let (priority_tx, priority_rx) = watch::channel(priority);
        let worker = Worker {
            identity: identity.clone(),
            client: self.inner.client.clone(),
            options: self.inner.options,
            low_priority: self.inner.low_priority.clone(),
            state: state_tx,
            priority: priority_rx,
        };
        let task = tokio::spawn(worker.run()).abort_handle();
        entries.insert(
            identity.clone(),
            Entry {
                state: state_rx.clone(),
                priority: priority_tx,
                task,
            },
        );
        state_rx
    }
}

/// What a caller gets from the current state, or `None` to wait for the next change.
fn decide(
    identity: &Identity,
    slot: &Slot,
    now: SystemTime,
) -> Option<Result<Arc<WorkloadCert>, CertError>> {
    match slot.cert.as_ref() {
        Some(cert) if cert.is_valid_at(now) => return Some(Ok(cert.clone())),
        _ if slot.in_flight => return None,
        _ => {}
    }
    if let Some(last) = &slot.last_error {
        return Some(Err(CertError::Unavailable {
            identity: identity.to_string(),
            last: last.clone(),
        }));
    }
    slot.cert.as_ref().map(|_| {
        Err(CertError::Expired {
            identity: identity.to_string(),
        })
    })
}

/// When to refresh: half-way through the lifetime. The lifetime is counted from `not_before`, or
/// from `received` when the CA backdated `not_before` (which only matters for short TTLs).
pub(super) fn refresh_delay(cert: &WorkloadCert, received: SystemTime) -> Duration {
    let start = cert.not_before.max(received);
    let lifetime = cert.not_after.duration_since(start).unwrap_or_default();
    let refresh_at = start + lifetime / 2;
    refresh_at.duration_since(received).unwrap_or_default()
}

/// The next retry delay: doubling, capped.
pub(super) fn next_backoff(current: Duration, max: Duration) -> Duration {
    current.saturating_mul(2).min(max)
}

/// The background task of one identity.
struct Worker {
    identity: Identity,
    client: Arc<dyn CaClient>,
    options: CertManagerOptions,
    low_priority: Arc<Semaphore>,
    state: watch::Sender<Slot>,
    priority: watch::Receiver<Priority>,
}

impl Worker {
    async fn run(mut self) {
        let mut backoff = self.options.initial_backoff;
        loop {
            self.state.send_modify(|s| s.in_flight = true);
            let permit = self.wait_turn().await;
            let result = self.client.fetch(&self.identity).await;
            drop(permit);
            let wait = match result {
                Ok(cert) => {
                    backoff = self.options.initial_backoff;
                    self.publish(cert)
                }
                Err(error) => {
                    let wait = backoff;
                    backoff = next_backoff(backoff, self.options.max_backoff);
                    self.record_failure(error, wait)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits for a low-priority slot unless a caller is waiting and no valid certificate is held;
    /// an on-path caller arriving meanwhile jumps the queue.
    async fn wait_turn(&mut self) -> Option<OwnedSemaphorePermit> {
        let has_valid = self
            .state
            .borrow()
            .cert
            .as_ref()
            .is_some_and(|c| c.is_valid_at(SystemTime::now()));
        if has_valid {
            return self.low_priority.clone().acquire_owned().await.ok();
        }
        if *self.priority.borrow() == Priority::High {
            return None;
        }
        let semaphore = self.low_priority.clone();
        tokio::select! {
            permit = semaphore.acquire_owned() => permit.ok(),
            _ = self.priority.wait_for(|p| *p == Priority::High) => None,
        }
    }

    fn publish(&self, cert: WorkloadCert) -> Duration {
        let wait = refresh_delay(&cert, SystemTime::now());
        tracing::info!(
            identity = %self.identity,
            serial = %cert.serial,
            expires = %rfc3339(cert.not_after),
            refresh_in_s = wait.as_secs(),
            "fetched workload certificate"
        );
        let cert = Arc::new(cert);
        self.state.send_modify(|s| {
            s.cert = Some(cert);
            s.last_error = None;
            s.in_flight = false;
        });
        wait
    }

    fn record_failure(&self, error: CertError, retry_in: Duration) -> Duration {
        tracing::warn!(
            identity = %self.identity,
            reason = error.reason(),
            error = %error,
            retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX),
            "failed to fetch workload certificate"
        );
        let error = Arc::new(error);
        self.state.send_modify(|s| {
            s.last_error = Some(error);
            s.in_flight = false;
        });
        retry_in
    }
}

/// One identity in `/config_dump`'s `certificates`, in upstream ztunnel's shape.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CertDump {
    pub identity: String,
    /// `Initializing`, `Available` or `Unavailable: <last error>`.
    pub state: String,
    /// The leaf first, then intermediates; empty unless `Available`.
    pub cert_chain: Vec<CertDumpEntry>,
    /// The roots: the last element of the CA's response.
    pub root_certs: Vec<CertDumpEntry>,
}

/// One certificate of a chain in `/config_dump`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CertDumpEntry {
    /// Standard base64 of the certificate's PEM text (how upstream's Go structs carry bytes).
    pub pem: String,
    /// Decimal.
    pub serial_number: String,
    /// RFC 3339, whole seconds, UTC.
    pub valid_from: String,
    pub expiration_time: String,
}

impl CertDump {
    /// A certificate that is still valid is `Available` even when its last refresh failed:
    /// it is what connections use (as upstream, which keeps serving it).
    fn new(identity: &Identity, slot: &Slot) -> CertDump {
        let usable = slot
            .cert
            .as_ref()
            .filter(|cert| cert.is_valid_at(SystemTime::now()));
        let state = match (usable, &slot.last_error) {
            (Some(_), _) => "Available".to_string(),
            (None, Some(error)) => format!("Unavailable: {error}"),
            (None, None) => "Initializing".to_string(),
        };
        let (cert_chain, root_certs) = usable.map(|cert| dump_chain(cert)).unwrap_or_default();
        CertDump {
            identity: identity.to_string(),
            state,
            cert_chain,
            root_certs,
        }
    }
}

/// The chain split as upstream shows it: the CA response's last element holds the roots,
/// everything before it the leaf and the intermediates.
fn dump_chain(cert: &WorkloadCert) -> (Vec<CertDumpEntry>, Vec<CertDumpEntry>) {
    let entries = |pems: &[String]| -> Vec<CertDumpEntry> {
        pems.iter()
            .flat_map(|pem| pem_blocks(pem))
            .filter_map(|pem| {
                let der = parse_certs(&pem, "certificate").ok()?.into_iter().next()?;
                let info = cert_info(der.as_ref()).ok()?;
                Some(CertDumpEntry {
                    pem: BASE64_STANDARD.encode(pem.as_bytes()),
                    serial_number: info.serial,
                    valid_from: rfc3339(info.not_before),
                    expiration_time: rfc3339(info.not_after),
                })
            })
            .collect()
    };
    match cert.chain.split_last() {
        Some((roots, chain)) if !chain.is_empty() => {
            (entries(chain), entries(std::slice::from_ref(roots)))
        }
        _ => (entries(&cert.chain), Vec::new()),
    }
}

/// The `BEGIN CERTIFICATE` .. `END CERTIFICATE` blocks of a PEM text.
fn pem_blocks(text: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        blocks.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    blocks
}
