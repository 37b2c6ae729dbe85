//! The plugin's side: one `POST /cmdadd` over the agent's unix socket, with hyper's HTTP/1.1
//! client on a runtime of its own (the plugin is otherwise synchronous).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::{CniAddEvent, EventError, CMD_ADD_PATH};

/// Most bytes of a response body we read (the agent's error text).
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// Sends `event` to the agent listening on `socket` and waits, at most `timeout` in all, for
/// its answer: `Ok` only on `200 OK`. Must not be called from within a tokio runtime.
pub fn post_add(socket: &Path, event: &CniAddEvent, timeout: Duration) -> Result<(), EventError> {
    let body = serde_json::to_vec(event).map_err(EventError::Encode)?;
    let io = |op: &'static str| {
        move |source: std::io::Error| EventError::Io {
            socket: socket.to_path_buf(),
            op,
            source,
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("start a runtime to talk to"))?;
    runtime.block_on(async {
        match tokio::time::timeout(timeout, exchange(socket, body)).await {
            Ok(result) => result,
            Err(_) => Err(EventError::Timeout {
                socket: socket.to_path_buf(),
                timeout,
            }),
        }
    })
}

async fn exchange(socket: &Path, body: Vec<u8>) -> Result<(), EventError> {
    let io = |op: &'static str| {
        move |error: hyper::Error| EventError::Io {
            socket: socket.to_path_buf(),
            op,
            source: std::io::Error::other(error),
        }
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| EventError::Connect {
            socket: socket.to_path_buf(),
            source,
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io("start HTTP with"))?;
    let connection = tokio::spawn(connection);
    let request = Request::builder()
        .method(Method::POST)
        .uri(CMD_ADD_PATH)
        .header(header::HOST, "unix")
        .header(header::USER_AGENT, "istio-cni")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .body(Full::new(Bytes::from(body)))
        .map_err(|error| EventError::BadResponse {
            socket: socket.to_path_buf(),
            detail: format!("cannot build the request: {error}"),
        })?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io("send the event to"))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_RESPONSE_BODY)
        .collect()
        .await
        .map_err(|error| EventError::BadResponse {
            socket: socket.to_path_buf(),
            detail: format!("cannot read the answer: {error}"),
        })?
        .to_bytes();
    connection.abort();
    check_response(socket, status, &body)
}

/// Maps the agent's answer: 200 is success; anything else carries the agent's text.
fn check_response(socket: &Path, status: StatusCode, body: &[u8]) -> Result<(), EventError> {
    let body = String::from_utf8_lossy(body).trim().to_owned();
    let socket = socket.to_path_buf();
    let status = status.as_u16();
    match status {
        200 => Ok(()),
        500..=599 => Err(EventError::AgentFailed {
            socket,
            status,
            body,
        }),
        _ => Err(EventError::Rejected {
            socket,
            status,
            body,
        }),
    }
}
