//! A channel: one HTTP/2 connection to an endpoint, dialed on first use and again after it
//! broke, shared by every call (unary and streaming) made through the channel's clones.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::Mutex;

use crate::endpoint::{Dialed, Endpoint};
use crate::framing::{self, Frames};
use crate::keepalive::CallOpen;
use crate::status::{Code, Status};

const USER_AGENT: &str = concat!("mesh-grpc/", env!("CARGO_PKG_VERSION"));

/// A lazily connecting gRPC channel; clones share the connection.
#[derive(Clone, Debug)]
pub struct Channel {
    endpoint: Arc<Endpoint>,
    connection: Arc<Mutex<Option<Dialed>>>,
}

impl Endpoint {
    /// The channel to this endpoint; nothing is dialed until the first call.
    pub fn channel(self) -> Channel {
        Channel {
            endpoint: Arc::new(self),
            connection: Arc::new(Mutex::new(None)),
        }
    }
}

impl Channel {
    /// A unary call: `path` is `/package.Service/Method`; `metadata` goes out as request headers.
    /// With a `timeout` the server is told (`grpc-timeout`) and the call gives up after it with
    /// `DeadlineExceeded`.
    pub async fn unary<Req, Resp>(
        &self,
        path: &str,
        metadata: &HeaderMap,
        request: &Req,
        timeout: Option<Duration>,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let call = async {
            let body = framing::encode(request)?;
            let (response, mut send, open) = self.start(path, metadata, timeout).await?;
            send.send_data(body, true)
                .map_err(|e| Status::from_h2(&e))?;
            let mut responses = ResponseStream::<Resp>::new(response.await, &self.endpoint, open)?;
            let Some(message) = responses.message().await? else {
                return Err(Status::new(
                    Code::Internal,
                    "the server ended the call without a response message",
                ));
            };
            match responses.message().await? {
                None => Ok(message),
                Some(_) => Err(Status::new(
                    Code::Internal,
                    "the server sent more than one response to a unary call",
                )),
            }
        };
        match timeout {
            None => call.await,
            Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(Status::new(
                    Code::DeadlineExceeded,
                    format!("no answer within {limit:?}"),
                ))
            }),
        }
    }

    /// A bidirectional streaming call. `first` is sent before the response headers are awaited
    /// (a server may answer them only once it has a request); the call is open when they come.
    pub async fn streaming<Req, Resp>(
        &self,
        path: &str,
        metadata: &HeaderMap,
        first: &[Req],
    ) -> Result<(RequestSink<Req>, ResponseStream<Resp>), Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let (response, send, open) = self.start(path, metadata, None).await?;
        let mut sink = RequestSink {
            send,
            _message: PhantomData,
        };
        for request in first {
            sink.send(request)?;
        }
        let responses = ResponseStream::new(response.await, &self.endpoint, open)?;
        Ok((sink, responses))
    }

    /// Opens a stream on the connection, dialing when there is none or it has ended. The call
    /// counts as open (for the connection's PINGs) while the returned guard lives.
    async fn start(
        &self,
        path: &str,
        metadata: &HeaderMap,
        timeout: Option<Duration>,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>, CallOpen), Status> {
        let request = self.request(path, metadata, timeout)?;
        let mut connection = self.connection.lock().await;
        // The kept sender is cloned, never taken, so a call given up half-way leaves it in place.
        let kept = match connection.as_ref() {
            Some((kept, calls)) => match kept.clone().ready().await {
                Ok(ready) => Some((ready, calls.clone())),
                Err(e) => {
                    tracing::debug!(address = %self.endpoint.address, error = %e, "gRPC connection ended; dialing again");
                    None
                }
            },
            None => None,
        };
        let (mut sender, calls) = match kept {
            Some(ready) => ready,
            None => {
                let (dialed, calls) = self.endpoint.dial().await?;
                *connection = Some((dialed.clone(), calls.clone()));
                let ready = dialed.ready().await.map_err(|e| Status::from_h2(&e))?;
                (ready, calls)
            }
        };
        drop(connection);
        let open = calls.enter();
        let (response, send) = sender
            .send_request(request, false)
            .map_err(|e| Status::from_h2(&e))?;
        Ok((response, send, open))
    }

    fn request(
        &self,
        path: &str,
        metadata: &HeaderMap,
        timeout: Option<Duration>,
    ) -> Result<http::Request<()>, Status> {
        let uri = http::Uri::builder()
            .scheme(self.endpoint.scheme.clone())
            .authority(self.endpoint.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| Status::new(Code::Internal, format!("method path {path:?}: {e}")))?;
        let mut request = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(http::header::USER_AGENT, USER_AGENT)
            .body(())
            .map_err(|e| Status::new(Code::Internal, format!("building the request: {e}")))?;
        if let Some(limit) = timeout {
            request
                .headers_mut()
                .insert("grpc-timeout", grpc_timeout(limit));
        }
        for (name, value) in metadata {
            request.headers_mut().append(name, value.clone());
        }
        Ok(request)
    }
}

/// `grpc-timeout`: at most eight digits and a unit; milliseconds, rounded up, while they fit.
fn grpc_timeout(limit: Duration) -> http::HeaderValue {
    let millis = limit.as_nanos().div_ceil(1_000_000);
    let value = if millis < 100_000_000 {
        format!("{millis}m")
    } else {
        format!("{}S", limit.as_secs().min(99_999_999))
    };
    http::HeaderValue::from_str(&value).unwrap_or(http::HeaderValue::from_static("99999999S"))
}

/// The sending half of a streaming call.
#[derive(Debug)]
pub struct RequestSink<M> {
    send: h2::SendStream<Bytes>,
    _message: PhantomData<fn(&M)>,
}

impl<M: prost::Message> RequestSink<M> {
    /// Queues one message (HTTP/2 sends it as flow control allows).
    pub fn send(&mut self, message: &M) -> Result<(), Status> {
        let body = framing::encode(message)?;
        self.send
            .send_data(body, false)
            .map_err(|e| Status::from_h2(&e))
    }
}

/// The receiving half of a call: messages, then the status the server ended with.
#[derive(Debug)]
pub struct ResponseStream<M> {
    body: h2::RecvStream,
    frames: Frames,
    /// The call has ended with OK: no more messages.
    ended: bool,
    /// Keeps the call counted as open on its connection.
    _open: CallOpen,
    _message: PhantomData<fn() -> M>,
}

impl<M: prost::Message + Default> ResponseStream<M> {
    fn new(
        response: Result<http::Response<h2::RecvStream>, h2::Error>,
        endpoint: &Endpoint,
        open: CallOpen,
    ) -> Result<ResponseStream<M>, Status> {
        let response = response.map_err(|e| Status::from_h2(&e))?;
        if response.status() != http::StatusCode::OK {
            return Err(Status::from_http(response.status()));
        }
        // A call refused at once answers with its status in the headers alone.
        let ended = match Status::from_fields(response.headers()) {
            Some(status) if status.code() == Code::Ok => true,
            Some(status) => return Err(status),
            None => false,
        };
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        // `application/grpc`, or with a subtype (`+proto`) or parameters; not `grpc-web`.
        let grpc = content_type
            .strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';');
        if !grpc {
            return Err(Status::new(
                Code::Unknown,
                format!(
                    "{} answered with content-type {:?}, not gRPC",
                    endpoint.address,
                    String::from_utf8_lossy(content_type)
                ),
            ));
        }
        Ok(ResponseStream {
            body: response.into_body(),
            frames: Frames::new(endpoint.max_message),
            ended,
            _open: open,
            _message: PhantomData,
        })
    }

    /// The next message; `None` once the server ended the call with OK, an error for any other
    /// end. Cancel-safe: what was received stays buffered for the next call.
    pub async fn message(&mut self) -> Result<Option<M>, Status> {
        loop {
            if let Some(body) = self.frames.next_message()? {
                return M::decode(body).map(Some).map_err(|e| {
                    Status::new(Code::Internal, format!("cannot decode a response: {e}"))
                });
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.data().await {
                Some(Ok(chunk)) => {
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    self.frames.push(chunk);
                }
                Some(Err(e)) => return Err(Status::from_h2(&e)),
                None => {
                    if self.frames.buffered() > 0 {
                        return Err(Status::new(
                            Code::Internal,
                            "the stream ended inside a message",
                        ));
                    }
                    let trailers = self
                        .body
                        .trailers()
                        .await
                        .map_err(|e| Status::from_h2(&e))?;
                    return match trailers.as_ref().and_then(Status::from_fields) {
                        Some(status) if status.code() == Code::Ok => {
                            self.ended = true;
                            Ok(None)
                        }
                        Some(status) => Err(status),
                        None => Err(Status::new(
                            Code::Internal,
                            "the stream ended without a grpc-status",
                        )),
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_written_as_grpc_wants() {
        assert_eq!(grpc_timeout(Duration::from_secs(30)), "30000m");
        assert_eq!(grpc_timeout(Duration::from_micros(1500)), "2m");
        assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
        assert_eq!(grpc_timeout(Duration::from_secs(u64::MAX)), "99999999S");
    }
}
