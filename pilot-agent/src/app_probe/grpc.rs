//! The gRPC probe: one unary `grpc.health.v1.Health/Check` over HTTP/2 without TLS, as the
//! kubelet's gRPC probe sends it.

use axum::http::{header, HeaderMap, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

use super::ProbeTarget;

const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";
/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: i32 = 1;

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// A gRPC message: the uncompressed flag, the length, the bytes.
fn frame(message: &impl Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// Whether the app's health service reports `service` as serving.
pub(super) async fn check(
    target: &ProbeTarget,
    port: u16,
    service: &str,
    incoming: &HeaderMap,
) -> Result<bool, String> {
    let stream = target
        .connect(port)
        .await
        .map_err(|e| format!("connect to {}: {e}", target.addr(port)))?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(target: "probes", error = %e, "gRPC probe connection");
        }
    });
    let uri = format!("http://{}:{port}{CHECK_PATH}", target.host());
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .body(Full::new(frame(&HealthCheckRequest {
            service: service.to_string(),
        })))
        .map_err(|e| format!("gRPC request: {e}"))?;
    if let Some(agent) = incoming.get(header::USER_AGENT) {
        request
            .headers_mut()
            .insert(header::USER_AGENT, agent.clone());
    }
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("gRPC call: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("HTTP status {status}"));
    }
    // A trailers-only answer carries its status in the headers.
    let early = response.headers().get("grpc-status").cloned();
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("gRPC answer: {e}"))?;
    let grpc_status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .cloned()
        .or(early)
        .unwrap_or(HeaderValue::from_static("0"));
    if grpc_status != "0" {
        return Err(format!("grpc-status {grpc_status:?}"));
    }
    let body = collected.to_bytes();
    let message = body
        .get(5..)
        .filter(|_| body.len() >= 5 && body[0] == 0)
        .ok_or_else(|| "not a gRPC message".to_string())?;
    let answer = HealthCheckResponse::decode(message).map_err(|e| format!("answer: {e}"))?;
    Ok(answer.status == SERVING)
}
