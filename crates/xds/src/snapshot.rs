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

    /// The scope a proxy is served: every proxy of one scope gets the same resources (e.g.
    /// one waypoint's configuration). The default, an empty scope, serves every proxy the
    /// whole snapshot.
    fn scope_of(&self, _node: &mesh_proto::envoy::pb::envoy::config::core::v3::Node) -> String {
        String::new()
    }

    /// The resources of one type in `scope` (`None`: not served there).
    fn scoped_resources(&self, scope: &str, type_url: &str) -> Option<&ResourceMap> {
        let _ = scope;
        self.resources(type_url)
    }

    /// [`XdsSnapshot::changes_since`] within `scope`.
    fn scoped_changes_since(&self, scope: &str, version: u64) -> Option<ChangeSet> {
        let _ = scope;
        self.changes_since(version)
    }
}

/// What a delta stream reads from a snapshot to answer one proxy.
pub trait ResourceView {
    fn version(&self) -> u64;
    fn resources(&self, type_url: &str) -> Option<&ResourceMap>;
    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String>;
}

impl<S: XdsSnapshot> ResourceView for S {
    fn version(&self) -> u64 {
        XdsSnapshot::version(self)
    }
    fn resources(&self, type_url: &str) -> Option<&ResourceMap> {
        XdsSnapshot::resources(self, type_url)
    }
    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String> {
        XdsSnapshot::resolve_alias(self, type_url, alias)
    }
}

/// One scope of a snapshot, as a [`ResourceView`].
#[derive(Debug)]
pub struct Scoped<'a, S: ?Sized> {
    pub snapshot: &'a S,
    pub scope: &'a str,
}

impl<S: XdsSnapshot + ?Sized> ResourceView for Scoped<'_, S> {
    fn version(&self) -> u64 {
        self.snapshot.version()
    }
    fn resources(&self, type_url: &str) -> Option<&ResourceMap> {
        self.snapshot.scoped_resources(self.scope, type_url)
    }
    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String> {
        if self.scope.is_empty() {
            self.snapshot.resolve_alias(type_url, alias)
        } else {
            Vec::new()
        }
    }
}
