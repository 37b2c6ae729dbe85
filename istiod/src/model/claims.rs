//! First-come ownership of unique keys (workload IPs, resource names), with waiters that are
//! woken when the owner lets go, so that a conflict resolves itself when the first object goes.

use std::collections::{BTreeSet, HashMap};

use mesh_api::ObjectKey;

/// Who owns which key, and who waits for it.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    owner: HashMap<String, ObjectKey>,
    /// Sorted; usually one or two keys, so a vector rather than a tree node per object.
    held: HashMap<ObjectKey, Vec<String>>,
    waiters: HashMap<String, BTreeSet<ObjectKey>>,
}

/// Result of a claim: the keys (and owners) that were refused, and the objects to recompute
/// because keys they waited for were released.
#[derive(Debug, Default)]
pub(crate) struct ClaimOutcome {
    pub refused: Vec<(String, ObjectKey)>,
    pub woken: Vec<ObjectKey>,
}

impl Claims {
    /// Claims each key separately; keys owned by another object are refused (and `who` waits
    /// for them). Keys `who` held before and no longer asks for are released.
    pub fn claim_each(&mut self, who: &ObjectKey, keys: &BTreeSet<String>) -> ClaimOutcome {
        let mut out = ClaimOutcome::default();
        let old = self.held.remove(who).unwrap_or_default();
        for key in old.iter().filter(|key| !keys.contains(*key)) {
            self.release_key(key, &mut out.woken);
        }
        let mut held = Vec::new();
        for key in keys {
            match self.owner.get(key) {
                Some(owner) if owner != who => {
                    out.refused.push((key.clone(), owner.clone()));
                    self.waiters
                        .entry(key.clone())
                        .or_default()
                        .insert(who.clone());
                }
                _ => {
                    self.owner.insert(key.clone(), who.clone());
                    held.push(key.clone());
                }
            }
        }
        if !held.is_empty() {
            held.shrink_to_fit();
            self.held.insert(who.clone(), held);
        }
        out
    }

    /// Claims all keys or none: when one is owned by another object, everything `who` held is
    /// released and it waits for the refused keys.
    pub fn claim_all(&mut self, who: &ObjectKey, keys: &BTreeSet<String>) -> ClaimOutcome {
        let refused: Vec<(String, ObjectKey)> = keys
            .iter()
            .filter_map(|k| match self.owner.get(k) {
                Some(owner) if owner != who => Some((k.clone(), owner.clone())),
                _ => None,
            })
            .collect();
        if refused.is_empty() {
            return self.claim_each(who, keys);
        }
        let mut out = self.claim_each(who, &BTreeSet::new());
        for (key, _) in &refused {
            self.waiters
                .entry(key.clone())
                .or_default()
                .insert(who.clone());
        }
        out.refused = refused;
        out
    }

    fn release_key(&mut self, key: &str, woken: &mut Vec<ObjectKey>) {
        self.owner.remove(key);
        if let Some(waiters) = self.waiters.remove(key) {
            woken.extend(waiters);
        }
    }
}
