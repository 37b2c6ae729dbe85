//! An in-memory xDS snapshot for server-side tests: typed maps of resources, a version per
//! change and the change history, so `changes_since` works as the real model's does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};
use mesh_xds::{ChangeSet, Resource, ResourceMap, XdsSnapshot};

#[derive(Debug, Clone)]
/// Serves Address and Authorization; each [`MemorySnapshot::next`] is one version.
pub struct MemorySnapshot {
    version: u64,
    created: Instant,
    maps: BTreeMap<String, ResourceMap>,
    history: Vec<(u64, ChangeSet)>,
}

impl XdsSnapshot for MemorySnapshot {
    fn version(&self) -> u64 {
        self.version
    }
    fn resources(&self, type_url: &str) -> Option<&ResourceMap> {
        self.maps.get(type_url)
    }
    fn changes_since(&self, version: u64) -> Option<ChangeSet> {
        let mut out = ChangeSet::new();
        let mut expect = version + 1;
        for (v, cs) in self.history.iter().filter(|(v, _)| *v > version) {
            if *v != expect {
                return None;
            }
            expect += 1;
            for (t, names) in cs {
                out.entry(t.clone())
                    .or_default()
                    .extend(names.iter().cloned());
            }
        }
        (expect == self.version + 1).then_some(out)
    }
    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String> {
        let Some(map) = self.maps.get(type_url) else {
            return Vec::new();
        };
        map.values()
            .filter(|r| r.aliases.iter().any(|a| a == alias))
            .map(|r| r.name.clone())
            .collect()
    }
    fn created_at(&self) -> Option<Instant> {
        Some(self.created)
    }
}

impl MemorySnapshot {
    /// Version 1 holding `resources` (Address and Authorization are always served).
    pub fn new(resources: &[Arc<Resource>]) -> MemorySnapshot {
        let mut maps: BTreeMap<String, ResourceMap> = BTreeMap::new();
        maps.insert(ADDRESS.to_string(), ResourceMap::new());
        maps.insert(AUTHORIZATION.to_string(), ResourceMap::new());
        for r in resources {
            let map = maps.entry(r.body.type_url.clone()).or_default();
            map.insert(r.name.clone(), Arc::clone(r));
        }
        MemorySnapshot {
            version: 1,
            created: Instant::now(),
            maps,
            history: Vec::new(),
        }
    }

    /// The next snapshot: `upsert` adds or replaces, `remove` deletes (type, name).
    /// The next version: `upsert` added or replaced, `remove` (type URL, name) deleted.
    pub fn next(&self, upsert: &[Arc<Resource>], remove: &[(&str, &str)]) -> MemorySnapshot {
        let mut s = self.clone();
        s.version += 1;
        s.created = Instant::now();
        let mut changes = ChangeSet::new();
        for r in upsert {
            let t = r.body.type_url.clone();
            s.maps
                .entry(t.clone())
                .or_default()
                .insert(r.name.clone(), Arc::clone(r));
            changes.entry(t).or_default().insert(r.name.clone());
        }
        for (t, name) in remove {
            s.maps.entry(t.to_string()).or_default().remove(*name);
            changes
                .entry(t.to_string())
                .or_default()
                .insert(name.to_string());
        }
        s.history.push((s.version, changes));
        s
    }
}
