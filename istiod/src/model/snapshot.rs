//! The immutable, versioned output of the model: what the xDS server serves.

use std::sync::Arc;

use mesh_proto::type_url;
use mesh_xds::{ChangeSet, ResourceMap, XdsSnapshot};

use super::debug;
use super::state::NodeIdentities;
use super::{BuildStats, ModelError};

/// How many recent versions' change sets a snapshot remembers for [`XdsSnapshot::changes_since`].
pub const CHANGE_LOG_LEN: usize = 64;

/// Alias (`network/IP`) -> resource names, for on-demand WDS.
pub(crate) type AliasIndex = imbl::OrdMap<String, imbl::OrdSet<String>>;

/// One version of everything istiod serves to ztunnels. Cheap to clone and share: every map is
/// a persistent (structurally shared) map.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub(crate) version: u64,
    pub(crate) addresses: ResourceMap,
    pub(crate) authorizations: ResourceMap,
    pub(crate) aliases: AliasIndex,
    /// (version, names changed by that version), oldest first, at most [`CHANGE_LOG_LEN`].
    pub(crate) log: imbl::Vector<Arc<(u64, ChangeSet)>>,
    pub(crate) node_identities: NodeIdentities,
    pub(crate) errors: Arc<Vec<ModelError>>,
    pub(crate) stats: BuildStats,
    /// When this snapshot was built (`None` for the empty initial one).
    pub(crate) created_at: Option<std::time::Instant>,
}

impl Snapshot {
    /// Version 0: nothing yet (before the source has synced).
    pub fn empty() -> Arc<Snapshot> {
        Arc::new(Snapshot::default())
    }

    /// WDS resources (`istio.workload.Address`): workloads by uid, services by `ns/hostname`.
    pub fn addresses(&self) -> &ResourceMap {
        &self.addresses
    }

    /// `istio.security.Authorization` resources by `ns/name`.
    pub fn authorizations(&self) -> &ResourceMap {
        &self.authorizations
    }

    /// Whether a live pod with identity `ns`/`sa` runs on `node` (the CA's impersonation check:
    /// a ztunnel may only ask for certificates of identities on its own node).
    pub fn identity_on_node(&self, node: &str, ns: &str, sa: &str) -> bool {
        self.node_identities
            .contains_key(&(node.to_string(), ns.to_string(), sa.to_string()))
    }

    /// The configuration problems current in this version.
    pub fn errors(&self) -> &[ModelError] {
        &self.errors
    }

    /// Work done to build this version from the previous one.
    pub fn stats(&self) -> BuildStats {
        self.stats
    }

    /// A readable rendering (IPs as strings, enums by name) for `/debug/configz`.
    pub fn debug_json(&self) -> serde_json::Value {
        debug::render(self)
    }
}

impl XdsSnapshot for Snapshot {
    fn version(&self) -> u64 {
        self.version
    }

    fn resources(&self, type_url: &str) -> Option<&ResourceMap> {
        match type_url {
            type_url::ADDRESS => Some(&self.addresses),
            type_url::AUTHORIZATION => Some(&self.authorizations),
            _ => None,
        }
    }

    fn created_at(&self) -> Option<std::time::Instant> {
        self.created_at
    }

    fn changes_since(&self, version: u64) -> Option<ChangeSet> {
        if version == self.version {
            return Some(ChangeSet::new());
        }
        if version > self.version {
            return None;
        }
        let oldest = self.log.front()?.0;
        if oldest > version + 1 {
            return None;
        }
        let mut out = ChangeSet::new();
        for entry in self.log.iter().filter(|e| e.0 > version) {
            for (type_url, names) in &entry.1 {
                out.entry(type_url.clone())
                    .or_default()
                    .extend(names.iter().cloned());
            }
        }
        Some(out)
    }

    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String> {
        if type_url != type_url::ADDRESS {
            return Vec::new();
        }
        self.aliases
            .get(alias)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}
