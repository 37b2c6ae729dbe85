//! The ADS server over real gRPC on loopback, driven by envoy-types' generated client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use istiod::xds::{XdsMetrics, XdsServer};
use mesh_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest};
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_proto::envoy::pb::google::rpc::Status as RpcStatus;
use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};
use mesh_proto::workload::{address, Address, Workload};
use mesh_xds::{DeltaClient, Resource};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::Streaming;

const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- test snapshot

use mesh_testutil::MemorySnapshot as Snap;

/// A workload `name` with IP 10.0.0.`ip`, alias `net1/10.0.0.<ip>`; `pad` bytes of filler.
fn workload(name: &str, ip: u8, rev: &str, pad: usize) -> Arc<Resource> {
    let w = Workload {
        uid: format!("Kubernetes//Pod/default/{name}"),
        name: name.to_string(),
        namespace: "default".to_string(),
        addresses: vec![vec![10, 0, 0, ip]],
        canonical_revision: format!("{rev}{}", "x".repeat(pad)),
        ..Workload::default()
    };
    let addr = Address {
        r#type: Some(address::Type::Workload(w)),
    };
    Arc::new(Resource::new(
        ADDRESS,
        name,
        vec![format!("net1/10.0.0.{ip}")],
        &addr,
    ))
}

fn policy(name: &str, rev: &str) -> Arc<Resource> {
    let p = mesh_proto::security::Authorization {
        name: name.to_string(),
        namespace: rev.to_string(),
        ..Default::default()
    };
    Arc::new(Resource::new(AUTHORIZATION, name, vec![], &p))
}

fn base() -> Snap {
    Snap::new(&[
        workload("a", 1, "r1", 0),
        workload("b", 2, "r1", 0),
        workload("c", 3, "r1", 0),
        policy("ns/allow", "r1"),
    ])
}

// ---------------------------------------------------------------- harness

struct Harness {
    addr: SocketAddr,
    publish: watch::Sender<Arc<Snap>>,
    server: XdsServer<Snap>,
}

async fn start(snap: Snap, metrics: XdsMetrics) -> Harness {
    start_with(snap, |s| s.with_metrics(metrics)).await
}

async fn start_with(
    snap: Snap,
    configure: impl FnOnce(XdsServer<Snap>) -> XdsServer<Snap>,
) -> Harness {
    let (publish, rx) = watch::channel(Arc::new(snap));
    let server = configure(XdsServer::new(rx));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = server.clone().into_service();
    tokio::spawn(async move {
        Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("server");
    });
    Harness {
        addr,
        publish,
        server,
    }
}

impl Harness {
    fn publish(&self, snap: &Snap) {
        self.publish.send_replace(Arc::new(snap.clone()));
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    async fn client(&self) -> Client {
        Client::connect(self.channel().await).await
    }
}

struct Client {
    requests: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
}

fn node(id: &str) -> Node {
    use mesh_proto::envoy::pb::google::protobuf::{value::Kind, Struct, Value};
    let version = Value {
        kind: Some(Kind::StringValue("1.99.0".into())),
    };
    Node {
        id: id.to_string(),
        metadata: Some(Struct {
            fields: [("ISTIO_VERSION".to_string(), version)].into(),
        }),
        ..Node::default()
    }
}

fn ztunnel_node(n: usize) -> Node {
    node(&format!(
        "ztunnel~10.1.0.{n}~ztunnel-{n}.istio-system~istio-system.svc.cluster.local"
    ))
}

fn request(type_url: &str, sub: &[&str], unsub: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(ztunnel_node(1)),
        type_url: type_url.to_string(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
        ..DeltaDiscoveryRequest::default()
    }
}

impl Client {
    async fn connect(channel: Channel) -> Client {
        let (requests, rx) = mpsc::unbounded_channel();
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut grpc = AggregatedDiscoveryServiceClient::new(channel);
        let responses = grpc
            .delta_aggregated_resources(stream)
            .await
            .expect("delta stream")
            .into_inner();
        Client {
            requests,
            responses,
        }
    }

    fn send(&self, req: DeltaDiscoveryRequest) {
        self.requests.send(req).expect("request stream open");
    }

    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.responses.message())
            .await
            .expect("response within the deadline")
            .expect("stream healthy")
            .expect("stream open")
    }

    /// Receives and ACKs.
    async fn recv_ack(&mut self) -> DeltaDiscoveryResponse {
        let resp = self.recv().await;
        self.send(mesh_xds::ack(&resp));
        resp
    }

    async fn silent(&mut self, wait: Duration) {
        if let Ok(msg) = tokio::time::timeout(wait, self.responses.message()).await {
            panic!("expected no response, got {msg:?}");
        }
    }
}

fn names(resp: &DeltaDiscoveryResponse) -> Vec<&str> {
    resp.resources.iter().map(|r| r.name.as_str()).collect()
}

fn syncz_conn(h: &Harness) -> serde_json::Value {
    let all = h.server.syncz();
    let conns = all.as_array().expect("array");
    assert_eq!(conns.len(), 1, "{all}");
    conns[0].clone()
}

fn syncz_type(h: &Harness, type_url: &str) -> serde_json::Value {
    let conn = syncz_conn(h);
    conn["types"]
        .as_array()
        .expect("types")
        .iter()
        .find(|t| t["typeUrl"] == type_url)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_url} in {conn}"))
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A codec that sends and receives raw bytes, to put garbage on the wire.
#[derive(Debug, Clone, Default)]
struct RawCodec;

#[derive(Debug)]
struct RawCoder;

impl tonic::codec::Encoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let out = src.chunk().to_vec();
        src.advance(out.len());
        Ok(Some(out))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCoder;
    type Decoder = RawCoder;
    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }
    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

// ---------------------------------------------------------------- cases

#[tokio::test]
async fn wildcard_gets_everything_then_only_changes() {
    let snap = base();
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let mut c = h.client().await;
    c.send(request(ADDRESS, &[], &[]));
    let first = c.recv_ack().await;
    assert_eq!(first.type_url, ADDRESS);
    assert_eq!(names(&first), ["a", "b", "c"]);
    assert_eq!(first.resources[0].aliases, ["net1/10.0.0.1"]);
    c.send(request(AUTHORIZATION, &[], &[]));
    let authz = c.recv_ack().await;
    assert_eq!(names(&authz), ["ns/allow"]);

    let s2 = snap.next(&[workload("b", 2, "r2", 0)], &[]);
    h.publish(&s2);
    let delta = c.recv_ack().await;
    assert_eq!(delta.type_url, ADDRESS);
    assert_eq!(names(&delta), ["b"], "exactly the changed resource");
    assert!(delta.removed_resources.is_empty());
    assert_eq!(delta.system_version_info, "2");

    let s3 = s2.next(&[], &[(ADDRESS, "c"), (AUTHORIZATION, "ns/allow")]);
    h.publish(&s3);
    let mut removed = BTreeMap::new();
    for _ in 0..2 {
        let r = c.recv_ack().await;
        assert!(r.resources.is_empty());
        removed.insert(r.type_url.clone(), r.removed_resources.clone());
    }
    assert_eq!(removed[ADDRESS], ["c"]);
    assert_eq!(removed[AUTHORIZATION], ["ns/allow"]);
    c.silent(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn nack_is_kept_in_syncz_until_ack() {
    let snap = base();
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let mut c = h.client().await;
    c.send(request(ADDRESS, &[], &[]));
    let first = c.recv().await;
    let mut nack = mesh_xds::ack(&first);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "workload a: bad address".into(),
        details: vec![],
    });
    c.send(nack);
    eventually("NACK recorded", || {
        !syncz_type(&h, ADDRESS)["nack"].is_null()
    })
    .await;
    let t = syncz_type(&h, ADDRESS);
    assert_eq!(t["nack"]["message"], "workload a: bad address");
    assert!(t["nonceAcked"].is_null());
    assert_eq!(t["nonceSent"], first.nonce.as_str());
    let conn = syncz_conn(&h);
    assert_eq!(
        conn["nodeId"],
        "ztunnel~10.1.0.1~ztunnel-1.istio-system~istio-system.svc.cluster.local"
    );
    assert!(conn["peer"]
        .as_str()
        .expect("peer")
        .starts_with("127.0.0.1:"));
    assert!(conn["connectedSince"].as_f64().expect("since") > 0.0);

    let s2 = snap.next(&[workload("a", 1, "r2", 0)], &[]);
    h.publish(&s2);
    let fixed = c.recv_ack().await;
    assert_eq!(names(&fixed), ["a"]);
    eventually("ACK recorded", || {
        syncz_type(&h, ADDRESS)["nonceAcked"] == fixed.nonce.as_str()
    })
    .await;
    let t = syncz_type(&h, ADDRESS);
    assert!(t["nack"].is_null(), "ACK clears the current NACK: {t}");
    assert_eq!(t["nackHistory"][0]["message"], "workload a: bad address");
    assert_eq!(t["versionSent"], 2);
    assert_eq!(t["versionAcked"], 2);
    assert_eq!(t["wildcard"], true);
    assert_eq!(t["resourcesSent"], 4);
}

#[tokio::test]
async fn reconnect_gets_only_differences() {
    let snap = base();
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let mut local = DeltaClient::new(Some(ztunnel_node(1)));
    {
        let mut c = h.client().await;
        c.send(local.subscribe_wildcard(ADDRESS));
        let resp = c.recv().await;
        let (ack, applied) = local.handle_response(&resp);
        applied.expect("valid");
        c.send(ack);
    }
    eventually("first connection gone", || h.server.connections() == 0).await;
    let s2 = snap.next(
        &[workload("b", 2, "r2", 0), workload("d", 4, "r1", 0)],
        &[(ADDRESS, "c")],
    );
    h.publish(&s2);

    let mut c = h.client().await;
    let reqs = local.reconnect_requests();
    assert_eq!(reqs[0].initial_resource_versions.len(), 3);
    for r in reqs {
        c.send(r);
    }
    let resp = c.recv_ack().await;
    assert_eq!(names(&resp), ["b", "d"]);
    assert_eq!(resp.removed_resources, ["c"]);
    local.apply(&resp).expect("apply");
    let have: Vec<&String> = local.resources(ADDRESS).expect("type").keys().collect();
    assert_eq!(have, ["a", "b", "d"]);
}

#[tokio::test]
async fn explicit_subscription_and_unsubscribe() {
    let snap = base();
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let mut c = h.client().await;
    c.send(request(ADDRESS, &["a", "nope"], &[]));
    let first = c.recv_ack().await;
    assert_eq!(names(&first), ["a"]);
    assert_eq!(
        first.removed_resources,
        ["nope"],
        "unknown names are reported removed"
    );

    // Changes to resources the client did not ask for are not pushed.
    let s2 = snap.next(&[workload("b", 2, "r2", 0)], &[]);
    h.publish(&s2);
    c.silent(Duration::from_millis(200)).await;

    c.send(request(ADDRESS, &["b"], &[]));
    let sub = c.recv_ack().await;
    assert_eq!(names(&sub), ["b"]);
    assert_eq!(sub.system_version_info, "2");

    c.send(request(ADDRESS, &[], &["a"]));
    let unsub = c.recv_ack().await;
    assert!(unsub.resources.is_empty());
    assert_eq!(unsub.removed_resources, ["a"]);
    let s3 = s2.next(&[workload("a", 1, "r3", 0)], &[]);
    h.publish(&s3);
    c.silent(Duration::from_millis(200)).await;
    let t = syncz_type(&h, ADDRESS);
    assert_eq!(t["wildcard"], false);
    assert_eq!(t["names"], serde_json::json!(["b", "nope"]));
}

#[tokio::test]
async fn alias_subscription_resolves_to_the_workload() {
    let snap = base();
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let mut c = h.client().await;
    // ztunnel's on-demand start: subscribe and unsubscribe the wildcard.
    c.send(request(ADDRESS, &["*"], &["*"]));
    let empty = c.recv_ack().await;
    assert!(empty.resources.is_empty() && empty.removed_resources.is_empty());
    c.send(request(ADDRESS, &["net1/10.0.0.2"], &[]));
    let resp = c.recv_ack().await;
    assert_eq!(names(&resp), ["b"]);
    assert_eq!(resp.resources[0].aliases, ["net1/10.0.0.2"]);
    c.send(request(ADDRESS, &["net1/10.9.9.9"], &[]));
    let missing = c.recv_ack().await;
    assert!(missing.resources.is_empty());
    assert_eq!(missing.removed_resources, ["net1/10.9.9.9"]);
    // The workload behind the alias changes: pushed.
    let s2 = snap.next(&[workload("b", 2, "r2", 0)], &[]);
    h.publish(&s2);
    let pushed = c.recv_ack().await;
    assert_eq!(names(&pushed), ["b"]);
}

#[tokio::test]
async fn unknown_type_url_does_not_break_the_stream() {
    let h = start(base(), XdsMetrics::default()).await;
    let mut c = h.client().await;
    c.send(request("type.googleapis.com/istio.unknown.Thing", &[], &[]));
    c.send(request(ADDRESS, &[], &[]));
    let resp = c.recv_ack().await;
    assert_eq!(resp.type_url, ADDRESS);
    assert_eq!(names(&resp), ["a", "b", "c"]);
    let types = syncz_conn(&h)["types"].as_array().expect("types").len();
    assert_eq!(types, 1, "the unknown type is not tracked");
}

#[tokio::test]
async fn garbage_ends_only_that_stream() {
    let h = start(base(), XdsMetrics::default()).await;
    let mut good = h.client().await;
    good.send(request(ADDRESS, &[], &[]));
    good.recv_ack().await;

    let mut grpc = tonic::client::Grpc::new(h.channel().await);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(mesh_proto::DELTA_ADS_PATH);
    // An invalid varint: not a protobuf message.
    let garbage = tokio_stream::iter(vec![vec![0xff_u8; 11]]);
    let mut bad = grpc
        .streaming(tonic::Request::new(garbage), path, RawCodec)
        .await
        .expect("stream opens")
        .into_inner();
    let end = tokio::time::timeout(WAIT, bad.message())
        .await
        .expect("ends in time");
    let status = end.expect_err("the bad stream ends with an error");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    let s2 = base().next(&[workload("a", 1, "r2", 0)], &[]);
    h.publish(&s2);
    assert_eq!(
        names(&good.recv_ack().await),
        ["a"],
        "the other stream is unaffected"
    );
}

#[tokio::test]
async fn state_of_the_world_gets_the_whole_type_acks_and_nacks() {
    let snap = base();
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let mut grpc = AggregatedDiscoveryServiceClient::new(h.channel().await);
    let (tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
    let req = |names: &[&str], nonce: &str| DiscoveryRequest {
        node: Some(ztunnel_node(1)),
        type_url: ADDRESS.to_string(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.to_string(),
        ..DiscoveryRequest::default()
    };
    tx.send(req(&[], "")).expect("send");
    let mut responses = grpc
        .stream_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect("SotW served")
        .into_inner();
    async fn next(
        responses: &mut tonic::Streaming<mesh_proto::discovery::DiscoveryResponse>,
    ) -> mesh_proto::discovery::DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(5), responses.message())
            .await
            .expect("in time")
            .expect("stream ok")
            .expect("a response")
    }
    let first = next(&mut responses).await;
    assert_eq!(first.resources.len(), 3, "the whole type");
    assert_eq!(first.version_info, "1");
    tx.send(req(&[], &first.nonce)).expect("ack");
    // One workload changes: the SotW response still carries all three.
    let s2 = snap.next(&[workload("b", 2, "r2", 0)], &[]);
    h.publish(&s2);
    let second = next(&mut responses).await;
    assert_eq!(second.resources.len(), 3);
    assert_eq!(second.version_info, "2");
    // A NACK is kept for /debug/syncz, as on delta streams.
    tx.send(DiscoveryRequest {
        error_detail: Some(mesh_proto::envoy::pb::google::rpc::Status {
            code: 3,
            message: "bad workload b".into(),
            ..Default::default()
        }),
        ..req(&[], &second.nonce)
    })
    .expect("nack");
    eventually("NACK recorded", || {
        syncz_type(&h, ADDRESS)["nack"]["message"] == "bad workload b"
    })
    .await;
}

#[tokio::test]
async fn fifty_clients_converge_and_metrics_count_them() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = XdsMetrics::register(&mut registry);
    let snap = base();
    let h = start(snap.clone(), metrics).await;
    let mut clients = Vec::new();
    for _ in 0..50 {
        let mut c = h.client().await;
        c.send(request(ADDRESS, &[], &[]));
        assert_eq!(c.recv_ack().await.resources.len(), 3);
        clients.push(c);
    }
    let s2 = snap.next(&[workload("c", 3, "r2", 0)], &[]);
    h.publish(&s2);
    let waits = clients.into_iter().map(|mut c| {
        tokio::spawn(async move {
            let r = c.recv_ack().await;
            assert_eq!(
                (names(&r), r.system_version_info.as_str()),
                (vec!["c"], "2")
            );
            c
        })
    });
    let clients = futures::future::join_all(waits).await;
    assert_eq!(clients.len(), 50);
    assert_eq!(h.server.connections(), 50);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("pilot_xds{version=\"1.99.0\"} 50"), "{text}");
    assert!(
        text.contains("pilot_xds_pushes_total{type=\"wds\"} 100"),
        "{text}"
    );
    assert!(
        text.contains("pilot_proxy_convergence_time_count 50"),
        "{text}"
    );
    drop(clients);
    eventually("connections closed", || h.server.connections() == 0).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("pilot_xds{version=\"1.99.0\"} 0"), "{text}");
}

#[tokio::test]
async fn a_client_that_never_reads_does_not_block_others() {
    // ~2 MB per full push: far beyond the HTTP/2 windows, so the stuck stream really blocks.
    let big: Vec<Arc<Resource>> = (0..200u8)
        .map(|i| workload(&format!("w{i}"), i, "r1", 10_000))
        .collect();
    let snap = Snap::new(&big);
    let h = start(snap.clone(), XdsMetrics::default()).await;
    let stuck = h.client().await;
    stuck.send(request(ADDRESS, &[], &[]));
    let mut good = h.client().await;
    good.send(request(ADDRESS, &[], &[]));
    assert_eq!(good.recv_ack().await.resources.len(), 200);

    let mut current = snap;
    for round in 2..=10 {
        let rev = format!("r{round}");
        let changed: Vec<Arc<Resource>> = (0..200u8)
            .map(|i| workload(&format!("w{i}"), i, &rev, 10_000))
            .collect();
        current = current.next(&changed, &[]);
        h.publish(&current);
        let r = good.recv_ack().await;
        assert_eq!(r.resources.len(), 200);
        assert_eq!(r.system_version_info, round.to_string());
    }
    // The stuck connection is still registered, really stuck behind an older snapshot, and debug
    // reads do not block on it.
    let syncz = h.server.syncz();
    let conns = syncz.as_array().expect("array");
    assert_eq!(conns.len(), 2);
    let stuck_version = conns
        .iter()
        .filter_map(|c| c["snapshotVersion"].as_u64())
        .min()
        .expect("versions");
    assert!(
        stuck_version < 10,
        "the stuck stream should lag: {stuck_version}"
    );
    drop(stuck);
}

#[tokio::test]
async fn full_pushes_beyond_the_byte_budget_wait_until_earlier_ones_are_answered() {
    // Plenty of throttle permits, but a byte budget smaller than one full push: each full push
    // takes all of it until its client answers.
    let many: Vec<Arc<Resource>> = (0..100u8)
        .map(|i| workload(&format!("w{i}"), i, "v1", 0))
        .collect();
    let h = start_with(Snap::new(&many), |s| {
        s.with_push_throttle(100).with_push_bytes(1024)
    })
    .await;
    let mut first = h.client().await;
    first.send(request(ADDRESS, &[], &[]));
    let resp = first.recv().await;
    assert_eq!(resp.resources.len(), 100);

    let mut second = h.client().await;
    second.send(request(ADDRESS, &[], &[]));
    second.silent(Duration::from_millis(500)).await;

    // A small on-demand subscription is not a full push in bytes: it goes ahead.
    let mut third = h.client().await;
    third.send(request(ADDRESS, &["w7"], &[]));
    let small = third.recv().await;
    assert_eq!(names(&small), vec!["w7"]);

    first.send(mesh_xds::ack(&resp));
    let resp2 = second.recv().await;
    assert_eq!(resp2.resources.len(), 100);
}

#[tokio::test]
async fn full_pushes_wait_for_a_throttle_permit_until_the_previous_one_is_answered() {
    // 100 workloads: a full-state response, which holds the single permit until answered.
    let many: Vec<Arc<Resource>> = (0..100u8)
        .map(|i| workload(&format!("w{i}"), i, "v1", 0))
        .collect();
    let h = start_with(Snap::new(&many), |s| s.with_push_throttle(1)).await;
    let mut first = h.client().await;
    first.send(request(ADDRESS, &[], &[]));
    let resp = first.recv().await;
    assert_eq!(resp.resources.len(), 100);

    // The first client has not answered: the second one's full push waits.
    let mut second = h.client().await;
    second.send(request(ADDRESS, &[], &[]));
    second.silent(Duration::from_millis(500)).await;

    // Small deltas are never throttled: the first client still gets a change.
    let v2 = Snap::new(&many).next(&[workload("w1", 1, "v2", 0)], &[]);
    h.publish(&v2);
    let delta = first.recv().await;
    assert_eq!(names(&delta), vec!["w1"]);

    // A client holding a permit is not blocked by its own second full push (Authorization).
    let auth: Vec<Arc<Resource>> = (0..70).map(|i| policy(&format!("p{i}"), "v1")).collect();
    h.publish(&v2.next(&auth, &[]));
    first.send(request(AUTHORIZATION, &[], &[]));
    loop {
        let r = first.recv().await;
        if r.type_url == AUTHORIZATION {
            assert_eq!(r.resources.len(), 70);
            break;
        }
    }

    // Once the first client ACKs its full push, the second one is served.
    first.send(mesh_xds::ack(&resp));
    let resp2 = second.recv().await;
    assert_eq!(resp2.resources.len(), 100);
}
