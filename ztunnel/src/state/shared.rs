//! The proxy state shared by the proxy tasks and fed by the xDS client.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};

use super::State;
use crate::xds::Handler;

/// [`State`] behind a lock: the xDS client writes it, connections read it. The lock is never
/// held across an await.
#[derive(Debug, Clone, Default)]
pub struct SharedState(Arc<RwLock<State>>);

impl SharedState {
    pub fn new(state: State) -> SharedState {
        SharedState(Arc::new(RwLock::new(state)))
    }

    /// A read view. A poisoned lock still holds the last consistent state (every apply checks
    /// a resource fully before changing anything), so it is used as is.
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl Handler for SharedState {
    fn apply(
        &self,
        type_url: &str,
        updated: &[(String, Vec<u8>)],
        removed: &[String],
    ) -> Result<(), Vec<(String, String)>> {
        let mut state = self.0.write().unwrap_or_else(|p| p.into_inner());
        let mut rejected = Vec::new();
        let changes = updated
            .iter()
            .map(|(name, body)| (name, Some(body.as_slice())))
            .chain(removed.iter().map(|name| (name, None)));
        for (name, body) in changes {
            let result = match type_url {
                ADDRESS => state.apply_address(name, body),
                AUTHORIZATION => state.apply_authorization(name, body),
                other => {
                    rejected.push((name.clone(), format!("ztunnel does not use {other}")));
                    continue;
                }
            };
            if let Err(e) = result {
                tracing::warn!(resource = %name, reason = e.reason(), error = %e, "rejected an xDS resource; keeping its previous state");
                rejected.push((name.clone(), e.to_string()));
            }
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(rejected)
        }
    }
}
