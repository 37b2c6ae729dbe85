//! istio-cni's probe endpoints on port 8000: `GET /readyz` answers 200 once the agent is
//! ready (source synced, recorded pods reconciled) and 503 before; `GET /healthz` is always
//! 200. Served by axum (hyper): other paths are 404, other methods 405.

use std::future::Future;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

/// Serves probes, and the `extra` routes (debug endpoints), on `listener` until `shutdown`
/// resolves.
pub async fn serve_probes(
    listener: TcpListener,
    ready: watch::Receiver<bool>,
    extra: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "readiness endpoint /readyz listening");
    }
    if let Err(error) = axum::serve(listener, probes_router(ready).merge(extra))
        .with_graceful_shutdown(shutdown)
        .await
    {
        warn!(%error, "the readiness endpoint stopped");
    }
}

/// `/readyz` following `ready`, and `/healthz`.
pub fn probes_router(ready: watch::Receiver<bool>) -> Router {
    let readyz = move || {
        let ready = *ready.borrow();
        async move {
            if ready {
                (StatusCode::OK, "ready\n")
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: waiting for the cluster source to sync\n",
                )
            }
        }
    };
    Router::new()
        .route("/readyz", get(readyz))
        .route("/healthz", get(|| async { "ok\n" }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mesh_testutil::{http_call, HttpResponse};

    use super::*;

    async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> HttpResponse {
        http_call(addr, method, path, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    #[tokio::test]
    async fn readyz_follows_the_agent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (ready, rx) = watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_probes(listener, rx, Router::new(), async {
            let _ = stopped.await;
        }));
        assert_eq!(request(addr, "GET", "/readyz").await.status, 503);
        assert_eq!(request(addr, "GET", "/healthz").await.status, 200);
        ready.send_replace(true);
        let response = request(addr, "GET", "/readyz").await;
        assert_eq!(response.status, 200, "{response:?}");
        assert!(response.body.ends_with("ready\n"), "{response:?}");
        assert_eq!(request(addr, "GET", "/other").await.status, 404);
        assert_eq!(request(addr, "POST", "/readyz").await.status, 405);
        let _ = stop.send(());
        server.await.expect("server stopped");
    }
}
