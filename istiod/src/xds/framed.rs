//! `DeltaAggregatedResources` served with a response body of our own: every message is framed
//! (5-byte gRPC prefix + protobuf) straight from the snapshot's shared resources, a chunk of
//! about 256 KiB at a time, when HTTP/2 has room for it (`mesh_xds::FrameChunks`). A full state
//! waiting for a slow client's flow-control window is then its shared resources, not a copy
//! of each plus their encoded bytes.
//!
//! tonic's generated server encodes all of a stream's messages into one reusable buffer, which
//! then keeps the size of the largest message (the full state, megabytes in a large mesh) for
//! the life of the stream: with hundreds of ztunnels that is gigabytes. Requests are still
//! decoded by tonic, and every other method goes to the generated server.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use mesh_proto::discovery::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_xds::XdsSnapshot;
use mesh_xds::{FrameChunks, SharedResponse};
use tokio::sync::mpsc;
use tonic::codec::{Codec, Streaming};
use tonic::codegen::{http, Service};
use tonic::server::NamedService;
use tonic::Status;

use super::{XdsServer, MAX_RECV_MESSAGE_SIZE};

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// The ADS service: delta through [`FramedBody`], everything else through tonic's server.
pub struct AdsService<S: XdsSnapshot> {
    server: XdsServer<S>,
    fallback: AggregatedDiscoveryServiceServer<XdsServer<S>>,
}

impl<S: XdsSnapshot> AdsService<S> {
    pub(crate) fn new(server: XdsServer<S>) -> AdsService<S> {
        let fallback = AggregatedDiscoveryServiceServer::new(server.clone())
            .max_decoding_message_size(MAX_RECV_MESSAGE_SIZE);
        AdsService { server, fallback }
    }
}

impl<S: XdsSnapshot> Clone for AdsService<S> {
    fn clone(&self) -> Self {
        AdsService {
            server: self.server.clone(),
            fallback: self.fallback.clone(),
        }
    }
}

impl<S: XdsSnapshot> std::fmt::Debug for AdsService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdsService")
    }
}

impl<S: XdsSnapshot> NamedService for AdsService<S> {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<S: XdsSnapshot> Service<http::Request<tonic::body::Body>> for AdsService<S> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() == mesh_proto::DELTA_ADS_PATH {
            let server = self.server.clone();
            Box::pin(async move { Ok(serve_delta(&server, req)) })
        } else {
            let mut fallback = self.fallback.clone();
            Box::pin(async move { fallback.call(req).await })
        }
    }
}

/// The peer address tonic recorded for the connection (plain or TLS).
fn peer_addr<B>(req: &http::Request<B>) -> Option<std::net::SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let ext = req.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}

fn serve_delta<S: XdsSnapshot>(
    server: &XdsServer<S>,
    req: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    if let Err(status) = server.check_ready() {
        return status.into_http();
    }
    let mut codec =
        tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default();
    let peer = peer_addr(&req);
    // Who called, when the port authenticates callers (`RequireAuth` put it there).
    let caller = req.extensions().get::<crate::auth::Caller>().cloned();
    let inbound = Streaming::new_request(
        codec.decoder(),
        req.into_body(),
        None,
        Some(MAX_RECV_MESSAGE_SIZE),
    );
    let (conn, rx) = server.open(peer, caller);
    tokio::spawn(conn.run(inbound));
    let mut resp = http::Response::new(tonic::body::Body::new(FramedBody {
        rx,
        sending: None,
        done: false,
    }));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// Streams responses from a connection task, each framed in chunks of its own, then trailers.
struct FramedBody {
    rx: mpsc::Receiver<Result<SharedResponse, Status>>,
    /// The rest of the message being sent.
    sending: Option<FrameChunks>,
    done: bool,
}

/// About how many bytes of a message are encoded ahead of the wire.
const CHUNK: usize = 256 << 10;

fn trailers(status: &Status) -> Frame<Bytes> {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    Frame::trailers(map)
}

impl http_body::Body for FramedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            if let Some(chunks) = self.sending.as_mut() {
                match chunks.next() {
                    Some(chunk) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk))))),
                    None => self.sending = None,
                }
            }
            let status = match ready!(self.rx.poll_recv(cx)) {
                Some(Ok(msg)) => match msg.frames(CHUNK) {
                    Ok(chunks) => {
                        self.sending = Some(chunks);
                        continue;
                    }
                    Err(error @ mesh_xds::FrameError::TooLarge(_)) => {
                        Status::resource_exhausted(error.to_string())
                    }
                    Err(error @ mesh_xds::FrameError::Encode(_)) => {
                        Status::internal(error.to_string())
                    }
                },
                Some(Err(status)) => status,
                None => Status::ok(""),
            };
            self.done = true;
            return Poll::Ready(Some(Ok(trailers(&status))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body::Body as _;
    use mesh_xds::Resource;
    use prost::Message;

    use super::*;

    /// Polls `body` to its end: (the data bytes, how many data frames, the trailers).
    async fn drain(mut body: FramedBody) -> (Vec<u8>, usize, http::HeaderMap) {
        let mut data = Vec::new();
        let mut frames = 0;
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            let frame = frame
                .expect("trailers end the body")
                .expect("no body error");
            match frame.into_data() {
                Ok(bytes) => {
                    data.extend_from_slice(&bytes);
                    frames += 1;
                }
                Err(frame) => {
                    let trailers = frame.into_trailers().expect("data or trailers");
                    assert!(body.is_end_stream());
                    return (data, frames, trailers);
                }
            }
        }
    }

    #[tokio::test]
    async fn a_full_state_goes_out_in_chunks_then_ok_trailers() {
        let msg = SharedResponse {
            system_version_info: "3".into(),
            type_url: "type.googleapis.com/istio.workload.Address".into(),
            nonce: "3-1".into(),
            resources: (0..4000)
                .map(|i| {
                    Arc::new(Resource::from_encoded(
                        "type.googleapis.com/istio.workload.Address",
                        format!("workload-{i}"),
                        vec![format!("/10.0.{}.{}", i / 256, i % 256)],
                        vec![(i % 251) as u8; 300],
                    ))
                })
                .collect(),
            ..SharedResponse::default()
        };
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(msg.clone())).await.expect("queue");
        drop(tx);
        let body = FramedBody {
            rx,
            sending: None,
            done: false,
        };
        let (data, frames, trailers) = drain(body).await;
        assert!(frames > 4, "{frames} data frames");
        assert_eq!(data[0], 0, "not compressed");
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        assert_eq!(len, data.len() - 5);
        let decoded = DeltaDiscoveryResponse::decode(&data[5..]).expect("decode");
        assert_eq!(decoded, msg.into_proto());
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
    }
}
