//! The immutable, versioned output of the model: what the xDS server serves.

use std::collections::BTreeSet;
use std::sync::Arc;

use mesh_proto::type_url;
use mesh_xds::{ChangeSet, ResourceMap, XdsSnapshot};

use super::debug;
use super::routers::RouterViews;
use super::sidecars::SidecarViews;
use super::state::{NodeIdentities, PodFacts, PodIndex};
use super::status::Statuses;
use super::waypoints::{waypoint_of, WaypointViews};
use super::{BuildStats, ModelError};
use crate::envoy::{ProxyResources, WaypointKey};

/// How many recent versions' change sets a snapshot remembers for [`XdsSnapshot::changes_since`].
pub const CHANGE_LOG_LEN: usize = 64;

/// Alias (`network/IP`) -> resource names, for on-demand WDS. Almost every alias names one
/// resource, so the names are a small shared set (a persistent set would allocate a whole
/// 64-entry node for each); a change copies only that alias's set.
pub(crate) type AliasIndex = imbl::OrdMap<String, Arc<BTreeSet<String>>>;

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
    pub(crate) pods: PodIndex,
    pub(crate) errors: Arc<Vec<ModelError>>,
    pub(crate) stats: BuildStats,
    /// When this snapshot was built (`None` for the empty initial one).
    pub(crate) created_at: Option<std::time::Instant>,
    /// Envoy configuration of each waypoint.
    pub(crate) waypoints: WaypointViews,
    /// Envoy configuration of each sidecar (by pod).
    pub(crate) sidecars: SidecarViews,
    /// Envoy configuration of each gateway proxy (by pod).
    pub(crate) routers: RouterViews,
    /// What a waypoint with nothing bound to it is served.
    pub(crate) empty_waypoint: Arc<ProxyResources>,
    /// Status conditions to report on the objects they concern.
    pub(crate) statuses: Arc<Statuses>,
}

/// The scope prefix of waypoint proxies: `waypoint:<namespace>/<gateway>`.
const WAYPOINT_SCOPE: &str = "waypoint:";
/// The scope prefix of sidecar proxies: `sidecar:<namespace>/<pod>`.
const SIDECAR_SCOPE: &str = "sidecar:";
/// The scope prefix of gateway proxies: `router:<namespace>/<pod>`.
const ROUTER_SCOPE: &str = "router:";

impl Snapshot {
    /// Version 0: nothing yet (before the source has synced).
    pub fn empty() -> Arc<Snapshot> {
        Arc::new(Snapshot::default())
    }

    /// WDS resources (`istio.workload.Address`): workloads by uid, services by `ns/hostname`.
    pub fn addresses(&self) -> &ResourceMap {
        &self.addresses
    }

    /// Status conditions by object and writer.
    pub fn statuses(&self) -> &Statuses {
        &self.statuses
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

    /// The pod `namespace`/`name`, as the CA checks a caller's bound token against it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodFacts> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| &**p)
    }

    /// The configuration problems current in this version.
    pub fn errors(&self) -> &[ModelError] {
        &self.errors
    }

    /// Work done to build this version from the previous one.
    pub fn stats(&self) -> BuildStats {
        self.stats
    }

    /// The Envoy configuration of one waypoint (an empty waypoint's when nothing is bound).
    pub fn waypoint(&self, key: &WaypointKey) -> &ProxyResources {
        self.waypoints
            .get(key)
            .map_or(&*self.empty_waypoint, |v| &**v)
    }

    /// Every waypoint this snapshot configures.
    pub fn waypoints(&self) -> impl Iterator<Item = (&WaypointKey, &ProxyResources)> {
        self.waypoints.iter().map(|(k, v)| (k, &**v))
    }

    /// The Envoy configuration of one sidecar (by its pod); an empty one while the pod is
    /// unknown or has no sidecar.
    pub fn sidecar(&self, key: &WaypointKey) -> &ProxyResources {
        static EMPTY: std::sync::LazyLock<ProxyResources> =
            std::sync::LazyLock::new(crate::envoy::sidecar::empty);
        self.sidecars.get(key).map_or(&*EMPTY, |v| &**v)
    }

    /// Every sidecar this snapshot configures.
    pub fn sidecars(&self) -> impl Iterator<Item = (&WaypointKey, &ProxyResources)> {
        self.sidecars.iter().map(|(k, v)| (k, &**v))
    }

    /// The Envoy configuration of one gateway proxy (by its pod); an empty one while no
    /// Gateway selects the pod.
    pub fn router(&self, key: &WaypointKey) -> &ProxyResources {
        static EMPTY: std::sync::LazyLock<ProxyResources> =
            std::sync::LazyLock::new(crate::envoy::sidecar::empty);
        self.routers.get(key).map_or(&*EMPTY, |v| &**v)
    }

    /// Every gateway proxy this snapshot configures.
    pub fn routers(&self) -> impl Iterator<Item = (&WaypointKey, &ProxyResources)> {
        self.routers.iter().map(|(k, v)| (k, &**v))
    }

    fn scope_view(&self, scope: &str) -> Option<&ProxyResources> {
        let split = |key: &str| {
            let (namespace, name) = key.split_once('/').unwrap_or(("", ""));
            WaypointKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }
        };
        if let Some(key) = scope.strip_prefix(SIDECAR_SCOPE) {
            return Some(self.sidecar(&split(key)));
        }
        if let Some(key) = scope.strip_prefix(ROUTER_SCOPE) {
            return Some(self.router(&split(key)));
        }
        let key = scope.strip_prefix(WAYPOINT_SCOPE)?;
        Some(self.waypoint(&split(key)))
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

    /// Waypoints (`waypoint~` node ids) are served their Gateway's Envoy configuration, found by
    /// the `gateway.networking.k8s.io/gateway-name` label in the node metadata `LABELS`;
    /// every other proxy the ambient (WDS) resources.
    fn scope_of(&self, node: &mesh_proto::envoy::pb::envoy::config::core::v3::Node) -> String {
        let Ok(id) = crate::xds::NodeId::parse(&node.id) else {
            return String::new();
        };
        if id.kind == crate::xds::ProxyKind::Sidecar {
            if !self.sidecars.contains_key(&WaypointKey {
                namespace: id.namespace.clone(),
                name: id.pod.clone(),
            }) {
                tracing::warn!(node = %node.id, "sidecar proxy whose pod is not known (or has no sidecar.istio.io/status annotation); it is served an empty configuration until it is");
            }
            return format!("{SIDECAR_SCOPE}{}/{}", id.namespace, id.pod);
        }
        if id.kind == crate::xds::ProxyKind::Router {
            return format!("{ROUTER_SCOPE}{}/{}", id.namespace, id.pod);
        }
        if id.kind != crate::xds::ProxyKind::Waypoint {
            return String::new();
        }
        let labels = node_labels(node);
        match waypoint_of(&id.namespace, &labels) {
            Some(key) => format!("{WAYPOINT_SCOPE}{key}"),
            None => {
                tracing::warn!(node = %node.id, "waypoint proxy without the {} label in its node metadata LABELS; it is served an empty waypoint configuration", mesh_api::GATEWAY_NAME_LABEL);
                WAYPOINT_SCOPE.to_string()
            }
        }
    }

    fn scoped_resources(&self, scope: &str, type_url: &str) -> Option<&ResourceMap> {
        if scope.is_empty() {
            return self.resources(type_url);
        }
        self.scope_view(scope)?.get(type_url)
    }

    fn scoped_changes_since(&self, scope: &str, version: u64) -> Option<ChangeSet> {
        if scope.is_empty() {
            return self.changes_since(version);
        }
        let view = self.scope_view(scope)?;
        (view.changed_in <= version).then(ChangeSet::new)
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

/// The `LABELS` map of a node's metadata (pilot-agent fills it from the pod's labels).
fn node_labels(
    node: &mesh_proto::envoy::pb::envoy::config::core::v3::Node,
) -> std::collections::BTreeMap<String, String> {
    use mesh_proto::envoy::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(labels)) = node
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("LABELS"))
        .and_then(|v| v.kind.as_ref())
    else {
        return Default::default();
    };
    labels
        .fields
        .iter()
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}
