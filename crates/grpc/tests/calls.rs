//! mesh-grpc's calls against real tonic servers: the generated CA and ADS services, over h2c
//! and TLS.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use mesh_grpc::{Channel, Code, Endpoint, SetupError};
use mesh_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use mesh_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use mesh_proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use mesh_proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use mesh_testutil::SilentRelay;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

const CREATE: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";

/// A CA whose behaviour the request's `csr` field names: `echo` answers with the request's
/// `authorization` and `grpc-timeout` headers, `deny` refuses, `slow` answers after 2 s,
/// `big:N` answers with N bytes.
#[derive(Clone, Default)]
struct Scripted;

#[tonic::async_trait]
impl IstioCertificateService for Scripted {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let header = |name: &str| {
            request
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        let chain = match request.get_ref().csr.as_str() {
            "echo" => vec![header("authorization"), header("grpc-timeout")],
            "deny" => {
                return Err(Status::permission_denied(
                    "no \u{2713} for you: 100% denied",
                ))
            }
            "slow" => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                vec!["late".to_string()]
            }
            other => match other.strip_prefix("big:").and_then(|n| n.parse().ok()) {
                Some(n) => vec!["x".repeat(n)],
                None => return Err(Status::invalid_argument(format!("unknown script {other}"))),
            },
        };
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: chain,
        }))
    }
}

type DeltaStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;
type SotwStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

/// An ADS server that answers every delta request with one response (nonce = the request's
/// type URL, `resources` = as many as the request's `response_nonce` says), ends the stream
/// with OK on type `end` and with ABORTED on type `abort`. As istiod, it answers the response
/// headers only once the first request has come.
#[derive(Clone, Default)]
struct Echo;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Echo {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(Status::unimplemented("delta only"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        if request.metadata().get("authorization").is_none() {
            return Err(Status::unauthenticated("no token"));
        }
        let mut inbound = request.into_inner();
        let Some(Ok(first)) = inbound.next().await else {
            return Err(Status::invalid_argument("no first request"));
        };
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut next = Some(first);
            while let Some(req) = next.take() {
                let reply = match req.type_url.as_str() {
                    "end" => return,
                    "abort" => Err(Status::aborted("asked to abort")),
                    _ => Ok(DeltaDiscoveryResponse {
                        nonce: req.type_url.clone(),
                        resources: (0..req.response_nonce.parse::<usize>().unwrap_or(0))
                            .map(|i| Resource {
                                name: format!("resource-{i:08}"),
                                ..Resource::default()
                            })
                            .collect(),
                        ..DeltaDiscoveryResponse::default()
                    }),
                };
                let last = reply.is_err();
                if tx.send(reply).await.is_err() || last {
                    return;
                }
                next = inbound.next().await.and_then(Result::ok);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A running tonic server; stops when dropped.
struct Server {
    addr: SocketAddr,
    /// TCP connections accepted so far.
    accepted: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

impl Server {
    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn serve(port: u16, tls: Option<tonic::transport::ServerTlsConfig>) -> Server {
    // A port given again is free once the previous server has let its listener go.
    let mut attempts = 0;
    let listener = loop {
        match tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            Ok(listener) => break listener,
            Err(e) if attempts < 100 => {
                attempts += 1;
                tracing::debug!(error = %e, "port {port} still taken");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("bind 127.0.0.1:{port}: {e}"),
        }
    };
    let addr = listener.local_addr().expect("addr");
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).expect("tls");
    }
    let router = builder
        .add_service(IstioCertificateServiceServer::new(Scripted))
        .add_service(AggregatedDiscoveryServiceServer::new(Echo));
    let (stop, stopped) = oneshot::channel::<()>();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let incoming = TcpListenerStream::new(listener).map(move |tcp| {
        counter.fetch_add(1, Ordering::SeqCst);
        tcp
    });
    tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        let _ = router.serve_with_incoming_shutdown(incoming, stopped).await;
    });
    Server {
        addr,
        accepted,
        _stop: stop,
    }
}

/// Plain-text HTTP/2 to `addr`.
fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::new(&format!("http://{addr}"), Path::new("/nonexistent"), None).expect("endpoint")
}

fn plain(addr: SocketAddr) -> Channel {
    endpoint(addr).channel()
}

fn script(csr: &str) -> IstioCertificateRequest {
    IstioCertificateRequest {
        csr: csr.to_string(),
        ..IstioCertificateRequest::default()
    }
}

async fn create(
    channel: &Channel,
    csr: &str,
    timeout: Option<Duration>,
) -> Result<Vec<String>, mesh_grpc::Status> {
    let mut metadata = HeaderMap::new();
    metadata.insert("authorization", HeaderValue::from_static("Bearer t0ken"));
    let response: IstioCertificateResponse = channel
        .unary(CREATE, &metadata, &script(csr), timeout)
        .await?;
    Ok(response.cert_chain)
}

#[tokio::test]
async fn unary_calls_carry_metadata_and_statuses() {
    let server = serve(0, None).await;
    let channel = plain(server.addr);
    let echoed = create(&channel, "echo", Some(Duration::from_secs(30)))
        .await
        .expect("echo");
    assert_eq!(echoed, ["Bearer t0ken", "30000m"]);

    let denied = create(&channel, "deny", None).await.expect_err("denied");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(denied.message(), "no \u{2713} for you: 100% denied");

    let late = create(&channel, "slow", Some(Duration::from_millis(200)))
        .await
        .expect_err("deadline");
    assert_eq!(late.code(), Code::DeadlineExceeded);

    let unknown = channel
        .unary::<_, IstioCertificateResponse>(
            "/istio.v1.auth.IstioCertificateService/Nope",
            &HeaderMap::new(),
            &script("echo"),
            None,
        )
        .await
        .expect_err("no such method");
    assert_eq!(unknown.code(), Code::Unimplemented);

    // After all that, the same connection still serves calls.
    assert_eq!(
        create(&channel, "big:10", None)
            .await
            .expect("after errors"),
        ["xxxxxxxxxx"]
    );
    assert_eq!(server.connections(), 1, "one connection for every call");
}

#[tokio::test]
async fn messages_over_the_limit_are_refused_and_large_ones_under_it_arrive() {
    let server = serve(0, None).await;
    let small = endpoint(server.addr).max_message(1 << 20).channel();
    let refused = create(&small, "big:2000000", None)
        .await
        .expect_err("over the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    // 12 MB: several times the HTTP/2 windows, across many DATA frames.
    let large = endpoint(server.addr).max_message(16 << 20).channel();
    let chain = create(&large, "big:12000000", None).await.expect("large");
    assert_eq!(chain[0].len(), 12_000_000);
}

#[tokio::test]
async fn a_channel_dials_again_after_the_server_came_back() {
    let server = serve(0, None).await;
    let addr = server.addr;
    let channel = plain(addr);
    create(&channel, "big:1", None).await.expect("first");
    drop(server);
    // The old connection ends with the server; until the server is back, calls fail fast.
    let mut down = None;
    for _ in 0..50 {
        match create(&channel, "big:1", None).await {
            Err(e) => {
                down = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(down.expect("server down").code(), Code::Unavailable);
    let server = serve(addr.port(), None).await;
    create(&channel, "big:1", None).await.expect("dialed again");
    create(&channel, "big:1", None).await.expect("and kept");
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn streaming_calls_send_first_requests_before_headers_and_read_the_end() {
    let server = serve(0, None).await;
    let channel = plain(server.addr);
    let request = |type_url: &str, count: usize| DeltaDiscoveryRequest {
        type_url: type_url.to_string(),
        response_nonce: count.to_string(),
        ..DeltaDiscoveryRequest::default()
    };
    let path = mesh_proto::DELTA_ADS_PATH;

    let refused = channel
        .streaming::<_, DeltaDiscoveryResponse>(path, &HeaderMap::new(), &[request("a", 0)])
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated);

    let mut metadata = HeaderMap::new();
    metadata.insert("authorization", HeaderValue::from_static("Bearer t"));
    // The server answers the headers only after the first request: awaiting them before
    // sending would never end.
    let first = [request("a", 1), request("b", 0)];
    let opening = channel.streaming::<_, DeltaDiscoveryResponse>(path, &metadata, &first);
    let (mut sink, mut responses) = tokio::time::timeout(Duration::from_secs(10), opening)
        .await
        .expect("the first requests went before the headers were awaited")
        .expect("open");
    let first = responses.message().await.expect("a").expect("some");
    assert_eq!((first.nonce.as_str(), first.resources.len()), ("a", 1));
    let second = responses.message().await.expect("b").expect("some");
    assert_eq!(second.nonce, "b");
    // A response of ~1.5 MB: many DATA frames, decoded from the chunks.
    sink.send(&request("c", 50_000)).expect("send");
    let big = responses.message().await.expect("c").expect("some");
    assert_eq!(big.resources.len(), 50_000);
    assert_eq!(big.resources[49_999].name, "resource-00049999");
    sink.send(&request("end", 0)).expect("send");
    assert!(responses.message().await.expect("ended with OK").is_none());

    let (mut sink, mut responses) = channel
        .streaming::<_, DeltaDiscoveryResponse>(path, &metadata, &[request("a", 0)])
        .await
        .expect("open again, on the same connection");
    responses.message().await.expect("a").expect("some");
    sink.send(&request("abort", 0)).expect("send");
    let aborted = responses.message().await.expect_err("aborted");
    assert_eq!(aborted.code(), Code::Aborted);
    assert_eq!(aborted.message(), "asked to abort");
    assert_eq!(server.connections(), 1, "both streams on one connection");
}

fn delta(type_url: &str, count: usize) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.to_string(),
        response_nonce: count.to_string(),
        ..DeltaDiscoveryRequest::default()
    }
}

fn bearer() -> HeaderMap {
    let mut metadata = HeaderMap::new();
    metadata.insert("authorization", HeaderValue::from_static("Bearer t"));
    metadata
}

#[tokio::test]
async fn a_stream_on_a_connection_that_fell_silent_fails_and_the_next_call_dials_again() {
    let server = serve(0, None).await;
    let relay = SilentRelay::to(server.addr).await.expect("relay");
    let channel = endpoint(relay.addr())
        .keepalive(Some(Duration::from_millis(200)), Duration::from_millis(300))
        .channel();
    let path = mesh_proto::DELTA_ADS_PATH;
    let (_sink, mut responses) = channel
        .streaming::<_, DeltaDiscoveryResponse>(path, &bearer(), &[delta("a", 1)])
        .await
        .expect("open");
    responses.message().await.expect("a").expect("some");

    relay.silence(true);
    // Nothing more comes on the stream, and TCP sees nothing wrong: only the unanswered PING
    // tells, after about 200 + 300 ms.
    let ended = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("the silent connection was noticed and closed")
        .expect_err("the stream failed");
    assert_eq!(ended.code(), Code::Unavailable, "{ended}");

    relay.silence(false);
    create(&channel, "big:1", None)
        .await
        .expect("a new connection");
    assert_eq!(relay.connections(), 2);
}

#[tokio::test]
async fn pings_do_not_end_a_quiet_stream_on_a_live_connection() {
    let server = serve(0, None).await;
    let channel = endpoint(server.addr)
        .keepalive(Some(Duration::from_millis(50)), Duration::from_secs(2))
        .channel();
    let path = mesh_proto::DELTA_ADS_PATH;
    let (mut sink, mut responses) = channel
        .streaming::<_, DeltaDiscoveryResponse>(path, &bearer(), &[delta("a", 1)])
        .await
        .expect("open");
    responses.message().await.expect("a").expect("some");
    // About 20 PINGs go out, each answered by the server's HTTP/2 stack. (That PINGs go out at
    // all is shown by the silent-connection test above.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    sink.send(&delta("b", 2)).expect("send");
    let later = responses.message().await.expect("b").expect("some");
    assert_eq!(later.resources.len(), 2);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn a_connection_without_open_calls_is_not_pinged() {
    // istiod's gRPC server sends GOAWAY to clients that ping a connection with no call open.
    let server = serve(0, None).await;
    let relay = SilentRelay::to(server.addr).await.expect("relay");
    let channel = endpoint(relay.addr())
        .keepalive(Some(Duration::from_millis(100)), Duration::from_millis(200))
        .channel();
    create(&channel, "big:1", None).await.expect("first");
    // A PING sent now would be swallowed and never answered, and the connection closed.
    relay.silence(true);
    tokio::time::sleep(Duration::from_millis(800)).await;
    relay.silence(false);
    create(&channel, "big:1", None)
        .await
        .expect("on the kept connection");
    assert_eq!(relay.connections(), 1, "the idle connection was kept");
}

#[tokio::test]
async fn tls_verifies_the_server_by_name_against_the_root_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = mesh_identity::CertificateAuthority::self_signed(
        dir.path(),
        mesh_identity::CaOptions::default(),
    )
    .expect("ca");
    let serving = ca
        .serving_cert(&["istiod.istio-system.svc"], &[Ipv4Addr::LOCALHOST.into()])
        .expect("serving cert");
    let identity =
        tonic::transport::Identity::from_pem(serving.chain_pem.join(""), serving.key_pem.clone());
    let server = serve(
        0,
        Some(tonic::transport::ServerTlsConfig::new().identity(identity)),
    )
    .await;
    let root = dir.path().join("root.pem");
    std::fs::write(&root, ca.root_cert_pem()).expect("root");
    let address = format!("https://{}", server.addr);

    let by_name = Endpoint::new(&address, &root, Some("istiod.istio-system.svc"))
        .expect("endpoint")
        .channel();
    assert_eq!(create(&by_name, "big:3", None).await.expect("tls"), ["xxx"]);
    let by_ip = Endpoint::new(&address, &root, None)
        .expect("endpoint")
        .channel();
    create(&by_ip, "big:3", None)
        .await
        .expect("the IP is in the certificate too");

    let wrong_name = Endpoint::new(&address, &root, Some("other.example"))
        .expect("endpoint")
        .channel();
    let refused = create(&wrong_name, "big:3", None)
        .await
        .expect_err("wrong name");
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(
        refused.message().contains("TLS handshake failed"),
        "{refused}"
    );

    let other = tempfile::tempdir().expect("tempdir");
    let stranger =
        mesh_identity::CertificateAuthority::self_signed(other.path(), Default::default())
            .expect("other ca");
    let other_root = other.path().join("root.pem");
    std::fs::write(&other_root, stranger.root_cert_pem()).expect("root");
    let untrusted = Endpoint::new(&address, &other_root, Some("istiod.istio-system.svc"))
        .expect("endpoint")
        .channel();
    assert_eq!(
        create(&untrusted, "big:3", None)
            .await
            .expect_err("unknown issuer")
            .code(),
        Code::Unavailable
    );
}

#[test]
fn bad_settings_are_refused_before_dialing() {
    let none = Path::new("/nonexistent/root.pem");
    for (address, reason) in [
        ("istiod:15012", "bad_address"),
        ("ftp://istiod:15012", "bad_address"),
        ("https://istiod:15012/path", "bad_address"),
        ("https://", "bad_address"),
        ("https://istiod:15012", "root_cert"),
    ] {
        let err = Endpoint::new(address, none, None).expect_err(address);
        assert_eq!(err.reason(), reason, "{address}: {err}");
        assert!(
            err.to_string().contains(match &err {
                SetupError::RootCert { .. } => "/nonexistent/root.pem",
                _ => address,
            }),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let garbage = dir.path().join("root.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let err = Endpoint::new("https://istiod:15012", &garbage, None).expect_err("garbage");
    assert_eq!(err.reason(), "root_cert", "{err}");
}

#[tokio::test]
async fn nothing_listening_is_unavailable() {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let err = create(&plain(addr), "echo", None)
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains(&addr.to_string()), "{err}");
}

/// A bare HTTP/2 server giving, by path, the answers a well-behaved gRPC server never gives.
/// Unary paths read the request to its end first; `/stream-*` paths answer at once.
async fn raw_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((request, respond))) = connection.accept().await {
                    tokio::spawn(answer(request, respond));
                }
            });
        }
    });
    addr
}

fn head(status: u16, content_type: &str, grpc_status: Option<&str>) -> http::Response<()> {
    let mut head = http::Response::builder()
        .status(status)
        .header("content-type", content_type);
    if let Some(code) = grpc_status {
        head = head.header("grpc-status", code);
    }
    head.body(()).expect("response head")
}

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
) {
    let path = request.uri().path().to_string();
    if !path.starts_with("/stream-") {
        let mut body = request.into_body();
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
    }
    let grpc = "application/grpc";
    let (head, body, trailers): (_, Option<&'static [u8]>, bool) = match path.as_str() {
        "/teapot" => (head(418, "text/plain", None), None, false),
        "/unauthorized" => (head(401, "text/plain", None), None, false),
        "/html" => (head(200, "text/html", Some("0")), None, false),
        "/grpc-web" => (head(200, "application/grpc-web", Some("0")), None, false),
        "/ok-no-message" | "/stream-ok-no-message" => (head(200, grpc, Some("0")), None, false),
        // The prefix says 10 bytes; 3 come.
        "/cut" => (
            head(200, grpc, None),
            Some(&[0, 0, 0, 0, 10, 1, 2, 3]),
            true,
        ),
        "/compressed" => (head(200, grpc, None), Some(&[1, 0, 0, 0, 1, 0]), true),
        // One empty message, then the stream ends with no trailers.
        "/no-status" => (head(200, grpc, None), Some(&[0, 0, 0, 0, 0]), false),
        _ => (head(404, "text/plain", None), None, false),
    };
    let Some(body) = body else {
        let _ = respond.send_response(head, true);
        return;
    };
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let _ = send.send_data(bytes::Bytes::from_static(body), !trailers);
    if trailers {
        let mut fields = HeaderMap::new();
        fields.insert("grpc-status", HeaderValue::from_static("0"));
        let _ = send.send_trailers(fields);
    }
}

#[tokio::test]
async fn answers_that_are_not_proper_grpc_end_calls_with_a_clear_status() {
    let channel = plain(raw_server().await);
    for (path, code, says) in [
        ("/teapot", Code::Unknown, "418"),
        ("/unauthorized", Code::Unauthenticated, "401"),
        ("/html", Code::Unknown, "text/html"),
        ("/grpc-web", Code::Unknown, "application/grpc-web"),
        (
            "/ok-no-message",
            Code::Internal,
            "without a response message",
        ),
        ("/cut", Code::Internal, "inside a message"),
        ("/compressed", Code::Internal, "compressed"),
        ("/no-status", Code::Internal, "without a grpc-status"),
    ] {
        let status = channel
            .unary::<_, IstioCertificateResponse>(path, &HeaderMap::new(), &script("x"), None)
            .await
            .expect_err(path);
        assert_eq!(status.code(), code, "{path}: {status}");
        assert!(status.message().contains(says), "{path}: {status}");
    }
    // A streaming call the server ends at once with OK has no messages, and is no error.
    let (_sink, mut responses) = channel
        .streaming::<IstioCertificateRequest, IstioCertificateResponse>(
            "/stream-ok-no-message",
            &HeaderMap::new(),
            &[],
        )
        .await
        .expect("open");
    assert_eq!(responses.message().await.expect("ended with OK"), None);
}
