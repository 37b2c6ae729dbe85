//! `pods/<name>/portforward` over WebSocket, as kube-apiserver serves it (the kubelet's part
//! included): subprotocol `v4.channel.k8s.io`, `?ports=` naming the ports, and for the n-th
//! port a data channel `2n` and an error channel `2n+1`. Each channel's first frame is the
//! channel byte and the port (little-endian); after that a binary message is the channel byte
//! and data. The bytes go to a TCP connection to the pod: the address a test registered for
//! that pod and port ([`super::FakeApiServer::forward_pod_port`]), else the pod's `podIP` and
//! the port. A connection that fails is reported on the error channel as the kubelet does.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::store::{resource_key, ApiStatus};
use super::{lock, Shared};

/// The subprotocol served (kube clients also offer v5, which adds close signals).
const PROTOCOL: &str = "v4.channel.k8s.io";

/// Handles the upgrade request for `pods/<name>/portforward`.
pub async fn handle(
    State(shared): State<Arc<Shared>>,
    Path((namespace, pod)): Path<(String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    lock(&shared.requests).push(format!(
        "GET /api/v1/namespaces/{namespace}/pods/{pod}/portforward"
    ));
    let fail = |s: ApiStatus| super::http::error_response(&s);
    if !shared.available.load(std::sync::atomic::Ordering::SeqCst) {
        return fail(ApiStatus::new(
            503,
            "ServiceUnavailable",
            "the API server is shutting down",
        ));
    }
    let mut ports = Vec::new();
    for (k, v) in &query {
        if k != "ports" {
            continue;
        }
        for p in v.split(',') {
            match p.trim().parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => {
                    return fail(ApiStatus::new(
                        400,
                        "BadRequest",
                        format!("invalid port {p:?}"),
                    ))
                }
            }
        }
    }
    if ports.is_empty() {
        return fail(ApiStatus::new(
            400,
            "BadRequest",
            "at least one port is required",
        ));
    }
    let found = lock(&shared.store).get(&resource_key("", "v1", "pods"), &namespace, &pod);
    let pod_obj = match found {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let Ok(ws) = ws else {
        return fail(ApiStatus::new(
            400,
            "BadRequest",
            "port forwarding needs a WebSocket upgrade",
        ));
    };
    let targets: Vec<Result<SocketAddr, String>> = ports
        .iter()
        .map(|port| target(&shared, &namespace, &pod, &pod_obj, *port))
        .collect();
    ws.protocols([PROTOCOL])
        .on_upgrade(move |socket| forward(socket, ports, targets))
        .into_response()
}

/// Where the pod's `port` is reached.
fn target(
    shared: &Shared,
    namespace: &str,
    pod: &str,
    pod_obj: &Value,
    port: u16,
) -> Result<SocketAddr, String> {
    let key = (namespace.to_string(), pod.to_string(), port);
    if let Some(addr) = lock(&shared.pod_ports).get(&key) {
        return Ok(*addr);
    }
    let ip = pod_obj["status"]["podIP"]
        .as_str()
        .ok_or_else(|| format!("pod {namespace}/{pod} has no IP yet"))?;
    ip.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| format!("pod {namespace}/{pod} has a bad podIP {ip:?}"))
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

/// Forwards one port (the first; clients here ask for one) between the socket and the pod.
async fn forward(mut socket: WebSocket, ports: Vec<u16>, targets: Vec<Result<SocketAddr, String>>) {
    for (i, port) in ports.iter().enumerate() {
        let Ok(index) = u8::try_from(i) else { return };
        for channel in [2 * index, 2 * index + 1] {
            if socket
                .send(frame(channel, &port.to_le_bytes()))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    let (Some(port), Some(target)) = (ports.first(), targets.into_iter().next()) else {
        return;
    };
    let connected = match target {
        Ok(addr) => tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("error forwarding port {port} to pod: dial tcp {addr}: {e}")),
        Err(e) => Err(e),
    };
    let mut stream = match connected {
        Ok(s) => s,
        Err(e) => {
            let _ = socket.send(frame(1, e.as_bytes())).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    // Data for channel 0; anything else (other ports, resizes) is dropped.
                    if data.first() == Some(&0) && stream.write_all(&data[1..]).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            n = stream.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if socket.send(frame(0, &buf[..n])).await.is_err() {
                        break;
                    }
                }
            },
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}
