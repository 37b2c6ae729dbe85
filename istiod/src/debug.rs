//! istiod's debug HTTP server (port 8080): `/ready`, `/debug/syncz`, `/debug/configz`,
//! `/debug/config_dump`.

use std::sync::Arc;

use axum::{extract::State, routing::get, Json, Router};
use mesh_runtime::http::readiness_handler;
use mesh_runtime::readiness::Readiness;

/// Produces a JSON view on demand.
pub type JsonView = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// What the debug endpoints read.
#[derive(Clone)]
pub struct DebugViews {
    /// Connected proxies and their per-type ACK state.
    pub syncz: JsonView,
    /// The current snapshot (workloads, services, policies, model errors).
    pub configz: JsonView,
    /// istiod's own validated configuration.
    pub config: serde_json::Value,
}

impl std::fmt::Debug for DebugViews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DebugViews")
    }
}

/// The router for the debug port.
pub fn router(views: DebugViews, readiness: Readiness) -> Router {
    Router::new()
        .route("/ready", get(readiness_handler(readiness)))
        .route(
            "/debug/syncz",
            get(|State(v): State<DebugViews>| async move { Json((v.syncz)()) }),
        )
        .route(
            "/debug/configz",
            get(|State(v): State<DebugViews>| async move { Json((v.configz)()) }),
        )
        .route(
            "/debug/config_dump",
            get(|State(v): State<DebugViews>| async move { Json(v.config.clone()) }),
        )
        .with_state(views)
}
