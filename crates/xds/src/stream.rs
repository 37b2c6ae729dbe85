//! The server half of one delta ADS stream: per type URL, what the client subscribed to, which
//! resource versions it has, and which nonces were sent, acknowledged or rejected.
//!
//! Protocol rules (as istiod's `pilot/pkg/xds/delta.go` applies them):
//! - the first request of a type opens it: wildcard if it names no resources or names `*`;
//!   `initial_resource_versions` seed what the client has (reconnect); it is always answered;
//! - a request with `error_detail` is a NACK: kept (with history) until the next ACK, no answer;
//! - a request whose `response_nonce` is not the last nonce sent is stale and ignored;
//! - otherwise subscription changes are applied (`*` toggles wildcard), a non-empty nonce is an
//!   ACK, and a changed subscription is answered.
//!
//! Responses carry the subscribed resources whose version differs from what the client has, and
//! in `removed_resources` the names the client has that are gone or no longer subscribed, plus
//! requested names that resolve to nothing (so an on-demand client stops waiting).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

use crate::response::SharedResponse;
use crate::{ChangeSet, Resource, ResourceMap, ResourceView};

/// The resource name that toggles a wildcard subscription.
pub const WILDCARD: &str = "*";

/// How many NACKs per type are kept for debugging.
const NACK_HISTORY: usize = 8;

/// Nonces are unique within the process: a per-process counter, prefixed by the snapshot version.
static NONCE_COUNTER: AtomicU64 = AtomicU64::new(1);

static NO_CHANGES: BTreeSet<String> = BTreeSet::new();

/// A request this stream cannot interpret.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(
        "delta request without type_url: every DeltaDiscoveryRequest must name its resource type \
         (e.g. {}); is the client speaking ADS?",
        mesh_proto::type_url::ADDRESS
    )]
    MissingTypeUrl,
}

impl StreamError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StreamError::MissingTypeUrl => "missing_type_url",
        }
    }
}

/// What a request meant for the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    /// First request of this type on the stream.
    Initial,
    /// First request of this type, carrying `initial_resource_versions` (`known` entries).
    Reconnect { known: usize },
    /// ACK of the last response (possibly with subscription changes).
    Ack,
    /// NACK: the client rejected a response.
    Nack { code: i32, message: String },
    /// A `response_nonce` that is not the last one sent: ignored.
    StaleNonce { nonce: String },
    /// A spontaneous request (no nonce): subscription changes only.
    Subscription,
}

/// The classification of a request and whether it must be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestOutcome {
    pub kind: RequestKind,
    /// True if the caller should now call [`DeltaStream::respond`] for the request's type.
    pub respond: bool,
}

/// One rejected response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NackRecord {
    pub nonce: String,
    pub code: i32,
    pub message: String,
    pub at: SystemTime,
}

/// A debug view of one type on a stream (for `/debug/syncz`).
#[derive(Debug, Clone, PartialEq)]
pub struct TypeStatus {
    pub type_url: String,
    pub wildcard: bool,
    /// Explicitly subscribed names (including aliases as the client wrote them).
    pub names: Vec<String>,
    /// How many resources the client has, as far as the server knows.
    pub resources_known: usize,
    pub resources_sent: u64,
    pub responses_sent: u64,
    pub nonce_sent: Option<String>,
    pub nonce_acked: Option<String>,
    /// Snapshot version of the last response sent / acknowledged.
    pub version_sent: Option<u64>,
    pub version_acked: Option<u64>,
    /// The NACK in force (cleared by the next ACK).
    pub nack: Option<NackRecord>,
    /// Recent NACKs, oldest first, kept after ACKs.
    pub nack_history: Vec<NackRecord>,
}

/// Per-type state on one stream.
#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the client has. A persistent map of the same resources the snapshot holds: for a
    /// wildcard subscriber it is the snapshot's own map after every response, so 500 clients of a
    /// 10,000-workload mesh share one copy instead of holding 500.
    known: ResourceMap,
    /// Names (re)subscribed since the last response: sent even if the client has them, and
    /// reported removed if they resolve to nothing.
    requested: BTreeSet<String>,
    respond_pending: bool,
    nonce_sent: Option<String>,
    version_sent: Option<u64>,
    nonce_acked: Option<String>,
    version_acked: Option<u64>,
    nack: Option<NackRecord>,
    nack_history: VecDeque<NackRecord>,
    resources_sent: u64,
    responses_sent: u64,
}

/// What one response carries before it is stamped with a nonce.
#[derive(Debug, Default)]
struct Delta {
    resources: Vec<Arc<Resource>>,
    removed: BTreeSet<String>,
}

/// The server half of one delta ADS stream. See the module docs for the rules.
#[derive(Debug, Default)]
pub struct DeltaStream {
    types: BTreeMap<String, TypeState>,
}

impl DeltaStream {
    pub fn new() -> DeltaStream {
        DeltaStream::default()
    }

    /// Records one request. The caller decides beforehand whether the type is served at all
    /// (requests for unserved types should not reach the stream).
    pub fn handle_request(
        &mut self,
        req: &DeltaDiscoveryRequest,
    ) -> Result<RequestOutcome, StreamError> {
        if req.type_url.is_empty() {
            return Err(StreamError::MissingTypeUrl);
        }
        match self.types.get_mut(&req.type_url) {
            Some(state) => Ok(state.follow_up(req)),
            None => {
                let kind = if req.initial_resource_versions.is_empty() {
                    RequestKind::Initial
                } else {
                    RequestKind::Reconnect {
                        known: req.initial_resource_versions.len(),
                    }
                };
                self.types
                    .insert(req.type_url.clone(), TypeState::open(req));
                Ok(RequestOutcome {
                    kind,
                    respond: true,
                })
            }
        }
    }

    /// Computes the response for one type against `snapshot`.
    ///
    /// `changed` narrows a wildcard comparison to the names that changed since the last push
    /// (`None`: compare everything). A pending request is always answered, even with an empty
    /// response; otherwise `None` means there is nothing to send. A returned response is
    /// recorded as sent: the caller must send it (or drop the stream).
    pub fn respond<S: ResourceView + ?Sized>(
        &mut self,
        type_url: &str,
        snapshot: &S,
        changed: Option<&BTreeSet<String>>,
    ) -> Option<DeltaDiscoveryResponse> {
        self.respond_shared(type_url, snapshot, changed)
            .map(SharedResponse::into_proto)
    }

    /// [`DeltaStream::respond`], with the resources still shared with the snapshot (to encode
    /// them without copies, see [`SharedResponse::frames`]).
    pub fn respond_shared<S: ResourceView + ?Sized>(
        &mut self,
        type_url: &str,
        snapshot: &S,
        changed: Option<&BTreeSet<String>>,
    ) -> Option<SharedResponse> {
        let delta = self
            .types
            .get_mut(type_url)?
            .compute(type_url, snapshot, changed)?;
        if type_url == mesh_proto::type_url::CLUSTER {
            self.rewarm_endpoints(&delta.resources);
        }
        let state = self.types.get_mut(type_url)?;
        Some(state.record_sent(type_url, snapshot.version(), delta))
    }

    /// An EDS cluster Envoy receives again (changed) is rebuilt and warms until its
    /// ClusterLoadAssignment arrives; Envoy does not ask again for a name it is already
    /// subscribed to, so the assignment of each one goes out again, even unchanged, right
    /// after the clusters (the types are pushed in type URL order: clusters, then endpoints).
    fn rewarm_endpoints(&mut self, clusters: &[Arc<Resource>]) {
        use mesh_proto::envoy::pb::envoy::config::cluster::v3::{
            cluster::{ClusterDiscoveryType, DiscoveryType},
            Cluster,
        };
        use prost::Message;
        let Some(eds) = self.types.get_mut(mesh_proto::type_url::ENDPOINT) else {
            return;
        };
        for res in clusters {
            let Ok(c) = Cluster::decode(res.body.value.as_slice()) else {
                continue;
            };
            let eds_type = ClusterDiscoveryType::Type(DiscoveryType::Eds as i32);
            if c.cluster_discovery_type != Some(eds_type) {
                continue;
            }
            let name = (c.eds_cluster_config.map(|e| e.service_name))
                .filter(|n| !n.is_empty())
                .unwrap_or(c.name);
            if eds.known.contains_key(&name) && (eds.wildcard || eds.names.contains(&name)) {
                eds.requested.insert(name);
            }
        }
    }

    /// The size a full response of `type_url` would have now, as (resources, about how many
    /// bytes; see [`Resource::wire_len`]): the whole map for a wildcard subscription, the
    /// subscribed resources otherwise; nothing for a type this stream has not opened.
    pub fn full_size<S: ResourceView + ?Sized>(
        &self,
        type_url: &str,
        snapshot: &S,
    ) -> (usize, usize) {
        let (Some(state), Some(map)) = (self.types.get(type_url), snapshot.resources(type_url))
        else {
            return (0, 0);
        };
        let wire_len = |r: &Arc<Resource>| r.wire_len();
        if state.wildcard {
            return (map.len(), map.values().map(wire_len).sum());
        }
        let names: BTreeSet<String> = state
            .names
            .iter()
            .flat_map(|n| resolve(snapshot, type_url, map, n))
            .collect();
        let bytes = names.iter().filter_map(|n| map.get(n)).map(wire_len).sum();
        (names.len(), bytes)
    }

    /// Computes the responses for every open type after a snapshot change. `changes` is
    /// `XdsSnapshot::changes_since` of the last pushed version (`None`: compare everything).
    pub fn push<S: ResourceView + ?Sized>(
        &mut self,
        snapshot: &S,
        changes: Option<&ChangeSet>,
    ) -> Vec<DeltaDiscoveryResponse> {
        self.push_shared(snapshot, changes)
            .into_iter()
            .map(SharedResponse::into_proto)
            .collect()
    }

    /// [`DeltaStream::push`], with the resources still shared with the snapshot.
    pub fn push_shared<S: ResourceView + ?Sized>(
        &mut self,
        snapshot: &S,
        changes: Option<&ChangeSet>,
    ) -> Vec<SharedResponse> {
        let type_urls: Vec<String> = self.types.keys().cloned().collect();
        type_urls
            .iter()
            .filter_map(|type_url| {
                let changed = changes.map(|c| c.get(type_url).unwrap_or(&NO_CHANGES));
                self.respond_shared(type_url, snapshot, changed)
            })
            .collect()
    }

    /// The type URLs opened on this stream.
    pub fn type_urls(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }

    /// What the client has of one type, as far as the server knows (name -> version).
    pub fn known(&self, type_url: &str) -> Option<BTreeMap<String, String>> {
        self.types.get(type_url).map(|t| {
            t.known
                .iter()
                .map(|(k, r)| (k.clone(), r.version.clone()))
                .collect()
        })
    }

    /// A debug view of every open type.
    pub fn status(&self) -> Vec<TypeStatus> {
        self.types
            .iter()
            .map(|(type_url, t)| TypeStatus {
                type_url: type_url.clone(),
                wildcard: t.wildcard,
                names: t.names.iter().cloned().collect(),
                resources_known: t.known.len(),
                resources_sent: t.resources_sent,
                responses_sent: t.responses_sent,
                nonce_sent: t.nonce_sent.clone(),
                nonce_acked: t.nonce_acked.clone(),
                version_sent: t.version_sent,
                version_acked: t.version_acked,
                nack: t.nack.clone(),
                nack_history: t.nack_history.iter().cloned().collect(),
            })
            .collect()
    }
}

impl TypeState {
    /// State for the first request of a type.
    fn open(req: &DeltaDiscoveryRequest) -> TypeState {
        let mut state = TypeState {
            wildcard: req.resource_names_subscribe.is_empty(),
            known: req
                .initial_resource_versions
                .iter()
                .map(|(k, v)| (k.clone(), Arc::new(Resource::placeholder(k, v))))
                .collect(),
            respond_pending: true,
            ..TypeState::default()
        };
        state.apply_subscription(req);
        // Names the client already holds need not be forced out again; if they are gone they
        // are reported removed through `known`.
        let known = &state.known;
        state.requested.retain(|n| !known.contains_key(n));
        state
    }

    fn follow_up(&mut self, req: &DeltaDiscoveryRequest) -> RequestOutcome {
        if let Some(status) = &req.error_detail {
            self.record_nack(&req.response_nonce, status.code, &status.message);
            return RequestOutcome {
                kind: RequestKind::Nack {
                    code: status.code,
                    message: status.message.clone(),
                },
                respond: false,
            };
        }
        let nonce = &req.response_nonce;
        if !nonce.is_empty() && self.nonce_sent.as_ref() != Some(nonce) {
            // Not an ACK of the latest response, but the names it asks for still count: a
            // state-of-the-world client changes its subscription in whatever request it sends
            // next, and would not repeat the change.
            let changed = self.apply_subscription(req);
            self.respond_pending |= changed;
            return RequestOutcome {
                kind: RequestKind::StaleNonce {
                    nonce: nonce.clone(),
                },
                respond: changed,
            };
        }
        let changed = self.apply_subscription(req);
        let kind = if nonce.is_empty() {
            RequestKind::Subscription
        } else {
            self.nonce_acked = Some(nonce.clone());
            self.version_acked = self.version_sent;
            self.nack = None;
            RequestKind::Ack
        };
        self.respond_pending |= changed;
        RequestOutcome {
            kind,
            respond: changed,
        }
    }

    /// Applies `resource_names_subscribe` then `_unsubscribe`; true if anything was asked for.
    /// Re-subscribing a name counts: the client wants it (again), as the xDS spec allows.
    fn apply_subscription(&mut self, req: &DeltaDiscoveryRequest) -> bool {
        let mut changed = false;
        for name in &req.resource_names_subscribe {
            changed = true;
            if name == WILDCARD {
                self.wildcard = true;
            } else {
                self.names.insert(name.clone());
                self.requested.insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == WILDCARD {
                changed |= std::mem::replace(&mut self.wildcard, false);
            } else if self.names.remove(name) {
                self.requested.remove(name);
                changed = true;
            }
        }
        changed
    }

    fn record_nack(&mut self, nonce: &str, code: i32, message: &str) {
        let record = NackRecord {
            nonce: nonce.to_string(),
            code,
            message: message.to_string(),
            at: SystemTime::now(),
        };
        if self.nack_history.len() == NACK_HISTORY {
            self.nack_history.pop_front();
        }
        self.nack_history.push_back(record.clone());
        self.nack = Some(record);
    }

    /// The resources and removals to send; `None` if there is nothing to say.
    fn compute<S: ResourceView + ?Sized>(
        &mut self,
        type_url: &str,
        snapshot: &S,
        changed: Option<&BTreeSet<String>>,
    ) -> Option<Delta> {
        let force = self.respond_pending;
        if !force && self.requested.is_empty() && changed.is_some_and(BTreeSet::is_empty) {
            return None;
        }
        let empty = ResourceMap::new();
        let map = snapshot.resources(type_url).unwrap_or(&empty);
        let resolve = |name: &str| resolve(snapshot, type_url, map, name);
        let subscribed: BTreeSet<String> = if self.wildcard {
            BTreeSet::new()
        } else {
            self.names.iter().flat_map(|n| resolve(n)).collect()
        };
        let forced: BTreeSet<String> = self.requested.iter().flat_map(|n| resolve(n)).collect();
        let mut delta = Delta::default();
        let candidates = match (self.wildcard, changed) {
            // Everything is compared: walk the client's map and the snapshot's side by side.
            // The client's map is then replaced by the snapshot's below.
            (true, None) => {
                diff_all(&self.known, map, &forced, &mut delta);
                BTreeSet::new()
            }
            (true, Some(changed)) => forced.iter().chain(changed).cloned().collect(),
            (false, _) => self.explicit_candidates(&subscribed, &forced),
        };
        for name in candidates {
            let wanted = self.wildcard || subscribed.contains(&name);
            match map.get(&name).filter(|_| wanted) {
                Some(res) => {
                    let held = self.known.get(&name).map(|r| &r.version);
                    if forced.contains(&name) || held != Some(&res.version) {
                        self.known.insert(name, Arc::clone(res));
                        delta.resources.push(Arc::clone(res));
                    }
                }
                None => {
                    if self.known.remove(&name).is_some() {
                        delta.removed.insert(name);
                    }
                }
            }
        }
        for name in std::mem::take(&mut self.requested) {
            if resolve(&name).is_empty() {
                delta.removed.insert(name);
            }
        }
        if self.wildcard {
            // After this response the client holds exactly the snapshot's map for this type:
            // share it rather than keeping a private copy.
            self.known = map.clone();
        }
        self.respond_pending = false;
        let empty_delta = delta.resources.is_empty() && delta.removed.is_empty();
        (force || !empty_delta).then_some(delta)
    }

    /// The names to compare for explicit subscriptions: what is subscribed or asked for again,
    /// plus what the client has (bounded by the subscription).
    fn explicit_candidates(
        &self,
        subscribed: &BTreeSet<String>,
        forced: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = forced.clone();
        out.extend(subscribed.iter().cloned());
        out.extend(self.known.keys().cloned());
        out
    }

    fn record_sent(&mut self, type_url: &str, version: u64, delta: Delta) -> SharedResponse {
        let counter = NONCE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let nonce = format!("{version}-{counter:x}");
        self.nonce_sent = Some(nonce.clone());
        self.version_sent = Some(version);
        self.responses_sent += 1;
        self.resources_sent += delta.resources.len() as u64;
        SharedResponse {
            system_version_info: version.to_string(),
            resources: delta.resources,
            type_url: type_url.to_string(),
            removed_resources: delta.removed.into_iter().collect(),
            nonce,
        }
    }
}

/// The delta that turns `known` (what a wildcard client holds) into `map`: added resources,
/// resources whose version changed, removed names, and the `forced` names (asked for again)
/// even if unchanged. Subtrees the two persistent maps share are skipped, and nothing is
/// collected or copied but the delta: with 50,000 resources this is what a thousand initial
/// subscriptions cost.
fn diff_all(known: &ResourceMap, map: &ResourceMap, forced: &BTreeSet<String>, delta: &mut Delta) {
    use imbl::ordmap::DiffItem;
    for item in known.diff(map) {
        match item {
            DiffItem::Add(_, res) => delta.resources.push(Arc::clone(res)),
            DiffItem::Update {
                old: (_, held),
                new: (_, res),
            } => {
                if held.version != res.version {
                    delta.resources.push(Arc::clone(res));
                }
            }
            DiffItem::Remove(name, _) => {
                delta.removed.insert(name.clone());
            }
        }
    }
    for name in forced {
        if let Some(res) = map.get(name) {
            if known
                .get(name)
                .is_some_and(|held| held.version == res.version)
            {
                delta.resources.push(Arc::clone(res));
            }
        }
    }
}

/// A name as the client wrote it -> resource names: itself if it exists, else its alias targets.
fn resolve<S: ResourceView + ?Sized>(
    snapshot: &S,
    type_url: &str,
    map: &ResourceMap,
    name: &str,
) -> Vec<String> {
    if map.contains_key(name) {
        return vec![name.to_string()];
    }
    let mut names = snapshot.resolve_alias(type_url, name);
    names.retain(|n| map.contains_key(n));
    names
}

#[cfg(test)]
mod tests;
