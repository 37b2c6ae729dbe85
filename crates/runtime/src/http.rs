//! Small HTTP servers (metrics, readiness, debug) with graceful shutdown.

use std::net::SocketAddr;

use axum::{http::StatusCode, response::IntoResponse, routing::get, Router};
use tokio::net::TcpListener;

use crate::{metrics::Metrics, readiness::Readiness, signal::Shutdown};

/// Why an HTTP server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {source} (is another process using the port?)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server on {addr} failed: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl HttpError {
    pub fn reason(&self) -> &'static str {
        match self {
            HttpError::Bind { .. } => "bind",
            HttpError::Serve { .. } => "serve",
        }
    }
}

/// A bound server, ready to run: binding early reports port conflicts at start-up.
#[derive(Debug)]
pub struct BoundServer {
    listener: TcpListener,
    addr: SocketAddr,
}

impl BoundServer {
    pub async fn bind(addr: SocketAddr) -> Result<BoundServer, HttpError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind { addr, source })?;
        let addr = listener.local_addr().unwrap_or(addr);
        Ok(BoundServer { listener, addr })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `router` until `shutdown`.
    pub async fn serve(self, router: Router, shutdown: Shutdown) -> Result<(), HttpError> {
        let addr = self.addr;
        tracing::info!(%addr, "HTTP server listening");
        axum::serve(self.listener, router)
            .with_graceful_shutdown(shutdown.wait())
            .await
            .map_err(|source| HttpError::Serve { addr, source })
    }
}

/// `/metrics` and `/stats/prometheus` in the Prometheus text format.
pub fn metrics_router(metrics: Metrics) -> Router {
    let render = move || {
        let metrics = metrics.clone();
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                metrics.render(),
            )
        }
    };
    Router::new()
        .route("/metrics", get(render.clone()))
        .route("/stats/prometheus", get(render))
}

/// A readiness handler: 200 `ready` or 503 naming what is pending.
pub fn readiness_handler(
    readiness: Readiness,
) -> impl Fn() -> std::future::Ready<axum::response::Response> + Clone {
    move || {
        let pending = readiness.pending();
        let resp = if pending.is_empty() {
            (StatusCode::OK, "ready\n".to_string()).into_response()
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: waiting for {}\n", pending.join(", ")),
            )
                .into_response()
        };
        std::future::ready(resp)
    }
}
