//! `DeltaAggregatedResources` served with a response body of our own: every message is framed
//! (5-byte gRPC prefix + protobuf) in a buffer of its own that is freed as soon as it is sent.
//!
//! tonic's generated server encodes all of a stream's messages into one reusable buffer, which
//! then keeps the size of the largest message (the full state, megabytes in a large mesh) for
//! the life of the stream: with hundreds of ztunnels that is gigabytes. Requests are still
//! decoded by tonic, and every other method goes to the generated server.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use http_body::Frame;
use mesh_proto::discovery::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_xds::XdsSnapshot;
use prost::Message;
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
    let mut resp = http::Response::new(tonic::body::Body::new(FramedBody { rx, done: false }));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// Streams responses from a connection task, each framed in its own buffer, then trailers.
struct FramedBody {
    rx: mpsc::Receiver<Result<DeltaDiscoveryResponse, Status>>,
    done: bool,
}

/// One gRPC message: compression flag, big-endian length, protobuf bytes.
fn frame(msg: &DeltaDiscoveryResponse) -> Result<Bytes, Status> {
    let len = msg.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| Status::resource_exhausted(format!("response of {len} bytes is too large")))?;
    let mut buf = Vec::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(prefix);
    msg.encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding a response failed: {e}")))?;
    Ok(Bytes::from(buf))
}

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
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(msg))) => match frame(&msg) {
                Ok(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Err(status) => {
                    self.done = true;
                    Poll::Ready(Some(Ok(trailers(&status))))
                }
            },
            Poll::Ready(Some(Err(status))) => {
                self.done = true;
                Poll::Ready(Some(Ok(trailers(&status))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Ok(trailers(&Status::ok("")))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_the_grpc_prefix() {
        let msg = DeltaDiscoveryResponse {
            nonce: "n".into(),
            ..Default::default()
        };
        let bytes = frame(&msg).expect("frame");
        assert_eq!(bytes[0], 0, "not compressed");
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        assert_eq!(len, bytes.len() - 5);
        assert_eq!(
            DeltaDiscoveryResponse::decode(&bytes[5..]).expect("decode"),
            msg
        );
    }
}
