//! The agent's side: accept plugin events on the unix socket (HTTP/1.1 by hyper) and hand them
//! to a [`CniAddHandler`], one request per connection.

use std::convert::Infallible;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::wire::decode_event;
use super::{CniAddHandler, EventError, CMD_ADD_PATH};

/// Largest request body accepted (an event is a few hundred bytes).
pub const MAX_BODY: usize = 64 * 1024;
/// Most bytes of a request head (hyper's read buffer; larger heads get 431).
const MAX_HEAD: usize = 16 * 1024;
/// How long a plugin may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests may finish after shutdown.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Listens on `path`: creates its directory (0750) and replaces a leftover socket file (a
/// restarted agent), as upstream does; anything else at `path` is left alone and is an error.
/// The socket is made world-writable (0666) so the plugin can connect whatever its user.
/// Must be called within a tokio runtime.
pub fn bind(path: &Path) -> Result<UnixListener, EventError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| EventError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        if let Err(error) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)) {
            tracing::debug!(dir = %dir.display(), %error, "cannot set the socket directory mode");
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| EventError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })?;
            tracing::info!(path = %path.display(), "replaced a leftover plugin event socket");
        }
        Ok(_) => return Err(EventError::NotASocket(path.to_path_buf())),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| EventError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(|source| {
        EventError::Bind {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(listener)
}

/// Serves plugin events until `shutdown` completes, then stops accepting and gives in-flight
/// requests [`DRAIN_GRACE`] to finish. HTTP/1.1 is hyper's, one request per connection. Each
/// request gets: 200 when the handler succeeded, 500 with the handler's error text, 400 naming
/// the bad field of a malformed event, 404 for other paths, 405 for other methods, 411/413 for
/// a missing or too large body, 408 for a body not received in time; a head not received in
/// time closes the connection.
pub async fn serve(
    listener: UnixListener,
    handler: Arc<dyn CniAddHandler>,
    shutdown: impl Future<Output = ()>,
) {
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(handle_connection(stream, handler.clone()));
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a plugin connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = tasks.len(),
            "plugin event requests still running after shutdown; aborted"
        );
        tasks.abort_all();
    }
}

async fn handle_connection(stream: UnixStream, handler: Arc<dyn CniAddHandler>) {
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(answer(request, handler).await) }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(error) = served {
        tracing::debug!(%error, "plugin event connection ended with an error");
    }
}

/// A plain-text response.
fn reply(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn answer(
    request: Request<Incoming>,
    handler: Arc<dyn CniAddHandler>,
) -> Response<Full<Bytes>> {
    let body = match read_event(request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    dispatch(&body, handler).await
}

/// Checks path, method and framing and reads the body; `Err` is the response to send instead.
async fn read_event(request: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    let path = request.uri().path();
    if path != CMD_ADD_PATH {
        return Err(reply(
            StatusCode::NOT_FOUND,
            format!("no such path {path:?}: plugin events go to POST {CMD_ADD_PATH}\n"),
        ));
    }
    if request.method() != Method::POST {
        let mut response = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "method {} not allowed: use POST {CMD_ADD_PATH}\n",
                request.method()
            ),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(response);
    }
    let length = request.headers().get(header::CONTENT_LENGTH).map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|text| text.parse::<usize>().ok())
    });
    let length = match length {
        None => {
            return Err(reply(
                StatusCode::LENGTH_REQUIRED,
                "send the event with a Content-Length\n".to_owned(),
            ))
        }
        Some(None) => {
            return Err(reply(
                StatusCode::BAD_REQUEST,
                "bad Content-Length\n".to_owned(),
            ))
        }
        Some(Some(length)) => length,
    };
    if length > MAX_BODY {
        return Err(reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("event of {length} bytes is larger than {MAX_BODY}\n"),
        ));
    }
    let body = Limited::new(request.into_body(), MAX_BODY);
    match tokio::time::timeout(READ_TIMEOUT, body.collect()).await {
        Err(_) => Err(reply(
            StatusCode::REQUEST_TIMEOUT,
            "request not received in time\n".to_owned(),
        )),
        Ok(Err(error)) => Err(reply(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request: {error}\n"),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

async fn dispatch(body: &[u8], handler: Arc<dyn CniAddHandler>) -> Response<Full<Bytes>> {
    let event = match decode_event(body) {
        Ok(event) => event,
        Err(error) => {
            tracing::warn!(%error, "malformed plugin event");
            return reply(
                StatusCode::BAD_REQUEST,
                format!("malformed CNI add event: {error}\n"),
            );
        }
    };
    let pod = format!("{}/{}", event.pod_namespace, event.pod_name);
    tracing::debug!(%pod, netns = %event.netns, ips = ?event.ips, "CNI add event");
    match AssertUnwindSafe(handler.cni_add(event))
        .catch_unwind()
        .await
    {
        Ok(Ok(())) => reply(StatusCode::OK, String::new()),
        Ok(Err(error)) => {
            tracing::warn!(%pod, %error, "CNI add event failed");
            reply(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
        }
        Err(_) => {
            tracing::error!(%pod, "CNI add handler panicked");
            reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the istio-cni agent's add handler panicked; see its logs\n".to_owned(),
            )
        }
    }
}
