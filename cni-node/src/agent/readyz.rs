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

/// Serves probes on `listener` until `shutdown` resolves.
pub async fn serve_probes(
    listener: TcpListener,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "readiness endpoint /readyz listening");
    }
    if let Err(error) = axum::serve(listener, probes_router(ready))
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        request(addr, "GET", path).await
    }

    #[tokio::test]
    async fn readyz_follows_the_agent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (ready, rx) = watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_probes(listener, rx, async {
            let _ = stopped.await;
        }));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        ready.send_replace(true);
        let response = get(addr, "/readyz").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("ready\n"), "{response}");
        assert!(get(addr, "/other").await.starts_with("HTTP/1.1 404"));
        let post = request(addr, "POST", "/readyz").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let _ = stop.send(());
        server.await.expect("server stopped");
    }
}
