//! The plugin's side: one `POST /cmdadd` over the agent's unix socket with hyper's HTTP/1.1
//! client. The plugin is a short-lived synchronous process on the pod-creation path, so no
//! async runtime is started: hyper drives a blocking socket (each read and write may wait for
//! what is left of one overall deadline) under a minimal executor.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{self, Either};
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::{CniAddEvent, EventError, CMD_ADD_PATH};

/// Most bytes of a response body we read (the agent's error text).
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// Most bytes one read takes from the socket.
const READ_CHUNK: usize = 16 * 1024;

/// Sends `event` to the agent listening on `socket` and waits, at most `timeout` in all, for
/// its answer: `Ok` only on `200 OK`.
pub fn post_add(socket: &Path, event: &CniAddEvent, timeout: Duration) -> Result<(), EventError> {
    let deadline = Instant::now() + timeout;
    let body = serde_json::to_vec(event).map_err(EventError::Encode)?;
    let stream = UnixStream::connect(socket).map_err(|source| EventError::Connect {
        socket: socket.to_path_buf(),
        source,
    })?;
    let result = futures::executor::block_on(exchange(
        socket,
        BlockingIo {
            stream,
            deadline,
            written: false,
        },
        body,
    ));
    match result {
        Err(EventError::Io { .. } | EventError::BadResponse { .. })
            if Instant::now() >= deadline =>
        {
            Err(EventError::Timeout {
                socket: socket.to_path_buf(),
                timeout,
            })
        }
        other => other,
    }
}

async fn exchange(socket: &Path, io: BlockingIo, body: Vec<u8>) -> Result<(), EventError> {
    let failed = |op: &'static str| {
        move |error: hyper::Error| {
            let socket = socket.to_path_buf();
            if error.is_parse() {
                EventError::BadResponse {
                    socket,
                    detail: format!("not an HTTP answer: {error}"),
                }
            } else {
                EventError::Io {
                    socket,
                    op,
                    source: std::io::Error::other(error),
                }
            }
        }
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(failed("start HTTP with"))?;
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
    let answer = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(failed("send the event to"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BODY)
            .collect()
            .await
            .map_err(|error| EventError::BadResponse {
                socket: socket.to_path_buf(),
                detail: format!("cannot read the answer: {error}"),
            })?
            .to_bytes();
        Ok::<_, EventError>((status, body))
    };
    // The connection does the socket work while the answer waits for it; once the answer is
    // complete the connection is dropped (the request said `Connection: close`).
    let (status, body) = match future::select(Box::pin(answer), connection).await {
        Either::Left((answer, _)) => answer?,
        Either::Right((closed, answer)) => {
            closed.map_err(failed("read the answer of"))?;
            answer.await?
        }
    };
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

/// A blocking unix socket as hyper's IO: every call completes (or fails) before it returns,
/// waiting at most until `deadline`. One exception: before the request is written, hyper
/// reads only to notice an idle connection closing, which here would wait for an answer to a
/// request not yet sent; such a read is "not yet" (and asks to be polled again), so hyper goes
/// on to write.
struct BlockingIo {
    stream: UnixStream,
    deadline: Instant,
    written: bool,
}

impl BlockingIo {
    /// What is left of the deadline, as a socket timeout (never zero: that means "forever").
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }

    /// One write, bounded by what is left of the deadline; a successful one means the request
    /// has started, so reads are real from then on.
    fn write_with(
        &mut self,
        write: impl FnOnce(&mut UnixStream) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let result = self.left().and_then(|left| {
            self.stream.set_write_timeout(Some(left))?;
            write(&mut self.stream)
        });
        self.written |= result.is_ok();
        result
    }
}

impl hyper::rt::Read for BlockingIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.written {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let mut chunk = [0u8; READ_CHUNK];
        let result = this.left().and_then(|left| {
            this.stream.set_read_timeout(Some(left))?;
            let want = buf.remaining().min(chunk.len());
            this.stream.read(&mut chunk[..want])
        });
        Poll::Ready(result.map(|read| buf.put_slice(&chunk[..read])))
    }
}

impl hyper::rt::Write for BlockingIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.get_mut().write_with(|stream| stream.write(buf)))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(
            self.get_mut()
                .write_with(|stream| stream.write_vectored(bufs)),
        )
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = self.stream.shutdown(std::net::Shutdown::Write);
        Poll::Ready(result)
    }
}
