//! istio-cni's probe endpoints on port 8000: `GET /readyz` answers 200 once the agent is
//! ready (source synced, recorded pods reconciled) and 503 before; `GET /healthz` is always
//! 200. A minimal HTTP/1.0-style responder: one request per connection, then close.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, info};

/// Serves probes on `listener` until `shutdown` resolves.
pub async fn serve_probes(
    listener: TcpListener,
    ready: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "readiness endpoint /readyz listening");
    }
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let ready = *ready.borrow();
                    tokio::spawn(async move {
                        let answered = tokio::time::timeout(Duration::from_secs(5), answer(stream, ready)).await;
                        if !matches!(answered, Ok(Ok(()))) {
                            debug!("probe connection failed or timed out");
                        }
                    });
                }
                Err(e) => {
                    debug!(error = %e, "probe accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn answer(mut stream: TcpStream, ready: bool) -> std::io::Result<()> {
    let mut buf = vec![0u8; 2048];
    let mut len = 0;
    // Read up to the end of the request line.
    while !buf[..len].contains(&b'\n') && len < buf.len() {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let line = String::from_utf8_lossy(&buf[..len]);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path) {
        ("GET", "/readyz") if ready => ("200 OK", "ready\n"),
        ("GET", "/readyz") => (
            "503 Service Unavailable",
            "not ready: waiting for the cluster source to sync\n",
        ),
        ("GET", "/healthz") => ("200 OK", "ok\n"),
        ("GET", _) => ("404 Not Found", "not found\n"),
        _ => ("405 Method Not Allowed", "use GET\n"),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
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
        let _ = stop.send(());
        server.await.expect("server stopped");
    }
}
