//! ztunnel's admin endpoint (localhost:15000: `/config_dump`, `/quitquitquit`) and readiness
//! (`:15021/healthz/ready`), shaped like upstream's so `istioctl ztunnel-config` can read them.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use mesh_runtime::http::readiness_handler;
use mesh_runtime::readiness::Readiness;
use mesh_runtime::signal::ShutdownTrigger;
use serde_json::json;

use crate::certs::CertManager;
use crate::config::Config;
use crate::state::SharedState;

/// What the admin endpoint shows and controls.
#[derive(Clone)]
pub struct AdminView {
    pub config: Arc<Config>,
    pub state: SharedState,
    pub certs: Option<Arc<CertManager>>,
    pub shutdown: Arc<ShutdownTrigger>,
}

impl std::fmt::Debug for AdminView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminView")
    }
}

/// The admin router. Bind it to localhost only: it can stop the proxy.
pub fn admin_router(view: AdminView) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/config_dump", get(config_dump))
        .route("/quitquitquit", post(quit))
        .with_state(view)
}

/// `/healthz/ready`: 200 once every registered condition is met, else 503 naming them.
pub fn readiness_router(readiness: Readiness) -> Router {
    Router::new().route("/healthz/ready", get(readiness_handler(readiness)))
}

async fn index() -> &'static str {
    "ztunnel admin\n  /config_dump   workloads, services, policies, certificates, config\n  /quitquitquit  (POST) drain and exit\n"
}

/// The JSON `istioctl ztunnel-config` reads (camelCase keys as upstream).
async fn config_dump(State(view): State<AdminView>) -> Json<serde_json::Value> {
    let certificates = view
        .certs
        .as_ref()
        .map(|c| c.snapshot())
        .unwrap_or_default();
    let state = view.state.read();
    let dump = state.dump();
    Json(json!({
        "workloads": dump.workloads,
        "services": dump.services,
        "policies": dump.policies,
        "certificates": certificates,
        "config": view.config.as_ref(),
        "version": { "version": env!("CARGO_PKG_VERSION") },
    }))
}

async fn quit(State(view): State<AdminView>) -> &'static str {
    tracing::info!("/quitquitquit: shutting down");
    view.shutdown.trigger();
    "OK\n"
}

#[cfg(test)]
mod tests;
