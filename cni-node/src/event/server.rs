//! The agent's side: accept plugin events on the unix socket and hand them to a
//! [`CniAddHandler`], one request per connection.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::http::{head_end, parse_head, response, Head, MAX_HEAD};
use super::wire::decode_event;
use super::{CniAddHandler, EventError, CMD_ADD_PATH};

/// Largest request body accepted (an event is a few hundred bytes).
pub const MAX_BODY: usize = 64 * 1024;
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
/// requests [`DRAIN_GRACE`] to finish. Each request gets: 200 when the handler succeeded, 500
/// with the handler's error text, 400 naming the bad field of a malformed event, 404 for other
/// paths, 405 for other methods, 411/413 for a missing or too large body.
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

async fn handle_connection(mut stream: UnixStream, handler: Arc<dyn CniAddHandler>) {
    let reply = match tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await {
        Err(_) => response(408, "", "request not received in time\n"),
        Ok(Err(reply)) => reply,
        Ok(Ok(body)) => dispatch(&body, handler).await,
    };
    if let Err(error) = stream.write_all(&reply).await {
        tracing::debug!(%error, "cannot answer the plugin (it gave up?)");
    }
    let _ = stream.shutdown().await;
}

/// Reads one request and checks method and path; `Err` is the response to send instead.
async fn read_request(stream: &mut UnixStream) -> Result<Vec<u8>, Vec<u8>> {
    let mut buf = Vec::with_capacity(1024);
    let end = loop {
        if let Some(end) = head_end(&buf) {
            break end;
        }
        if buf.len() > MAX_HEAD {
            return Err(response(431, "", "request head too large\n"));
        }
        if read_more(stream, &mut buf).await? == 0 {
            return Err(response(
                400,
                "",
                "connection closed before the request head\n",
            ));
        }
    };
    let head = parse_head(&buf[..end]).map_err(|why| response(400, "", &format!("{why}\n")))?;
    check_target(&head)?;
    let length = body_length(&head)?;
    if head
        .header("expect")
        .is_some_and(|value| value.eq_ignore_ascii_case("100-continue"))
    {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
    }
    while buf.len() - end < length {
        if read_more(stream, &mut buf).await? == 0 {
            return Err(response(
                400,
                "",
                "connection closed before the whole body\n",
            ));
        }
    }
    Ok(buf[end..end + length].to_vec())
}

async fn read_more(stream: &mut UnixStream, buf: &mut Vec<u8>) -> Result<usize, Vec<u8>> {
    let mut chunk = [0u8; 4096];
    let read = stream
        .read(&mut chunk)
        .await
        .map_err(|error| response(400, "", &format!("cannot read the request: {error}\n")))?;
    buf.extend_from_slice(&chunk[..read]);
    Ok(read)
}

fn check_target(head: &Head) -> Result<(), Vec<u8>> {
    let mut parts = head.start_line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split('?').next().unwrap_or_default();
    if path != CMD_ADD_PATH {
        return Err(response(
            404,
            "",
            &format!("no such path {path:?}: plugin events go to POST {CMD_ADD_PATH}\n"),
        ));
    }
    if method != "POST" {
        return Err(response(
            405,
            "Allow: POST\r\n",
            &format!("method {method} not allowed: use POST {CMD_ADD_PATH}\n"),
        ));
    }
    Ok(())
}

fn body_length(head: &Head) -> Result<usize, Vec<u8>> {
    if head.is_chunked() {
        return Err(response(411, "", "send the event with a Content-Length\n"));
    }
    match head.content_length() {
        Err(why) => Err(response(400, "", &format!("{why}\n"))),
        Ok(None) => Err(response(411, "", "send the event with a Content-Length\n")),
        Ok(Some(length)) if length > MAX_BODY => Err(response(
            413,
            "",
            &format!("event of {length} bytes is larger than {MAX_BODY}\n"),
        )),
        Ok(Some(length)) => Ok(length),
    }
}

async fn dispatch(body: &[u8], handler: Arc<dyn CniAddHandler>) -> Vec<u8> {
    let event = match decode_event(body) {
        Ok(event) => event,
        Err(error) => {
            tracing::warn!(%error, "malformed plugin event");
            return response(400, "", &format!("malformed CNI add event: {error}\n"));
        }
    };
    let pod = format!("{}/{}", event.pod_namespace, event.pod_name);
    tracing::debug!(%pod, netns = %event.netns, ips = ?event.ips, "CNI add event");
    match AssertUnwindSafe(handler.cni_add(event))
        .catch_unwind()
        .await
    {
        Ok(Ok(())) => response(200, "", ""),
        Ok(Err(text)) => {
            tracing::warn!(%pod, error = %text, "CNI add event failed");
            response(500, "", &format!("{text}\n"))
        }
        Err(_) => {
            tracing::error!(%pod, "CNI add handler panicked");
            response(
                500,
                "",
                "the istio-cni agent's add handler panicked; see its logs\n",
            )
        }
    }
}
