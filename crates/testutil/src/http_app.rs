//! An HTTP/1.1 test application (hyper) for L7 tests through waypoints, and hyper clients
//! for the tests' requests (also admin, metrics and readiness endpoints).
//!
//! [`HttpApp`] answers every request with `200` and a body naming the app, except:
//! `/status/<code>` answers `<code>`, `.../delay/<ms>` answers after `ms` milliseconds. It counts
//! requests and keeps the headers of the last one. [`http_request`] sends one request over a
//! fresh connection from a network namespace and reports status, body and time taken;
//! [`http_get`] / [`http_call`] are the async requests from the caller's namespace (admin,
//! metrics, readiness).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::netns::{Netns, NetnsError};

#[derive(Debug, Default)]
struct Shared {
    hits: AtomicUsize,
    tls_failures: AtomicUsize,
    last_headers: Mutex<BTreeMap<String, String>>,
}

/// A running HTTP app; stops when dropped.
#[derive(Debug)]
pub struct HttpApp {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpApp {
    /// Serves on `addr` inside `netns`; every 200 body is `name`.
    pub fn start(netns: &Netns, addr: SocketAddr, name: &str) -> Result<HttpApp, NetnsError> {
        let listener = netns.tcp_listen(addr)?;
        let local = listener.local_addr().unwrap_or(addr);
        Ok(HttpApp::serve(listener, local, name, None))
    }

    /// Serves HTTPS (HTTP/1.1 over TLS with `tls`) on `addr` inside `netns`.
    pub fn start_tls(
        netns: &Netns,
        addr: SocketAddr,
        name: &str,
        tls: Arc<rustls::ServerConfig>,
    ) -> Result<HttpApp, NetnsError> {
        let listener = netns.tcp_listen(addr)?;
        let local = listener.local_addr().unwrap_or(addr);
        Ok(HttpApp::serve(listener, local, name, Some(tls)))
    }

    /// TLS handshakes that failed so far (HTTPS only).
    pub fn tls_failures(&self) -> usize {
        self.shared.tls_failures.load(Ordering::Relaxed)
    }

    fn serve(
        listener: TcpListener,
        addr: SocketAddr,
        name: &str,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> HttpApp {
        let shared = Arc::new(Shared::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let state = Arc::clone(&shared);
        let name = name.to_string();
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(run(listener, state, (name, tls), stop_rx));
        });
        HttpApp {
            addr,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.shared.hits.load(Ordering::Relaxed)
    }

    /// The headers of the last request (lower-case names).
    pub fn last_headers(&self) -> BTreeMap<String, String> {
        self.shared
            .last_headers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for HttpApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn run(
    listener: TcpListener,
    shared: Arc<Shared>,
    (name, tls): (String, Option<Arc<rustls::ServerConfig>>),
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stop => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let shared = Arc::clone(&shared);
        let name = name.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let served = Arc::clone(&shared);
            let service = hyper::service::service_fn(move |req| {
                handle(req, Arc::clone(&served), name.clone())
            });
            let http = hyper::server::conn::http1::Builder::new();
            match acceptor {
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                }
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => {
                        let _ = http.serve_connection(TokioIo::new(tls), service).await;
                    }
                    Err(_) => {
                        shared.tls_failures.fetch_add(1, Ordering::Relaxed);
                    }
                },
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    name: String,
) -> Result<Response<Full<Bytes>>, Infallible> {
    shared.hits.fetch_add(1, Ordering::Relaxed);
    let headers = header_map(req.headers());
    *shared
        .last_headers
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = headers;
    let path = req.uri().path().to_string();
    let mut status = 200u16;
    if let Some(code) = path.strip_prefix("/status/") {
        status = code.parse().unwrap_or(400);
    } else if let Some((_, ms)) = path.rsplit_once("/delay/") {
        let ms: u64 = ms.parse().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut resp = Response::new(Full::new(Bytes::from(name.clone())));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    if let Some(v) = (name.len() <= 64)
        .then(|| hyper::header::HeaderValue::from_str(&name).ok())
        .flatten()
    {
        resp.headers_mut().insert("x-served-by", v);
    }
    Ok(resp)
}

/// One HTTP response as seen by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
    pub headers: BTreeMap<String, String>,
    pub elapsed: Duration,
}

/// Why a test client's exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start a runtime for the request: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("bad request {method} {path}: {source}")]
    Request {
        method: String,
        path: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("HTTP exchange with {addr} failed: {source}")]
    Exchange {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
    #[error("{addr} did not answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
}

/// `method path` to `addr` from `netns` over a new HTTP/1.1 connection, with `headers`;
/// `None` if the connection or the exchange failed, or both together took over `timeout`.
/// Blocking; callable from inside a tokio runtime too (the exchange runs on a thread of its
/// own, the socket already connected in `netns`).
pub fn http_request(
    netns: &Netns,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Option<HttpResponse> {
    let start = Instant::now();
    let stream = netns.tcp_connect(addr, timeout).ok()?;
    on_own_runtime(stream, start, timeout, |stream| async move {
        exchange(stream, addr, method, path, headers, start)
            .await
            .ok()
    })
}

/// Runs `exchange` on the connected `stream` on a thread of its own (a current-thread
/// runtime), within what is left of `timeout` since `start`.
fn on_own_runtime<F, Fut>(
    stream: std::net::TcpStream,
    start: Instant,
    timeout: Duration,
    exchange: F,
) -> Option<HttpResponse>
where
    F: FnOnce(tokio::net::TcpStream) -> Fut + Send,
    Fut: std::future::Future<Output = Option<HttpResponse>>,
{
    stream.set_nonblocking(true).ok()?;
    let left = timeout.checked_sub(start.elapsed())?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async {
                    let stream = tokio::net::TcpStream::from_std(stream).ok()?;
                    tokio::time::timeout(left, exchange(stream)).await.ok()?
                })
            })
            .join()
            .ok()
            .flatten()
    })
}

/// `GET path` over TLS (`tls`, server name `sni`) to `addr` from `netns`, with `headers`, at
/// most `timeout` in all; `None` when the connection, the handshake or the exchange fails.
pub fn https_request(
    netns: &Netns,
    addr: SocketAddr,
    sni: &str,
    tls: std::sync::Arc<rustls::ClientConfig>,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Option<HttpResponse> {
    let start = Instant::now();
    let stream = netns.tcp_connect(addr, timeout).ok()?;
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).ok()?;
    on_own_runtime(stream, start, timeout, |stream| async move {
        let tls = tokio_rustls::TlsConnector::from(tls)
            .connect(name, stream)
            .await
            .ok()?;
        exchange(tls, addr, "GET", "/", headers, start).await.ok()
    })
}

/// `GET path` on `addr` from the caller's network namespace, at most `timeout` in all.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<HttpResponse, HttpClientError> {
    http_call(addr, "GET", path, timeout).await
}

/// `method path` (no body) on `addr` from the caller's network namespace, at most `timeout`
/// in all.
pub async fn http_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<HttpResponse, HttpClientError> {
    let start = Instant::now();
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| HttpClientError::Connect { addr, source })?;
        exchange(stream, addr, method, path, &[], start).await
    };
    tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| HttpClientError::Timeout { addr, timeout })?
}

/// One request over `stream` (hyper's HTTP/1.1 client), the whole response body read.
async fn exchange<S>(
    stream: S,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    start: Instant,
) -> Result<HttpResponse, HttpClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let failed = |source| HttpClientError::Exchange { addr, source };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(failed)?;
    let conn = tokio::spawn(conn);
    let mut req = Request::builder().method(method).uri(path);
    // The address, unless the caller names the host itself.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req = req.header("host", addr.to_string());
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|source| HttpClientError::Request {
            method: method.to_string(),
            path: path.to_string(),
            source,
        })?;
    let resp = sender.send_request(req).await.map_err(failed)?;
    let status = resp.status().as_u16();
    let headers = header_map(resp.headers());
    let body = resp.into_body().collect().await.map_err(failed)?.to_bytes();
    conn.abort();
    Ok(HttpResponse {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        headers,
        elapsed: start.elapsed(),
    })
}

/// Headers as lower-case name -> value (values that are not text read as empty).
fn header_map(headers: &hyper::HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}
