//! ztunnel's admin endpoint (localhost:15000: `/config_dump`, `/quitquitquit`) and readiness
//! (`:15021/healthz/ready`), shaped like upstream's so `istioctl ztunnel-config` can read them.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use mesh_runtime::http::readiness_handler;
use mesh_runtime::readiness::Readiness;
use mesh_runtime::signal::ShutdownTrigger;
use mesh_runtime::telemetry::LogControl;
use serde_json::json;

use crate::certs::CertManager;
use crate::config::Config;
use crate::inpod::InPodStatus;
use crate::state::SharedState;

/// What the admin endpoint shows and controls.
#[derive(Clone)]
pub struct AdminView {
    pub config: Arc<Config>,
    pub state: SharedState,
    pub certs: Option<Arc<CertManager>>,
    pub shutdown: Arc<ShutdownTrigger>,
    /// In-pod mode: the pods handed over by the node agent (`workloadState`).
    pub inpod: Option<InPodStatus>,
    /// Run-time log filter (`/logging`); `None` when logging is not reloadable (tests).
    pub logging: Option<LogControl>,
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
        .route("/logging", get(logging).post(logging))
        .with_state(view)
}

/// `/healthz/ready`: 200 once every registered condition is met, else 503 naming them.
pub fn readiness_router(readiness: Readiness) -> Router {
    Router::new().route("/healthz/ready", get(readiness_handler(readiness)))
}

async fn index() -> &'static str {
    "ztunnel admin\n  /config_dump   workloads, services, policies, stagedServices, staticConfig, certificates, config, workloadState\n  /logging       current log filter; POST /logging?level=<RUST_LOG filter> changes it\n  /quitquitquit  (POST) drain and exit\n"
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
        "stagedServices": dump.staged_services,
        "staticConfig": dump.static_config,
        "certificates": certificates,
        "config": view.config.as_ref(),
        "workloadState": view.inpod.as_ref().map(InPodStatus::dump).unwrap_or_default(),
        "version": { "version": env!("CARGO_PKG_VERSION") },
    }))
}

#[derive(Debug, serde::Deserialize)]
struct LoggingQuery {
    level: Option<String>,
}

/// `GET /logging` shows the filter; `?level=` (GET or POST, as upstream) replaces it.
async fn logging(
    State(view): State<AdminView>,
    Query(query): Query<LoggingQuery>,
) -> (StatusCode, String) {
    let Some(control) = &view.logging else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            "log level changes are not available in this process\n".to_string(),
        );
    };
    if let Some(level) = query.level.as_deref() {
        if let Err(e) = control.set(level) {
            return (StatusCode::BAD_REQUEST, format!("{e}\n"));
        }
        tracing::info!(filter = level, "log filter changed through /logging");
    }
    (
        StatusCode::OK,
        format!("current log level is {}\n", control.current()),
    )
}

async fn quit(State(view): State<AdminView>) -> &'static str {
    tracing::info!("/quitquitquit: shutting down");
    view.shutdown.trigger();
    "OK\n"
}

#[cfg(test)]
mod tests;
