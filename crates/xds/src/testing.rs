//! A small in-memory [`XdsSnapshot`] for unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::{ChangeSet, Resource, ResourceMap, XdsSnapshot};

pub(crate) const T: &str = mesh_proto::type_url::ADDRESS;

#[derive(Debug, Clone, Default)]
pub(crate) struct TestSnapshot {
    pub version: u64,
    pub maps: BTreeMap<String, ResourceMap>,
    /// (version, names changed to reach it)
    pub history: Vec<(u64, ChangeSet)>,
}

pub(crate) fn res(name: &str, body: &str, aliases: &[&str]) -> Arc<Resource> {
    let aliases = aliases.iter().map(|a| a.to_string()).collect();
    Arc::new(Resource::new(T, name, aliases, &body.to_string()))
}

impl TestSnapshot {
    pub fn new(resources: &[Arc<Resource>]) -> TestSnapshot {
        let mut s = TestSnapshot {
            version: 1,
            ..TestSnapshot::default()
        };
        let map: ResourceMap = resources
            .iter()
            .map(|r| (r.name.clone(), Arc::clone(r)))
            .collect();
        s.maps.insert(T.to_string(), map);
        s
    }

    /// The next snapshot: `upsert` replaces or adds, `remove` deletes.
    pub fn next(&self, upsert: &[Arc<Resource>], remove: &[&str]) -> TestSnapshot {
        let mut s = self.clone();
        s.version += 1;
        let map = s.maps.entry(T.to_string()).or_default();
        let mut changed = BTreeSet::new();
        for r in upsert {
            map.insert(r.name.clone(), Arc::clone(r));
            changed.insert(r.name.clone());
        }
        for name in remove {
            map.remove(*name);
            changed.insert(name.to_string());
        }
        s.history
            .push((s.version, BTreeMap::from([(T.to_string(), changed)])));
        s
    }
}

impl XdsSnapshot for TestSnapshot {
    fn version(&self) -> u64 {
        self.version
    }
    fn resources(&self, type_url: &str) -> Option<&ResourceMap> {
        self.maps.get(type_url)
    }
    fn changes_since(&self, version: u64) -> Option<ChangeSet> {
        let mut out = ChangeSet::new();
        let mut next = version + 1;
        for (v, cs) in self.history.iter().filter(|(v, _)| *v > version) {
            if *v != next {
                return None;
            }
            next += 1;
            for (t, names) in cs {
                out.entry(t.clone())
                    .or_default()
                    .extend(names.iter().cloned());
            }
        }
        (next == self.version + 1).then_some(out)
    }
    fn resolve_alias(&self, type_url: &str, alias: &str) -> Vec<String> {
        self.maps
            .get(type_url)
            .map(|m| {
                m.values()
                    .filter(|r| r.aliases.iter().any(|a| a == alias))
                    .map(|r| r.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}
