//! The plugin's side: one blocking `POST /cmdadd` over the agent's unix socket.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::http::{decode_chunked, head_end, parse_head, MAX_HEAD};
use super::{CniAddEvent, EventError, CMD_ADD_PATH};

/// Most bytes of a response body we read (the agent's error text).
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// Sends `event` to the agent listening on `socket` and waits, at most `timeout` in all, for
/// its answer: `Ok` only on `200 OK`.
pub fn post_add(socket: &Path, event: &CniAddEvent, timeout: Duration) -> Result<(), EventError> {
    let deadline = Instant::now() + timeout;
    let body = serde_json::to_vec(event).map_err(EventError::Encode)?;
    let mut stream = UnixStream::connect(socket).map_err(|source| EventError::Connect {
        socket: socket.to_path_buf(),
        source,
    })?;
    let io = |op: &'static str| {
        move |source: std::io::Error| match source.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => EventError::Timeout {
                socket: socket.to_path_buf(),
                timeout,
            },
            _ => EventError::Io {
                socket: socket.to_path_buf(),
                op,
                source,
            },
        }
    };
    let mut request = format!(
        "POST {CMD_ADD_PATH} HTTP/1.1\r\nHost: unix\r\nUser-Agent: istio-cni\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    set_timeouts(&stream, deadline).map_err(io("set timeouts on"))?;
    stream.write_all(&request).map_err(io("write to"))?;
    let response = read_response(&mut stream, deadline, socket).map_err(io("read from"))?;
    check_response(socket, &response)
}

fn set_timeouts(stream: &UnixStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .ok_or_else(|| std::io::Error::from(ErrorKind::TimedOut))?;
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

/// Reads until the response is complete (by its framing) or the agent closes.
fn read_response(
    stream: &mut UnixStream,
    deadline: Instant,
    socket: &Path,
) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        set_timeouts(stream, deadline)?;
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..read]);
        if buf.len() > MAX_HEAD + MAX_RESPONSE_BODY {
            tracing::warn!(socket = %socket.display(), "agent response too long, truncated");
            return Ok(buf);
        }
        if response_complete(&buf) {
            return Ok(buf);
        }
    }
}

fn response_complete(buf: &[u8]) -> bool {
    let Some(end) = head_end(buf) else {
        return false;
    };
    let Ok(head) = parse_head(&buf[..end]) else {
        return true;
    };
    if head.is_chunked() {
        return !matches!(decode_chunked(&buf[end..]), Ok(None));
    }
    match head.content_length() {
        Ok(Some(length)) => buf.len() - end >= length,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Maps the agent's answer: 200 is success; anything else carries the agent's text.
fn check_response(socket: &Path, response: &[u8]) -> Result<(), EventError> {
    let bad = |detail: String| EventError::BadResponse {
        socket: socket.to_path_buf(),
        detail,
    };
    let end = head_end(response).ok_or_else(|| {
        bad(format!(
            "incomplete HTTP response ({} bytes) before the connection closed",
            response.len()
        ))
    })?;
    let head = parse_head(&response[..end]).map_err(bad)?;
    let status: u16 = head
        .start_line
        .split_whitespace()
        .nth(1)
        .filter(|_| head.start_line.starts_with("HTTP/1."))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {:?}", head.start_line)))?;
    let raw_body = &response[end..];
    let body = if head.is_chunked() {
        decode_chunked(raw_body)
            .map_err(bad)?
            .unwrap_or_else(|| raw_body.to_vec())
    } else {
        let length = head
            .content_length()
            .map_err(bad)?
            .unwrap_or(raw_body.len());
        raw_body[..length.min(raw_body.len())].to_vec()
    };
    let body = String::from_utf8_lossy(&body).trim().to_owned();
    let socket = socket.to_path_buf();
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
