//! A lean delta-ADS client, so that one benchmark process can play a thousand ztunnels.
//!
//! tonic's streaming decoder keeps one contiguous buffer per stream, grown to the largest
//! message it has read and never shrunk. With 50,000 Pods a ztunnel's initial Address response
//! is about 20 MB, so a thousand tonic clients in one process keep about 20 GB after the
//! initial sync, more than this machine has. This client speaks gRPC over `h2` itself: a
//! message's DATA chunks are kept as they arrive, decoded in place into the resource names
//! only (prost skips the fields it is not asked for), then dropped.

use std::collections::VecDeque;
use std::net::SocketAddr;

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use mesh_proto::discovery::DeltaDiscoveryRequest;
use prost::Message;

/// Largest message accepted (as the tonic clients' limit did).
const MAX_MESSAGE: usize = 256 << 20;

/// What a benchmark needs of a `DeltaDiscoveryResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub type_url: String,
    pub nonce: String,
    /// The names of the resources added or changed.
    pub names: Vec<String>,
}

/// `DeltaDiscoveryResponse` with only the fields kept (tags as in the Envoy API).
#[derive(Clone, PartialEq, prost::Message)]
struct SlimResponse {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<SlimResource>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

/// `Resource` with only its name.
#[derive(Clone, PartialEq, prost::Message)]
struct SlimResource {
    #[prost(string, tag = "3")]
    name: String,
}

/// One delta ADS stream over a connection of its own.
pub struct DeltaAds {
    send: h2::SendStream<Bytes>,
    /// The response headers, until they have come.
    response: Option<h2::client::ResponseFuture>,
    body: Option<h2::RecvStream>,
    frames: Frames,
}

impl DeltaAds {
    /// Connects to `addr` (plain-text HTTP/2) with stream and connection receive windows of
    /// `window` bytes and opens the stream.
    pub async fn connect(addr: SocketAddr, window: u32) -> anyhow::Result<DeltaAds> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(window)
            .initial_connection_window_size(window)
            .handshake::<_, Bytes>(tcp)
            .await
            .context("HTTP/2 handshake")?;
        tokio::spawn(async move {
            // Ends with the connection; the stream reports any error itself.
            let _ = connection.await;
        });
        let mut client = client.ready().await.context("HTTP/2 not ready")?;
        let request = http::Request::post(format!("http://{addr}{}", mesh_proto::DELTA_ADS_PATH))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let (response, send) = client
            .send_request(request, false)
            .context("opening the stream")?;
        // The server may answer the headers only once it has the first request: they are
        // awaited by the first `next`.
        Ok(DeltaAds {
            send,
            response: Some(response),
            body: None,
            frames: Frames::default(),
        })
    }

    /// Sends one request (gRPC-framed, uncompressed).
    pub fn send(&mut self, request: &DeltaDiscoveryRequest) -> anyhow::Result<()> {
        let len = request.encoded_len();
        let mut buf = BytesMut::with_capacity(5 + len);
        buf.put_u8(0);
        buf.put_u32(u32::try_from(len)?);
        request.encode(&mut buf)?;
        self.send
            .send_data(buf.freeze(), false)
            .context("sending a request")
    }

    /// The next response; `None` when the stream ended with status OK. Not cancel-safe: do
    /// not race it against other futures.
    pub async fn next(&mut self) -> anyhow::Result<Option<Names>> {
        loop {
            if let Some(message) = self.frames.next_message()? {
                let slim = SlimResponse::decode(message).context("decoding a response")?;
                return Ok(Some(Names {
                    type_url: slim.type_url,
                    nonce: slim.nonce,
                    names: slim.resources.into_iter().map(|r| r.name).collect(),
                }));
            }
            if let Some(response) = self.response.take() {
                let response = response.await.context("response headers")?;
                if response.status() != http::StatusCode::OK {
                    bail!("status {}", response.status());
                }
                // A call refused at once answers with its status in the headers alone.
                if response.headers().contains_key("grpc-status") {
                    return grpc_end(response.headers());
                }
                self.body = Some(response.into_body());
            }
            let Some(body) = self.body.as_mut() else {
                bail!("stream has no body");
            };
            match body.data().await {
                Some(chunk) => {
                    let chunk = chunk.context("reading the stream")?;
                    let _ = body.flow_control().release_capacity(chunk.len());
                    self.frames.push(chunk);
                }
                None => {
                    return match body.trailers().await? {
                        Some(trailers) => grpc_end(&trailers),
                        None => bail!("stream ended without a grpc-status"),
                    };
                }
            }
        }
    }
}

/// The end of a stream as its `grpc-status` says: `None` for OK, else an error with the
/// server's `grpc-message`.
fn grpc_end(fields: &http::HeaderMap) -> anyhow::Result<Option<Names>> {
    let field = |name: &str| {
        fields
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    match field("grpc-status").as_deref() {
        Some("0") => Ok(None),
        Some(status) => bail!(
            "stream ended with grpc-status {status}: {}",
            field("grpc-message").unwrap_or_default()
        ),
        None => bail!("stream ended without a grpc-status"),
    }
}

/// Received bytes not yet decoded, as the chunks they came in.
#[derive(Debug, Default)]
struct Frames {
    parts: VecDeque<Bytes>,
    len: usize,
}

impl Frames {
    fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.parts.push_back(chunk);
        }
    }

    /// The body of the next gRPC message once all of it has arrived.
    fn next_message(&mut self) -> anyhow::Result<Option<Chunks>> {
        if self.len < 5 {
            return Ok(None);
        }
        let mut header = [0u8; 5];
        self.peek(&mut header);
        if header[0] != 0 {
            bail!("compressed gRPC messages are not supported");
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_MESSAGE {
            bail!("message of {len} bytes is over the {MAX_MESSAGE}-byte limit");
        }
        if self.len < 5 + len {
            return Ok(None);
        }
        self.take(5);
        Ok(Some(self.take(len)))
    }

    /// Copies the first `out.len()` bytes (there are at least that many).
    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for part in &self.parts {
            let n = part.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&part[..n]);
            filled += n;
            if filled == out.len() {
                return;
            }
        }
    }

    /// Removes the first `n` bytes (there are at least that many), without copying.
    fn take(&mut self, mut n: usize) -> Chunks {
        let mut taken = Chunks {
            parts: VecDeque::new(),
            remaining: n,
        };
        self.len -= n;
        while n > 0 {
            let Some(front) = self.parts.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                if let Some(part) = self.parts.pop_front() {
                    taken.parts.push_back(part);
                }
            } else {
                taken.parts.push_back(front.split_to(n));
                n = 0;
            }
        }
        taken
    }
}

/// A message body spread over several chunks, read as one buffer.
#[derive(Debug)]
struct Chunks {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for Chunks {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                return;
            };
            if front.len() <= cnt {
                cnt -= front.len();
                self.remaining -= front.len();
                self.parts.pop_front();
            } else {
                front.advance(cnt);
                self.remaining -= cnt;
                cnt = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_proto::discovery::{DeltaDiscoveryResponse, Resource};

    use super::*;

    fn framed(resp: &DeltaDiscoveryResponse) -> Vec<u8> {
        let body = resp.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn decodes_messages_split_across_any_chunks() {
        let resp = |n: usize| DeltaDiscoveryResponse {
            type_url: "type.googleapis.com/istio.workload.Address".into(),
            nonce: format!("nonce-{n}"),
            resources: (0..n)
                .map(|i| Resource {
                    name: format!("res-{i}"),
                    version: "v1".into(),
                    ..Default::default()
                })
                .collect(),
            removed_resources: vec!["gone".into()],
            ..Default::default()
        };
        let mut wire = framed(&resp(3));
        wire.extend(framed(&resp(0)));
        wire.extend(framed(&resp(40)));
        for chunk in [1, 2, 5, 7, 64, wire.len()] {
            let mut frames = Frames::default();
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                frames.push(Bytes::copy_from_slice(piece));
                while let Some(m) = frames.next_message().expect("valid") {
                    let slim = SlimResponse::decode(m).expect("decodes");
                    got.push((slim.nonce, slim.resources.len()));
                }
            }
            assert_eq!(
                got,
                [
                    ("nonce-3".to_string(), 3),
                    ("nonce-0".into(), 0),
                    ("nonce-40".into(), 40)
                ],
                "chunk size {chunk}"
            );
            assert_eq!(frames.len, 0);
        }
    }

    #[test]
    fn refuses_compressed_and_oversized_messages() {
        let mut frames = Frames::default();
        frames.push(Bytes::from_static(&[1, 0, 0, 0, 1, 0]));
        assert!(frames.next_message().is_err());
        let mut frames = Frames::default();
        frames.push(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]));
        assert!(frames.next_message().is_err());
    }
}
