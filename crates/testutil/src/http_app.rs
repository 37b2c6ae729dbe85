//! An HTTP/1.1 test application (hyper) and a client, for L7 tests through waypoints.
//!
//! [`HttpApp`] answers every request with `200` and a body naming the app, except:
//! `/status/<code>` answers `<code>`, `.../delay/<ms>` answers after `ms` milliseconds. It counts
//! requests and keeps the headers of the last one. [`http_request`] sends one request over a
//! fresh connection from a network namespace and reports status, body and time taken.

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
        Ok(HttpApp::serve(listener, local, name))
    }

    fn serve(listener: TcpListener, addr: SocketAddr, name: &str) -> HttpApp {
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
            rt.block_on(run(listener, state, name, stop_rx));
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
    name: String,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
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
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                handle(req, Arc::clone(&shared), name.clone())
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    name: String,
) -> Result<Response<Full<Bytes>>, Infallible> {
    shared.hits.fetch_add(1, Ordering::Relaxed);
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
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

/// `method path` to `addr` from `netns` over a new HTTP/1.1 connection, with `headers`;
/// `None` if the connection or the exchange failed (or took over `timeout`).
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
    stream.set_nonblocking(true).ok()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let stream = tokio::net::TcpStream::from_std(stream).ok()?;
        let exchange = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(conn);
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header("host", addr.to_string());
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let resp = sender
                .send_request(req.body(Empty::<Bytes>::new()).ok()?)
                .await
                .ok()?;
            let status = resp.status().as_u16();
            let headers = resp
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        v.to_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some(HttpResponse {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
                headers,
                elapsed: start.elapsed(),
            })
        };
        tokio::time::timeout(timeout, exchange).await.ok()?
    })
}
