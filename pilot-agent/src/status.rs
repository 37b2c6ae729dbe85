//! The agent's status port (15020): `/healthz/ready` (Envoy live and its first CDS and LDS
//! accepted), `/stats/prometheus` (the agent's metrics merged with Envoy's and, for a sidecar
//! whose pod asked Prometheus to scrape it, the app's own), `/quitquitquit`
//! (shut down), `/drain` (start draining Envoy's listeners) and `/app-health/...` (the app's
//! rewritten kubelet probes, [`crate::app_probe`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use mesh_runtime::metrics::Metrics;
use mesh_runtime::signal::ShutdownTrigger;
use tokio::sync::watch;

use crate::admin::EnvoyAdmin;
use crate::app_probe::AppProbes;
use crate::xds_proxy::XdsStatus;

#[derive(Clone)]
pub struct StatusState {
    pub admin: EnvoyAdmin,
    pub xds: watch::Receiver<XdsStatus>,
    pub certs: crate::sds::CertWatch,
    pub metrics: Metrics,
    pub shutdown: Arc<ShutdownTrigger>,
    pub app_probes: AppProbes,
    /// The app's own metrics endpoint (a plain HTTP/1.1 GET on localhost) and path.
    pub app_metrics: Option<(EnvoyAdmin, String)>,
}

pub fn router(state: StatusState) -> Router {
    Router::new()
        .route("/healthz/ready", get(ready))
        .route("/stats/prometheus", get(stats))
        .route("/metrics", get(stats))
        .route("/quitquitquit", post(quit))
        .route("/drain", post(drain))
        .route("/app-health/{*probe}", any(app_health))
        .with_state(state)
}

/// Why the proxy is not ready, or `None` when it is.
pub async fn not_ready(state: &StatusState) -> Option<String> {
    if state.certs.borrow().is_none() {
        return Some("no workload certificate from the CA yet".into());
    }
    let xds = state.xds.borrow().clone();
    if !xds.configured() {
        let mut why = format!(
            "waiting for the first configuration from istiod (CDS accepted: {}, LDS accepted: {})",
            xds.cds_acked, xds.lds_acked
        );
        if let Some(nack) = xds.last_nack {
            why.push_str(&format!("; last rejection: {nack}"));
        }
        return Some(why);
    }
    match state.admin.get("/ready").await {
        Ok((200, _)) => None,
        Ok((code, body)) => Some(format!("Envoy is not live ({code}: {})", body.trim())),
        Err(e) => Some(e.to_string()),
    }
}

async fn ready(State(state): State<StatusState>) -> Response {
    match not_ready(&state).await {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn stats(State(state): State<StatusState>) -> Response {
    let mut body = openmetrics_to_prometheus(&state.metrics.render());
    match state.admin.get("/stats/prometheus").await {
        Ok((200, envoy)) => {
            if !body.is_empty() && !body.ends_with('\n') {
                body.push('\n');
            }
            body.push_str(&envoy);
        }
        Ok((code, _)) => tracing::debug!(code, "Envoy stats unavailable"),
        Err(e) => tracing::debug!(error = %e, "Envoy stats unavailable"),
    }
    if let Some((app, path)) = &state.app_metrics {
        match app.get(path).await {
            Ok((200, text)) => {
                if !body.is_empty() && !body.ends_with('\n') {
                    body.push('\n');
                }
                body.push_str(&text);
            }
            Ok((code, _)) => tracing::debug!(code, path, "the app's metrics are unavailable"),
            Err(e) => tracing::debug!(error = %e, path, "the app's metrics are unavailable"),
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Our registry writes OpenMetrics (counter families named without `_total`, a final
/// `# EOF`); the merged text is Prometheus 0.0.4 as Envoy's is, where a counter's `# TYPE`
/// and `# HELP` name its `_total` samples.
fn openmetrics_to_prometheus(text: &str) -> String {
    let counters: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(&name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The app's probe, whatever the method (the kubelet sends GET); the query is ignored.
async fn app_health(State(state): State<StatusState>, uri: Uri, headers: HeaderMap) -> Response {
    let answer = state.app_probes.probe(uri.path(), &headers).await;
    (answer.status, answer.body).into_response()
}

async fn quit(State(state): State<StatusState>) -> Response {
    tracing::info!("/quitquitquit: shutting down");
    state.shutdown.trigger();
    (StatusCode::OK, "shutting down\n").into_response()
}

async fn drain(State(state): State<StatusState>) -> Response {
    match state.admin.post("/drain_listeners?graceful").await {
        Ok((code, _)) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::OK),
            "draining\n",
        )
            .into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counters_are_named_as_prometheus_expects() {
        let om = "# HELP istio_requests Requests.\n# TYPE istio_requests counter\nistio_requests_total{a=\"b\"} 3\n# TYPE g gauge\ng 1\n# EOF\n";
        let text = super::openmetrics_to_prometheus(om);
        assert_eq!(
            text,
            "# HELP istio_requests_total Requests.\n# TYPE istio_requests_total counter\nistio_requests_total{a=\"b\"} 3\n# TYPE g gauge\ng 1\n"
        );
    }
}
