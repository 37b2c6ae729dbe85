//! What an xDS server needs from a control-plane snapshot.

use std::collections::{BTreeMap, BTreeSet};

use crate::ResourceMap;

/// Names of changed (added, updated or removed) resources, by type URL.
pub type ChangeSet = BTreeMap<String, BTreeSet<String>>;

/// An immutable, versioned view of every resource the control plane serves.
///
/// Versions increase by one per snapshot. A server stream remembers the version it last pushed
/// and asks [`XdsSnapshot::changes_since`] which names to look at, so that one changed Pod costs
/// work proportional to that Pod, not to the mesh.
pub trait XdsSnapshot: Send + Sync + 'static {
    /// This snapshot's version.
    fn version(&self) -> u64;
    /// All resources of one type URL, or `None` if this type is not served.
    fn resources(&self, type_url: &str) -> Option<&ResourceMap>;
    /// The names that changed after `version` up to this snapshot (inclusive), by type URL.
    /// `None` when that history is no longer kept: the caller must then compare everything.
    fn changes_since(&self, version: u64) -> Option<ChangeSet>;
    /// Resolves an alias (e.g. `network/IP`) to resource names, for on-demand subscriptions.
    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String>;
    /// When this snapshot was built, if known; servers measure push convergence time
    /// (`pilot_proxy_convergence_time`) from it. The default says "unknown".
    fn created_at(&self) -> Option<std::time::Instant> {
        None
    }
}
