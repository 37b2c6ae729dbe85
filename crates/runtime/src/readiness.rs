//! Readiness: a set of named conditions that must all be met.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Shared readiness state. Each component registers a condition and marks it done.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeSet<String>>>,
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a condition that must be met before the process is ready.
    pub fn register(&self, name: impl Into<String>) {
        self.lock().insert(name.into());
    }

    /// Marks a condition met.
    pub fn mark_ready(&self, name: &str) {
        self.lock().remove(name);
    }

    /// The conditions still pending (empty when ready).
    pub fn pending(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    pub fn is_ready(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // A poisoned set still holds valid names: keep using it.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_all_conditions_met() {
        let r = Readiness::new();
        r.register("xds");
        r.register("ca");
        assert!(!r.is_ready());
        r.mark_ready("xds");
        assert_eq!(r.pending(), vec!["ca".to_string()]);
        r.mark_ready("ca");
        assert!(r.is_ready());
    }
}
