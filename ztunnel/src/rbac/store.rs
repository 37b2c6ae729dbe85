//! The set of known policies, keyed `namespace/name`, and the selection of the policies that
//! apply to one destination workload.

use std::collections::{BTreeMap, BTreeSet};

use mesh_proto::workload::Workload;

use super::policy::{Policy, Scope};

/// Index key of GLOBAL policies (upstream ztunnel files them under the empty namespace).
const GLOBAL: &str = "";

/// All policies known to this ztunnel, keyed `namespace/name`.
#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    by_key: BTreeMap<String, Policy>,
    /// Namespace (or [`GLOBAL`]) to the keys of its GLOBAL / NAMESPACE policies.
    by_namespace: BTreeMap<String, BTreeSet<String>>,
}

impl PolicySet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the policy under its key; returns the policy it replaced.
    pub fn insert(&mut self, policy: Policy) -> Option<Policy> {
        let key = policy.key();
        let old = self.remove(&key);
        if let Some(ns) = index_namespace(&policy) {
            self.by_namespace
                .entry(ns.to_string())
                .or_default()
                .insert(key.clone());
        }
        self.by_key.insert(key, policy);
        old
    }

    /// Removes the policy with this `namespace/name` key.
    pub fn remove(&mut self, key: &str) -> Option<Policy> {
        let old = self.by_key.remove(key)?;
        if let Some(ns) = index_namespace(&old) {
            if let Some(keys) = self.by_namespace.get_mut(ns) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_namespace.remove(ns);
                }
            }
        }
        Some(old)
    }

    /// The policy with this `namespace/name` key.
    pub fn get(&self, key: &str) -> Option<&Policy> {
        self.by_key.get(key)
    }

    /// Number of policies.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True when no policy is known.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// All policies, in key order.
    pub fn iter(&self) -> impl Iterator<Item = &Policy> {
        self.by_key.values()
    }

    /// The policies that apply to a workload of `namespace` whose `authorization_policies` list
    /// is `selected`: every GLOBAL policy, the NAMESPACE policies of `namespace`, and the listed
    /// keys (whatever their scope). Each policy appears once; unknown listed keys are skipped
    /// (a policy istiod has not sent yet, or just removed). Order: namespace, global, listed.
    pub fn applicable<'a>(&'a self, namespace: &str, selected: &[String]) -> Vec<&'a Policy> {
        let indexed = [namespace, GLOBAL]
            .into_iter()
            .filter_map(|ns| self.by_namespace.get(ns))
            .flatten()
            .map(String::as_str);
        let listed = selected.iter().map(String::as_str);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for key in indexed.chain(listed) {
            if !seen.insert(key) {
                continue;
            }
            match self.by_key.get(key) {
                Some(p) => out.push(p),
                None => tracing::debug!(policy = key, "skipping unknown authorization policy"),
            }
        }
        out
    }

    /// [`PolicySet::applicable`] for a workload resource.
    pub fn for_workload(&self, workload: &Workload) -> Vec<&Policy> {
        self.applicable(&workload.namespace, &workload.authorization_policies)
    }
}

/// Where a policy is indexed: GLOBAL under [`GLOBAL`], NAMESPACE under its namespace,
/// WORKLOAD_SELECTOR nowhere (workloads name it).
fn index_namespace(policy: &Policy) -> Option<&str> {
    match policy.scope {
        Scope::Global => Some(GLOBAL),
        Scope::Namespace => Some(&policy.namespace),
        Scope::WorkloadSelector => None,
    }
}
