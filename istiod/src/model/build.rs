//! The incremental model: objects in, dirty marks, recompute only what a change touches, and a
//! new immutable [`Snapshot`] per build.

mod compute;
mod deps;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use mesh_api::{Kind, Object, ObjectKey};
use mesh_proto::type_url;
use mesh_xds::{ChangeSet, Resource, ResourceMap};

use super::claims::Claims;
use super::peer_auth::STATIC_STRICT_POLICY_NAME;
use super::routers::RouterIndex;
use super::sidecars::SidecarIndex;
use super::snapshot::{AliasIndex, Snapshot, CHANGE_LOG_LEN};
use super::state::State;
use super::status::{self, Statuses};
use super::waypoints::WaypointIndex;
use super::{BuildStats, ModelConfig, ModelError};

/// What one source object produces.
#[derive(Debug, Default)]
struct Output {
    addresses: Vec<Arc<Resource>>,
    authorizations: Vec<Arc<Resource>>,
    errors: Vec<ModelError>,
    /// `network/IP` keys the workload must own exclusively (Pods and WorkloadEntries).
    ips: BTreeSet<String>,
}

/// Names a source object currently serves, by type.
#[derive(Debug, Default)]
struct Produced {
    addresses: BTreeSet<String>,
    authorizations: BTreeSet<String>,
}

/// What a waypoint with nothing bound to it is served.
fn empty_waypoint(cfg: &ModelConfig) -> Arc<crate::envoy::ProxyResources> {
    Arc::new(crate::envoy::generate_waypoint(
        &crate::envoy::WaypointInputs {
            key: crate::envoy::WaypointKey {
                namespace: String::new(),
                name: String::new(),
            },
            flavor: crate::envoy::Flavor::Waypoint,
            trust_domain: cfg.trust_domain.clone(),
            domain_suffix: cfg.domain_suffix.clone(),
            access_log_file: cfg.access_log_file.clone(),
            services: Vec::new(),
        },
        0,
    ))
}

/// Cluster state plus the resources derived from it; see the module docs of `model`.
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    state: State,
    dirty: BTreeSet<ObjectKey>,
    produced: HashMap<ObjectKey, Produced>,
    ip_claims: Claims,
    name_claims: Claims,
    errors: BTreeMap<ObjectKey, Vec<ModelError>>,
    addresses: ResourceMap,
    authorizations: ResourceMap,
    aliases: AliasIndex,
    log: imbl::Vector<Arc<(u64, ChangeSet)>>,
    version: u64,
    recomputed_total: u64,
    waypoints: WaypointIndex,
    sidecars: SidecarIndex,
    routers: RouterIndex,
    /// The configuration of a waypoint with nothing bound to it.
    empty_waypoint: Arc<crate::envoy::ProxyResources>,
    /// Status conditions as of the last build that could change them, and whether a change
    /// since calls for working them out again (most changes, pods', cannot).
    statuses: Arc<Statuses>,
    statuses_stale: bool,
}

impl Model {
    pub fn new(cfg: ModelConfig) -> Model {
        Model {
            state: State::default(),
            dirty: BTreeSet::new(),
            produced: HashMap::new(),
            ip_claims: Claims::default(),
            name_claims: Claims::default(),
            errors: BTreeMap::new(),
            addresses: ResourceMap::new(),
            authorizations: ResourceMap::new(),
            aliases: AliasIndex::new(),
            log: imbl::Vector::new(),
            version: 0,
            recomputed_total: 0,
            waypoints: WaypointIndex::default(),
            sidecars: SidecarIndex::default(),
            routers: RouterIndex::default(),
            empty_waypoint: empty_waypoint(&cfg),
            statuses: Arc::default(),
            statuses_stale: true,
            cfg,
        }
    }

    /// Takes new settings (a changed mesh config): everything is recomputed at the next build,
    /// and only what comes out different is pushed.
    pub fn reconfigure(&mut self, cfg: ModelConfig) {
        if cfg == self.cfg {
            return;
        }
        tracing::info!(?cfg, "model settings changed; recomputing everything");
        let old_strict = self.static_strict_key();
        self.cfg = cfg;
        self.empty_waypoint = empty_waypoint(&self.cfg);
        self.statuses_stale = true;
        self.dirty.extend(self.state.keys());
        self.dirty.extend(self.produced.keys().cloned());
        self.dirty.insert(old_strict);
        self.dirty.insert(self.static_strict_key());
        self.waypoints.mark_all();
        self.sidecars.touch();
        self.routers.touch();
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Adds or replaces an object and marks what it affects. Takes a shared object so that the
    /// source and the model hold one copy.
    pub fn apply(&mut self, obj: impl Into<Arc<Object>>) {
        let obj = obj.into();
        let key = obj.key();
        let old = self.state.insert(obj);
        self.mark(&key, old.as_deref());
    }

    /// Removes an object (no-op when unknown) and marks what it affected.
    pub fn delete(&mut self, key: &ObjectKey) {
        if let Some(old) = self.state.remove(key) {
            self.mark(key, Some(&*old));
        }
    }

    /// Whether a change is waiting for [`Model::build`].
    pub fn has_pending(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Source objects recomputed since the model was created (for cost tests and metrics).
    pub fn recomputed_total(&self) -> u64 {
        self.recomputed_total
    }

    /// The version of the last build.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Recomputes everything marked and returns the next version.
    pub fn build(&mut self) -> Arc<Snapshot> {
        let mut stats = BuildStats::default();
        let mut changes = ChangeSet::new();
        while let Some(key) = self.dirty.pop_first() {
            stats.recomputed += 1;
            let out = self.compute(&key);
            self.commit(&key, out, &mut changes);
        }
        self.recomputed_total += stats.recomputed;
        stats.changed = changes.values().map(|s| s.len() as u64).sum();
        self.version += 1;
        self.waypoints
            .rebuild(&self.cfg, &self.state, &self.addresses, self.version);
        self.sidecars.rebuild(
            &self.cfg,
            &self.state,
            &self.waypoints,
            &self.addresses,
            self.version,
        );
        self.routers.rebuild(
            &self.cfg,
            &self.state,
            &self.waypoints,
            &self.addresses,
            self.version,
        );
        self.log.push_back(Arc::new((self.version, changes)));
        while self.log.len() > CHANGE_LOG_LEN {
            self.log.pop_front();
        }
        if std::mem::take(&mut self.statuses_stale) {
            self.statuses = Arc::new(status::compute(&self.cfg, &self.state, &self.errors));
        }
        Arc::new(Snapshot {
            version: self.version,
            addresses: self.addresses.clone(),
            authorizations: self.authorizations.clone(),
            aliases: self.aliases.clone(),
            log: self.log.clone(),
            node_identities: self.state.node_identities.clone(),
            pods: self.state.pods.clone(),
            errors: Arc::new(self.errors.values().flatten().cloned().collect()),
            stats,
            created_at: Some(std::time::Instant::now()),
            waypoints: self.waypoints.views.clone(),
            sidecars: self.sidecars.views.clone(),
            routers: self.routers.views.clone(),
            empty_waypoint: Arc::clone(&self.empty_waypoint),
            statuses: Arc::clone(&self.statuses),
        })
    }

    /// The pseudo-source of the static STRICT policy.
    fn static_strict_key(&self) -> ObjectKey {
        ObjectKey::new(
            Kind::PeerAuthentication,
            self.cfg.root_namespace.clone(),
            STATIC_STRICT_POLICY_NAME,
        )
    }

    fn mark(&mut self, key: &ObjectKey, old: Option<&Object>) {
        self.routers.touch();
        if key.kind == Kind::Secret {
            // Only gateway proxies read Secrets (their credentials).
            return;
        }
        self.waypoints.on_object(key, old, self.state.get(key));
        self.sidecars.on_object(key, self.state.get(key));
        self.statuses_stale |= status::depends_on(key.kind);
        let mut dirty = vec![key.clone()];
        deps::affected(self, key, old, &mut dirty);
        self.dirty.extend(dirty);
    }

    /// Applies one object's new output: IP and name ownership, resource maps, errors.
    fn commit(&mut self, key: &ObjectKey, mut out: Output, changes: &mut ChangeSet) {
        self.claim_ips(key, &mut out);
        self.claim_names(key, &mut out);
        let old = self.produced.remove(key).unwrap_or_default();
        let new = Produced {
            addresses: out.addresses.iter().map(|r| r.name.clone()).collect(),
            authorizations: out.authorizations.iter().map(|r| r.name.clone()).collect(),
        };
        let addr = changes.entry(type_url::ADDRESS.to_string()).or_default();
        for name in old.addresses.difference(&new.addresses) {
            if let Some(r) = self.addresses.remove(name) {
                unalias(&mut self.aliases, &r);
                addr.insert(name.clone());
                self.waypoints.on_address(name, None, &self.state);
                self.sidecars.touch();
                self.routers.touch();
            }
        }
        for r in out.addresses {
            if let Some(prev) = self.addresses.get(&r.name) {
                if prev.version == r.version {
                    continue;
                }
                unalias(&mut self.aliases, prev);
            }
            alias(&mut self.aliases, &r);
            addr.insert(r.name.clone());
            self.waypoints
                .on_address(&r.name, Some(&r.body.value), &self.state);
            self.sidecars.touch();
            self.routers.touch();
            self.addresses.insert(r.name.clone(), r);
        }
        let authz = changes
            .entry(type_url::AUTHORIZATION.to_string())
            .or_default();
        for name in old.authorizations.difference(&new.authorizations) {
            if self.authorizations.remove(name).is_some() {
                authz.insert(name.clone());
            }
        }
        for r in out.authorizations {
            if self.authorizations.get(&r.name).map(|p| &p.version) != Some(&r.version) {
                authz.insert(r.name.clone());
                self.authorizations.insert(r.name.clone(), r);
            }
        }
        changes.retain(|_, names| !names.is_empty());
        if !new.addresses.is_empty() || !new.authorizations.is_empty() {
            self.produced.insert(key.clone(), new);
        }
        self.record_errors(key, out.errors);
    }

    /// All-or-nothing ownership of a workload's IPs; the loser is left out and reported.
    fn claim_ips(&mut self, key: &ObjectKey, out: &mut Output) {
        let outcome = self.ip_claims.claim_all(key, &out.ips);
        self.dirty.extend(outcome.woken);
        if outcome.refused.is_empty() {
            return;
        }
        out.addresses.clear();
        for (ip_key, owner) in outcome.refused {
            let (network, ip) = ip_key.rsplit_once('/').unwrap_or(("", &ip_key));
            let Ok(ip) = ip.parse() else { continue };
            out.errors.push(ModelError::IpConflict {
                network: network.to_string(),
                ip,
                owner: owner.to_string(),
                loser: key.to_string(),
            });
        }
    }

    /// First-come ownership of resource names across source objects.
    fn claim_names(&mut self, key: &ObjectKey, out: &mut Output) {
        let names: BTreeSet<String> = (out.addresses.iter().map(|r| format!("A|{}", r.name)))
            .chain(out.authorizations.iter().map(|r| format!("Z|{}", r.name)))
            .collect();
        let outcome = self.name_claims.claim_each(key, &names);
        self.dirty.extend(outcome.woken);
        for (name, owner) in outcome.refused {
            let (kind, plain) = name.split_at(2);
            let list = match kind {
                "A|" => &mut out.addresses,
                _ => &mut out.authorizations,
            };
            list.retain(|r| r.name != plain);
            out.errors.push(ModelError::DuplicateName {
                name: plain.to_string(),
                owner: owner.to_string(),
                loser: key.to_string(),
            });
        }
    }

    fn record_errors(&mut self, key: &ObjectKey, errors: Vec<ModelError>) {
        if errors.is_empty() {
            self.errors.remove(key);
            return;
        }
        let old = self.errors.get(key);
        for e in errors
            .iter()
            .filter(|e| !old.is_some_and(|o| o.contains(e)))
        {
            tracing::warn!(object = %key, reason = e.reason(), "{e}");
        }
        self.errors.insert(key.clone(), errors);
    }
}

fn alias(index: &mut AliasIndex, r: &Resource) {
    for a in &r.aliases {
        Arc::make_mut(index.entry(a.clone()).or_default()).insert(r.name.clone());
    }
}

fn unalias(index: &mut AliasIndex, r: &Resource) {
    for a in &r.aliases {
        if let Some(names) = index.get_mut(a).filter(|names| names.contains(&r.name)) {
            Arc::make_mut(names).remove(&r.name);
            if names.is_empty() {
                index.remove(a);
            }
        }
    }
}
