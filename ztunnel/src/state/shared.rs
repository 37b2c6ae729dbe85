//! The proxy state shared by the proxy tasks and fed by the xDS client.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};
use tokio::sync::watch;

use super::State;
use crate::xds::Handler;

/// [`State`] behind a lock: the xDS client writes it, connections read it. The lock is never
/// held across an await. Every applied xDS response bumps a generation that waiters can watch
/// ([`SharedState::changed`]).
#[derive(Debug, Clone)]
pub struct SharedState {
    state: Arc<RwLock<State>>,
    generation: Arc<watch::Sender<u64>>,
}

impl Default for SharedState {
    fn default() -> Self {
        SharedState::new(State::default())
    }
}

impl SharedState {
    pub fn new(state: State) -> SharedState {
        SharedState {
            state: Arc::new(RwLock::new(state)),
            generation: Arc::new(watch::channel(0).0),
        }
    }

    /// A read view. A poisoned lock still holds the last consistent state (every apply checks
    /// a resource fully before changing anything), so it is used as is.
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes `State` outside xDS (local config, tests) and wakes waiters.
    pub fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let result = f(&mut self.state.write().unwrap_or_else(|p| p.into_inner()));
        self.generation.send_modify(|g| *g += 1);
        result
    }

    /// A receiver that sees a new value after every change.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Waits until `f` finds something in the state, or `timeout` passes.
    pub async fn wait_for<T>(
        &self,
        timeout: std::time::Duration,
        mut f: impl FnMut(&State) -> Option<T>,
    ) -> Option<T> {
        let mut changed = self.changed();
        let wait = async {
            loop {
                if let Some(found) = f(&self.read()) {
                    return Some(found);
                }
                if changed.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}

impl Handler for SharedState {
    fn apply(
        &self,
        type_url: &str,
        updated: &[(String, Vec<u8>)],
        removed: &[String],
    ) -> Result<(), Vec<(String, String)>> {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
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
        drop(state);
        self.generation.send_modify(|g| *g += 1);
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(rejected)
        }
    }
}
