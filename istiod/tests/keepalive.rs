//! istiod's gRPC connections: PINGs find a proxy that vanished without closing its connection,
//! and connections are sent GOAWAY at their maximum age (Istio's `--keepalive*` flags).

mod common;

use std::time::Duration;

use http::HeaderMap;
use mesh_grpc::Endpoint;
use mesh_grpc::{Channel, RequestSink, ResponseStream, Status};
use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_testutil::{eventually, namespace_yaml, ClusterDir, SilentRelay};

async fn istiod(flags: &[&str]) -> (istiod::server::Running, ClusterDir, tempfile::TempDir) {
    let cluster = ClusterDir::new();
    cluster.write(
        "namespaces.yaml",
        &namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
    );
    let state = tempfile::tempdir().expect("state dir");
    // The local mode wants a tokens file; the plaintext port asks for no token.
    let tokens = state.path().join("tokens.yaml");
    std::fs::write(&tokens, "tokens: []\n").expect("tokens");
    let mut all = vec![
        format!("--config-dir={}", cluster.path().display()),
        format!("--tokens-file={}", tokens.display()),
    ];
    all.extend(flags.iter().map(|f| f.to_string()));
    let running = common::start_istiod(&all, state.path()).await;
    (running, cluster, state)
}

/// A ztunnel's first WDS request.
fn addresses() -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(Node {
            id: "ztunnel~10.0.0.1~ztunnel-abc.istio-system~istio-system.svc.cluster.local".into(),
            ..Node::default()
        }),
        type_url: mesh_proto::type_url::ADDRESS.to_string(),
        ..DeltaDiscoveryRequest::default()
    }
}

/// A client that never pings on its own: only istiod's PINGs can find the silence.
fn client(relay: &SilentRelay) -> Channel {
    Endpoint::new(
        &format!("http://{}", relay.addr()),
        std::path::Path::new("/nonexistent"),
        None,
    )
    .expect("endpoint")
    .keepalive(None, Duration::from_secs(1))
    .channel()
}

type Wds = (
    RequestSink<DeltaDiscoveryRequest>,
    ResponseStream<DeltaDiscoveryResponse>,
);

/// Opens a WDS stream (the plaintext port asks for no token).
async fn open(channel: &Channel) -> Result<Wds, Status> {
    let first = [addresses()];
    channel
        .streaming(mesh_proto::DELTA_ADS_PATH, &HeaderMap::new(), &first)
        .await
}

#[tokio::test]
async fn a_proxy_that_fell_silent_is_dropped_after_an_unanswered_ping() {
    let (istiod, _cluster, _state) =
        istiod(&["--keepaliveInterval=200ms", "--keepaliveTimeout=1s"]).await;
    let relay = SilentRelay::to(istiod.grpc_addr).await.expect("relay");
    let channel = client(&relay);
    let (_sink, mut responses) = open(&channel).await.expect("stream");
    responses.message().await.expect("first").expect("some");
    // Pinged every 200 ms and answered, the quiet stream stays.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(relay.closed_by_server(), 0, "a live proxy was dropped");

    relay.silence(true);
    assert!(
        eventually(Duration::from_secs(10), || relay.closed_by_server() == 1).await,
        "istiod kept the connection of the silent proxy"
    );
}

#[tokio::test]
async fn connections_are_sent_goaway_at_their_maximum_age() {
    let (istiod, _cluster, _state) = istiod(&["--keepaliveMaxServerConnectionAge=1s"]).await;
    let relay = SilentRelay::to(istiod.grpc_addr).await.expect("relay");
    let channel = client(&relay);
    let (_sink, mut first) = open(&channel).await.expect("stream");
    first.message().await.expect("first").expect("some");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The connection had its GOAWAY: a new call dials a new one, while the old stream may go
    // on through the grace period.
    let (_sink, mut second) = open(&channel).await.expect("stream after GOAWAY");
    second.message().await.expect("second").expect("some");
    assert_eq!(relay.connections(), 2);
    // 10 s of grace (and up to a tenth of the age) after the age, the old connection is closed
    // with its stream.
    let ended = tokio::time::timeout(Duration::from_secs(20), first.message())
        .await
        .expect("the old connection was closed after the grace period")
        .expect_err("its stream failed");
    assert_eq!(ended.code(), mesh_grpc::Code::Unavailable, "{ended}");
    assert_eq!(relay.closed_by_server(), 1);
}
