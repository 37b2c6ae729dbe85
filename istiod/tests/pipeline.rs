//! istiod end to end in one process: a watched YAML directory -> debounce -> model -> delta xDS
//! over real sockets (plaintext 15010 and TLS 15012 with tokens), and the CA's node check against
//! the live snapshot.

use std::collections::BTreeMap;

use std::time::Duration;

mod common;

use istiod::server::Running;
use mesh_identity::{generate_csr, Identity};
use mesh_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use mesh_proto::ca::IstioCertificateRequest;
use mesh_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};
use mesh_testutil::{namespace_yaml, pod_yaml, service_yaml, ClusterDir, PodSpec};
use mesh_xds::DeltaClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const TOKENS: &str = "tokens:\n- token: node1-token\n  identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel\n  node: node1\n";
const WAIT: Duration = Duration::from_secs(10);

fn pod(ns: &str, name: &str, ip: &str, node: &str, app: &str, version: &str) -> String {
    pod_yaml(&PodSpec {
        namespace: ns,
        name,
        ip,
        node,
        service_account: app,
        labels: &[("app", app), ("version", version)],
    })
}

fn write_cluster(dir: &ClusterDir) {
    dir.write(
        "namespaces.yaml",
        &namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
    );
    dir.write(
        "demo/server.yaml",
        &service_yaml("demo", "server", "10.96.0.10", "server"),
    );
    dir.write(
        "demo/server-1.yaml",
        &pod("demo", "server-1", "10.244.1.10", "node1", "server", "v1"),
    );
    dir.write(
        "demo/server-2.yaml",
        &pod("demo", "server-2", "10.244.2.10", "node2", "server", "v1"),
    );
    dir.write(
        "demo/client.yaml",
        &pod("demo", "client", "10.244.1.11", "node1", "client", "v1"),
    );
}

struct Harness {
    cluster: ClusterDir,
    state: tempfile::TempDir,
    tokens: tempfile::NamedTempFile,
}

impl Harness {
    fn new() -> Harness {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cluster = ClusterDir::new();
        write_cluster(&cluster);
        let tokens = tempfile::NamedTempFile::new().expect("tokens file");
        std::fs::write(tokens.path(), TOKENS).expect("write tokens");
        Harness {
            cluster,
            state: tempfile::tempdir().expect("state dir"),
            tokens,
        }
    }

    async fn start(&self) -> Running {
        let flags = [
            format!("--config-dir={}", self.cluster.path().display()),
            format!("--tokens-file={}", self.tokens.path().display()),
        ];
        common::start_istiod(&flags, self.state.path()).await
    }
}

fn uid(ns: &str, name: &str) -> String {
    format!("Kubernetes//Pod/{ns}/{name}")
}

/// A ztunnel-like WDS client over a tonic channel.
struct Wds {
    client: DeltaClient,
    tx: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    stream: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl Wds {
    async fn connect(
        channel: Channel,
        token: Option<&str>,
        client: DeltaClient,
    ) -> Result<Wds, tonic::Status> {
        let token = token.map(|t| format!("Bearer {t}"));
        let mut ads = AggregatedDiscoveryServiceClient::with_interceptor(
            channel,
            move |mut req: tonic::Request<()>| {
                if let Some(t) = &token {
                    req.metadata_mut()
                        .insert("authorization", t.parse().expect("ascii"));
                }
                Ok(req)
            },
        )
        .max_decoding_message_size(64 << 20);
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = ads
            .delta_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Wds { client, tx, stream })
    }

    fn node() -> Node {
        Node {
            id: "ztunnel~10.0.0.1~ztunnel-abc.istio-system~istio-system.svc.cluster.local".into(),
            ..Default::default()
        }
    }

    async fn fresh(channel: Channel, token: Option<&str>) -> Result<Wds, tonic::Status> {
        let mut wds = Wds::connect(channel, token, DeltaClient::new(Some(Wds::node()))).await?;
        for t in [ADDRESS, AUTHORIZATION] {
            let req = wds.client.subscribe_wildcard(t);
            wds.tx.send(req).expect("send");
        }
        Ok(wds)
    }

    /// Receives one response, applies and ACKs it.
    async fn next(&mut self) -> Result<DeltaDiscoveryResponse, tonic::Status> {
        let resp = tokio::time::timeout(WAIT, self.stream.next())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no response within 10 s"))?
            .ok_or_else(|| tonic::Status::aborted("stream ended"))??;
        let (ack, applied) = self.client.handle_response(&resp);
        applied.expect("istiod's response is valid");
        self.tx.send(ack).expect("send ack");
        Ok(resp)
    }

    /// Receives until `pred` holds for the local state.
    async fn until(
        &mut self,
        what: &str,
        pred: impl Fn(&DeltaClient) -> bool,
    ) -> Vec<DeltaDiscoveryResponse> {
        let mut seen = Vec::new();
        while !pred(&self.client) {
            let resp = self
                .next()
                .await
                .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
            seen.push(resp);
        }
        seen
    }

    fn names(&self, type_url: &str) -> Vec<String> {
        self.client
            .resources(type_url)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn versions(&self, type_url: &str) -> BTreeMap<String, String> {
        self.client
            .resources(type_url)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.version.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

async fn plaintext(running: &Running) -> Channel {
    Endpoint::from_shared(format!("http://{}", running.grpc_addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect plaintext")
}

async fn tls(running: &Running) -> Channel {
    Endpoint::from_shared(format!(
        "https://localhost:{}",
        running.secure_grpc_addr.port()
    ))
    .expect("endpoint")
    .tls_config(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&running.root_cert_pem))
            .domain_name("istiod.istio-system.svc"),
    )
    .expect("tls config")
    .connect()
    .await
    .expect("connect TLS")
}

fn has(c: &DeltaClient, name: &str) -> bool {
    c.resources(ADDRESS).is_some_and(|m| m.contains_key(name))
}

#[tokio::test]
async fn pod_file_edits_reach_a_subscribed_client_as_deltas() {
    let h = Harness::new();
    let running = h.start().await;
    let mut wds = Wds::fresh(plaintext(&running).await, None)
        .await
        .expect("stream");
    wds.until("initial state", |c| {
        has(c, &uid("demo", "client"))
            && has(c, &uid("demo", "server-2"))
            && has(c, "demo/server.demo.svc.cluster.local")
    })
    .await;
    let before = wds.versions(ADDRESS);

    // Relabel one pod: exactly that workload comes back, with a new version.
    h.cluster.write(
        "demo/server-1.yaml",
        &pod("demo", "server-1", "10.244.1.10", "node1", "server", "v2"),
    );
    let target = uid("demo", "server-1");
    let old = before[&target].clone();
    let seen = wds
        .until("server-1 update", |c| {
            c.resources(ADDRESS)
                .and_then(|m| m.get(&target))
                .is_some_and(|r| r.version != old)
        })
        .await;
    let updated: Vec<&str> = seen
        .iter()
        .flat_map(|r| r.resources.iter().map(|x| x.name.as_str()))
        .collect();
    assert_eq!(
        updated,
        vec![target.as_str()],
        "only the edited workload is pushed"
    );

    // A malformed file and an invalid object are reported, and nothing valid is dropped.
    h.cluster.write(
        "demo/broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n",
    );
    h.cluster.write("demo/bad-port.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: demo}\nspec: {ports: [{port: eighty}]}\n");
    h.cluster.remove("demo/client.yaml");
    let seen = wds
        .until("client removal", |c| !has(c, &uid("demo", "client")))
        .await;
    let removed: Vec<&str> = seen
        .iter()
        .flat_map(|r| r.removed_resources.iter().map(String::as_str))
        .collect();
    assert_eq!(removed, vec![uid("demo", "client").as_str()]);
    assert!(
        has(&wds.client, &uid("demo", "server-1")) && has(&wds.client, &uid("demo", "server-2"))
    );

    let configz = common::http_get(running.http_addr, "/debug/configz").await;
    assert!(
        configz.contains("broken.yaml") && configz.contains("spec.ports[0].port"),
        "{configz}"
    );
    let syncz = common::http_get(running.http_addr, "/debug/syncz").await;
    assert!(syncz.contains("ztunnel~10.0.0.1~ztunnel-abc"), "{syncz}");
    let metrics = common::http_get(running.monitoring_addr, "/metrics").await;
    for name in [
        "pilot_xds{",
        "pilot_xds_pushes_total{",
        "pilot_proxy_convergence_time",
        "pilot_debounce_time",
        "istiod_config_errors_total{",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from metrics:\n{metrics}"
        );
    }
    running.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn tls_xds_requires_a_known_token() {
    let h = Harness::new();
    let running = h.start().await;
    let refused = match Wds::fresh(tls(&running).await, None).await {
        Ok(mut w) => w.next().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let status = refused.expect_err("no token is refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("authorization"), "{status:?}");

    let bad = match Wds::fresh(tls(&running).await, Some("guess")).await {
        Ok(mut w) => w.next().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert_eq!(
        bad.expect_err("unknown token").code(),
        tonic::Code::Unauthenticated
    );

    // A client that never finishes its handshake and one that sends garbage hold up no one.
    let _stalled = tokio::net::TcpStream::connect(running.secure_grpc_addr)
        .await
        .expect("connect");
    let mut garbage = tokio::net::TcpStream::connect(running.secure_grpc_addr)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut garbage, b"GET / HTTP/1.1\r\n\r\n\x00\xff")
        .await
        .expect("write garbage");

    let mut wds = Wds::fresh(tls(&running).await, Some("node1-token"))
        .await
        .expect("stream");
    wds.until("initial state over TLS", |c| has(c, &uid("demo", "client")))
        .await;
    running.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn after_an_istiod_restart_a_reconnecting_client_gets_only_what_changed() {
    let h = Harness::new();
    let running = h.start().await;
    let mut wds = Wds::fresh(plaintext(&running).await, None)
        .await
        .expect("stream");
    wds.until("initial state", |c| {
        has(c, &uid("demo", "server-2")) && has(c, &uid("demo", "client"))
    })
    .await;
    let known = wds.names(ADDRESS);
    running.shutdown().await.expect("clean shutdown");

    // While istiod is down: one pod changes, one goes away.
    h.cluster.write(
        "demo/server-2.yaml",
        &pod("demo", "server-2", "10.244.2.10", "node2", "server", "v9"),
    );
    h.cluster.remove("demo/client.yaml");
    let running = h.start().await;

    let mut again = Wds::connect(plaintext(&running).await, None, wds.client)
        .await
        .expect("stream");
    for req in again.client.reconnect_requests() {
        assert!(!req.initial_resource_versions.is_empty() || req.type_url == AUTHORIZATION);
        again.tx.send(req).expect("send");
    }
    let mut updated = Vec::new();
    let mut removed = Vec::new();
    while !(updated.contains(&uid("demo", "server-2")) && removed.contains(&uid("demo", "client")))
    {
        let resp = again.next().await.expect("response after reconnect");
        if resp.type_url == ADDRESS {
            updated.extend(resp.resources.iter().map(|r| r.name.clone()));
            removed.extend(resp.removed_resources.iter().cloned());
        }
    }
    assert_eq!(
        updated,
        vec![uid("demo", "server-2")],
        "unchanged resources are not resent"
    );
    assert_eq!(removed, vec![uid("demo", "client")]);
    assert_eq!(again.names(ADDRESS).len(), known.len() - 1);
    running.shutdown().await.expect("clean shutdown");
}

/// Waits (bounded) until the published snapshot satisfies `pred`.
async fn wait_snapshot(
    snaps: &mut tokio::sync::watch::Receiver<std::sync::Arc<istiod::model::Snapshot>>,
    pred: impl Fn(&istiod::model::Snapshot) -> bool,
) {
    tokio::time::timeout(WAIT, snaps.wait_for(|s| pred(s)))
        .await
        .expect("snapshot in time")
        .expect("snapshots");
}

async fn ca_client(running: &Running) -> IstioCertificateServiceClient<Channel> {
    IstioCertificateServiceClient::new(tls(running).await)
}

fn csr_request(identity: &str, impersonate: bool) -> tonic::Request<IstioCertificateRequest> {
    let id: Identity = identity.parse().expect("identity");
    let csr = generate_csr(&id).expect("csr");
    let metadata = impersonate.then(|| prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    });
    let mut req = tonic::Request::new(IstioCertificateRequest {
        csr: csr.csr_pem,
        validity_duration: 3600,
        metadata,
    });
    req.metadata_mut().insert(
        "authorization",
        "Bearer node1-token".parse().expect("ascii"),
    );
    req
}

#[tokio::test]
async fn ca_issues_only_for_pods_scheduled_on_the_callers_node() {
    let h = Harness::new();
    let running = h.start().await;
    let mut snaps = running.snapshots.clone();
    wait_snapshot(&mut snaps, |s| {
        s.identity_on_node("node1", "demo", "client")
    })
    .await;
    let mut ca = ca_client(&running).await;

    let ok = ca
        .create_certificate(csr_request(
            "spiffe://cluster.local/ns/demo/sa/client",
            true,
        ))
        .await
        .expect("client runs on node1");
    let chain = ok.into_inner().cert_chain;
    assert!(chain.len() >= 2, "leaf and root: {chain:?}");
    assert_eq!(
        chain.last().map(String::as_str).map(str::trim),
        Some(running.root_cert_pem.trim())
    );

    // server-2 runs on node2, but server-1 has the same service account on node1: use an
    // identity that is nowhere on node1.
    h.cluster.write(
        "demo/only-node2.yaml",
        &pod("demo", "lonely", "10.244.2.30", "node2", "lonely", "v1"),
    );
    wait_snapshot(&mut snaps, |s| {
        s.identity_on_node("node2", "demo", "lonely")
    })
    .await;
    let refused = ca
        .create_certificate(csr_request(
            "spiffe://cluster.local/ns/demo/sa/lonely",
            true,
        ))
        .await
        .expect_err("lonely is not on node1");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("node1"), "{refused:?}");

    // Once the pod moves to node1, the same request succeeds.
    h.cluster.write(
        "demo/only-node2.yaml",
        &pod("demo", "lonely", "10.244.1.30", "node1", "lonely", "v1"),
    );
    wait_snapshot(&mut snaps, |s| {
        s.identity_on_node("node1", "demo", "lonely")
    })
    .await;
    ca.create_certificate(csr_request(
        "spiffe://cluster.local/ns/demo/sa/lonely",
        true,
    ))
    .await
    .expect("lonely now on node1");
    let metrics = common::http_get(running.monitoring_addr, "/metrics").await;
    assert!(
        metrics.contains("citadel_server_success_cert_issuance_count_total 2"),
        "{metrics}"
    );
    running.shutdown().await.expect("clean shutdown");
}
