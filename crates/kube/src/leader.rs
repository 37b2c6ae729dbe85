//! Leader election on a Lease or a ConfigMap, compatible with client-go's (and so with
//! Istio's): the same record, the same timing rules, the same locks.
//!
//! A candidate reads the lock; it takes it when nobody holds it, when it holds it already, or
//! when the holder has not renewed it for a lease duration *as observed by this candidate's own
//! clock* (the record's timestamps are never compared across machines). Writes carry the
//! resource version read, so two candidates can never both win: one gets 409 Conflict. The
//! leader renews every retry period; if it cannot renew within the renew deadline it stops its
//! work and goes back to candidacy. On shutdown it stops its work and releases the lock (empty
//! holder, one-second lease), so that the next candidate takes over at once.
//!
//! Lock records:
//! - Lease (`coordination.k8s.io/v1`): `spec.holderIdentity`, `leaseDurationSeconds`,
//!   `acquireTime`, `renewTime`, `leaseTransitions`; Istio's holder key in the annotation
//!   `leader.istio.io/holder-key`.
//! - ConfigMap: the JSON record in the annotation `control-plane.alpha.kubernetes.io/leader`
//!   (`holderIdentity`, `holderKey`, `leaseDurationSeconds`, `acquireTime`, `renewTime`,
//!   `leaderTransitions`).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The ConfigMap lock's annotation.
pub const CONFIGMAP_LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";
/// Istio's holder key on a Lease lock.
pub const LEASE_HOLDER_KEY_ANNOTATION: &str = "leader.istio.io/holder-key";

/// Istio's timing: a 30 s lease, renewed within 15 s, retried every 7.5 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(30);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(15);
pub const RETRY_PERIOD: Duration = Duration::from_millis(7500);

/// What holds the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Lease,
    ConfigMap,
}

/// Why one attempt on the lock failed (the election itself retries).
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("{kind:?} {namespace}/{name}: {source}")]
    Api {
        kind: LockKind,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind:?} {namespace}/{name}: the leader record is not valid JSON: {detail}")]
    BadRecord {
        kind: LockKind,
        namespace: String,
        name: String,
        detail: String,
    },
}

/// client-go's `LeaderElectionRecord` (with Istio's `holderKey`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(default)]
    pub holder_identity: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub holder_key: String,
    #[serde(default)]
    pub lease_duration_seconds: i32,
    #[serde(default)]
    pub acquire_time: Option<String>,
    #[serde(default)]
    pub renew_time: Option<String>,
    #[serde(default)]
    pub leader_transitions: i32,
}

/// The last record seen and when this candidate first saw it.
struct Observed {
    record: Option<Record>,
    at: Instant,
}

/// One candidate for one lock.
pub struct LeaderElection {
    client: kube::Client,
    kind: LockKind,
    namespace: String,
    name: String,
    identity: String,
    holder_key: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    leading: watch::Sender<bool>,
}

impl LeaderElection {
    /// A candidate `identity` (Istio: the pod name) for the lock `namespace`/`name`.
    pub fn new(
        client: kube::Client,
        kind: LockKind,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Self {
        LeaderElection {
            client,
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            holder_key: String::new(),
            lease_duration: LEASE_DURATION,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY_PERIOD,
            leading: watch::channel(false).0,
        }
    }

    /// Istio's holder key (the revision) written beside the holder.
    pub fn with_holder_key(mut self, key: &str) -> Self {
        self.holder_key = key.to_string();
        self
    }

    /// Other timing than Istio's (tests); `renew_deadline` must be below `lease_duration`.
    pub fn with_timing(mut self, lease: Duration, renew: Duration, retry: Duration) -> Self {
        self.lease_duration = lease;
        self.renew_deadline = renew.min(lease);
        self.retry_period = retry;
        self
    }

    /// Whether this candidate leads now, and every change.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Runs `work` for as long as this candidate leads, each time it becomes leader, until
    /// `stop` resolves; then stops the work and releases the lock.
    pub async fn run<W, F>(self, mut work: W, stop: impl Future<Output = ()>)
    where
        W: FnMut() -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let mut observed = Observed {
            record: None,
            at: Instant::now(),
        };
        tokio::pin!(stop);
        loop {
            // Candidacy.
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    won = self.attempt(&mut observed) => if won { break },
                }
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(jittered(self.retry_period)) => {}
                }
            }
            tracing::info!(lock = %self.lock_name(), identity = %self.identity, "became leader");
            self.leading.send_replace(true);
            let task = tokio::spawn(work());
            let mut renewed = Instant::now();
            let stopped = loop {
                tokio::select! {
                    _ = &mut stop => break true,
                    _ = tokio::time::sleep(self.retry_period) => {}
                }
                let left = self.renew_deadline.saturating_sub(renewed.elapsed());
                let won = tokio::select! {
                    _ = &mut stop => break true,
                    r = tokio::time::timeout(left, self.attempt(&mut observed)) => r.unwrap_or(false),
                };
                if won {
                    renewed = Instant::now();
                } else if renewed.elapsed() >= self.renew_deadline {
                    break false;
                }
            };
            task.abort();
            let _ = task.await;
            self.leading.send_replace(false);
            if stopped {
                self.release().await;
                return;
            }
            tracing::warn!(lock = %self.lock_name(), identity = %self.identity, deadline = ?self.renew_deadline,
                "lost leadership: the lock could not be renewed in time; stopped the work");
        }
    }

    fn lock_name(&self) -> String {
        format!("{:?} {}/{}", self.kind, self.namespace, self.name)
    }

    /// One try to take or renew the lock; errors are logged and count as a lost try.
    async fn attempt(&self, observed: &mut Observed) -> bool {
        match self.try_acquire_or_renew(observed).await {
            Ok(won) => won,
            Err(e) => {
                tracing::warn!(error = %e, "leader election: cannot read or write the lock");
                false
            }
        }
    }

    async fn try_acquire_or_renew(&self, observed: &mut Observed) -> Result<bool, LeaderError> {
        let now = timestamp_now();
        let current = self.get().await?;
        let Some((version, record)) = current else {
            let record = self.fresh_record(&now, 0);
            return match self.write(None, &record).await {
                Ok(()) => {
                    self.observe(observed, Some(record));
                    Ok(true)
                }
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        if observed.record != record {
            self.observe(observed, record.clone());
        }
        let record = record.unwrap_or_default();
        let mine = record.holder_identity == self.identity;
        let lease = Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or(0));
        if !record.holder_identity.is_empty() && !mine && observed.at.elapsed() < lease {
            return Ok(false);
        }
        let next = if mine {
            Record {
                renew_time: Some(now),
                lease_duration_seconds: duration_seconds(self.lease_duration),
                holder_key: self.holder_key.clone(),
                ..record
            }
        } else {
            self.fresh_record(&now, record.leader_transitions + 1)
        };
        match self.write(Some(version), &next).await {
            Ok(()) => {
                self.observe(observed, Some(next));
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn observe(&self, observed: &mut Observed, record: Option<Record>) {
        observed.record = record;
        observed.at = Instant::now();
    }

    fn fresh_record(&self, now: &str, transitions: i32) -> Record {
        Record {
            holder_identity: self.identity.clone(),
            holder_key: self.holder_key.clone(),
            lease_duration_seconds: duration_seconds(self.lease_duration),
            acquire_time: Some(now.to_string()),
            renew_time: Some(now.to_string()),
            leader_transitions: transitions,
        }
    }

    /// Gives the lock up if this candidate still holds it.
    async fn release(&self) {
        let result = async {
            let Some((version, Some(record))) = self.get().await? else {
                return Ok(());
            };
            if record.holder_identity != self.identity {
                return Ok(());
            }
            let now = timestamp_now();
            let released = Record {
                holder_identity: String::new(),
                holder_key: String::new(),
                lease_duration_seconds: 1,
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                leader_transitions: record.leader_transitions,
            };
            self.write(Some(version), &released).await
        }
        .await;
        match result {
            Ok(()) => {
                tracing::info!(lock = %self.lock_name(), identity = %self.identity, "released leadership")
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not release the leader lock; it expires on its own")
            }
        }
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// The lock's resource version and record (`None` when the object does not exist).
    async fn get(&self) -> Result<Option<(String, Option<Record>)>, LeaderError> {
        let found = match self.kind {
            LockKind::Lease => {
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
                let lease = api
                    .get_opt(&self.name)
                    .await
                    .map_err(|e| self.api_error(e))?;
                lease.map(|l| {
                    let record = lease_record(&l);
                    (l.metadata.resource_version.unwrap_or_default(), record)
                })
            }
            LockKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
                let cm = api
                    .get_opt(&self.name)
                    .await
                    .map_err(|e| self.api_error(e))?;
                match cm {
                    None => None,
                    Some(cm) => {
                        let raw = cm
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(CONFIGMAP_LEADER_ANNOTATION))
                            .filter(|s| !s.is_empty());
                        let record = raw
                            .map(|s| serde_json::from_str::<Record>(s))
                            .transpose()
                            .map_err(|e| LeaderError::BadRecord {
                                kind: self.kind,
                                namespace: self.namespace.clone(),
                                name: self.name.clone(),
                                detail: e.to_string(),
                            })?;
                        Some((cm.metadata.resource_version.unwrap_or_default(), record))
                    }
                }
            }
        };
        Ok(found)
    }

    /// Creates the lock (`version` `None`) or replaces it at `version`.
    async fn write(&self, version: Option<String>, record: &Record) -> Result<(), LeaderError> {
        let pp = PostParams::default();
        let mut meta = ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            resource_version: version.clone(),
            ..ObjectMeta::default()
        };
        let result = match self.kind {
            LockKind::Lease => {
                if !record.holder_key.is_empty() {
                    meta.annotations = Some(BTreeMap::from([(
                        LEASE_HOLDER_KEY_ANNOTATION.to_string(),
                        record.holder_key.clone(),
                    )]));
                }
                let lease = Lease {
                    metadata: meta,
                    spec: Some(lease_spec(record)),
                };
                let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
                match version {
                    None => api.create(&pp, &lease).await.map(drop),
                    Some(_) => api.replace(&self.name, &pp, &lease).await.map(drop),
                }
            }
            LockKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
                // Keep whatever else the ConfigMap holds.
                let mut cm = match &version {
                    Some(_) => api
                        .get_opt(&self.name)
                        .await
                        .map_err(|e| self.api_error(e))?
                        .unwrap_or_default(),
                    None => ConfigMap::default(),
                };
                let json = serde_json::to_string(record).unwrap_or_default();
                let mut annotations = cm.metadata.annotations.take().unwrap_or_default();
                annotations.insert(CONFIGMAP_LEADER_ANNOTATION.to_string(), json);
                meta.annotations = Some(annotations);
                meta.labels = cm.metadata.labels.take();
                cm.metadata = meta;
                match version {
                    None => api.create(&pp, &cm).await.map(drop),
                    Some(_) => api.replace(&self.name, &pp, &cm).await.map(drop),
                }
            }
        };
        result.map_err(|e| self.api_error(e))
    }
}

fn is_conflict(e: &LeaderError) -> bool {
    matches!(e, LeaderError::Api { source: kube::Error::Api(s), .. } if s.code == 409)
}

fn duration_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// RFC 3339, seconds (the ConfigMap record's format).
fn timestamp_now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// `retry` plus up to 20% (client-go's jitter factor 1.2), so that candidates spread out.
fn jittered(retry: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    retry + retry.mul_f64(f64::from(nanos % 1000) / 5000.0)
}

fn micro_time(s: &Option<String>) -> Option<MicroTime> {
    s.as_deref()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(MicroTime)
}

fn lease_spec(r: &Record) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(r.holder_identity.clone()),
        lease_duration_seconds: Some(r.lease_duration_seconds),
        acquire_time: micro_time(&r.acquire_time),
        renew_time: micro_time(&r.renew_time),
        lease_transitions: Some(r.leader_transitions),
        ..LeaseSpec::default()
    }
}

fn lease_record(l: &Lease) -> Option<Record> {
    let spec = l.spec.as_ref()?;
    let time = |t: &Option<MicroTime>| t.as_ref().map(|t| t.0.to_string());
    Some(Record {
        holder_identity: spec.holder_identity.clone().unwrap_or_default(),
        holder_key: l
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEASE_HOLDER_KEY_ANNOTATION))
            .cloned()
            .unwrap_or_default(),
        lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
        acquire_time: time(&spec.acquire_time),
        renew_time: time(&spec.renew_time),
        leader_transitions: spec.lease_transitions.unwrap_or(0),
    })
}
