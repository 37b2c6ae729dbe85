//! The probes against real local servers: the app listens on 127.0.0.1 (standing in for the
//! pod's IP) and the agent probes it from 127.0.0.6, as in a pod.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Redirect;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

use super::config::{parse, Action, ProberError};
use super::{AppProbes, ProbeTarget};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What the app saw of the last probe: peer address and headers.
type Seen = Arc<Mutex<Option<(SocketAddr, HeaderMap)>>>;

async fn http_app() -> (u16, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new()
        .route(
            "/ready",
            get(
                move |ConnectInfo(peer): ConnectInfo<SocketAddr>, headers: HeaderMap| {
                    let record = record.clone();
                    async move {
                        *record.lock().expect("lock") = Some((peer, headers));
                        "fine"
                    }
                },
            ),
        )
        .route(
            "/broken",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "down") }),
        )
        .route("/moved", get(|| async { Redirect::temporary("/broken") }))
        .route(
            "/away",
            get(|| async { Redirect::temporary("http://elsewhere.example/") }),
        )
        .route("/loop", get(|| async { Redirect::temporary("/loop") }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route("/big", get(|| async { "x".repeat(50_000) }));
    let listener = tokio::net::TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    (port, seen)
}

fn probes(json: &str) -> AppProbes {
    AppProbes {
        probers: Arc::new(parse(json).expect("valid probers")),
        target: ProbeTarget::new(LOOPBACK, false),
        status_port: 15020,
    }
}

fn kubelet_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::USER_AGENT,
        HeaderValue::from_static("kube-probe/1.33"),
    );
    headers.insert(header::HOST, HeaderValue::from_static("10.1.0.5:15020"));
    headers.insert("x-custom", HeaderValue::from_static("kept"));
    headers
}

#[test]
fn probers_parse_as_istio_writes_them_and_bad_ones_are_named() {
    let json = r#"{
        "/app-health/app/readyz": {"httpGet": {"path": "ready", "port": 8080, "scheme": "HTTPS"}, "timeoutSeconds": 3, "periodSeconds": 10},
        "/app-health/app/livez": {"tcpSocket": {"port": 8081}},
        "/app-health/app/startupz": {"gRPC": {"port": 9090, "service": null}}
    }"#;
    let probers = parse(json).expect("valid");
    assert_eq!(
        probers["/app-health/app/readyz"].action,
        Action::Http {
            path: "/ready".into(),
            port: 8080,
            https: true
        }
    );
    assert_eq!(
        probers["/app-health/app/readyz"].timeout,
        Some(Duration::from_secs(3))
    );
    assert_eq!(
        probers["/app-health/app/livez"].action,
        Action::Tcp { port: 8081 }
    );
    assert_eq!(
        probers["/app-health/app/startupz"].action,
        Action::Grpc {
            port: 9090,
            service: String::new()
        }
    );
    assert!(parse("").expect("empty").is_empty());
    let bad: BTreeMap<&str, ProberError> = BTreeMap::from([
        ("{", ProberError::Json(String::new())),
        (
            r#"{"/healthz": {"tcpSocket": {"port": 1}}}"#,
            ProberError::Path("/healthz".into()),
        ),
        (
            r#"{"/app-health/a/readyz": {"exec": {}}}"#,
            ProberError::Kind("/app-health/a/readyz".into()),
        ),
        (
            r#"{"/app-health/a/readyz": {"httpGet": {"port": "http"}}}"#,
            ProberError::Port("/app-health/a/readyz".into()),
        ),
    ]);
    for (json, want) in bad {
        let got = parse(json).expect_err(json);
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&want),
            "{json}: {got}"
        );
        assert!(got.to_string().contains("ISTIO_KUBE_APP_PROBERS"), "{got}");
    }
}

#[test]
fn what_the_injector_writes_is_what_the_agent_reads() {
    let mut containers = vec![serde_json::json!({
        "name": "web",
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": 8080}},
        "startupProbe": {"grpc": {"port": 9090, "service": "web"}},
    })];
    let written = mesh_inject::probes::rewrite(&mut containers, 15020, &Default::default());
    let probers = parse(&serde_json::Value::Object(written).to_string()).expect("readable");
    assert_eq!(
        probers["/app-health/web/readyz"].action,
        Action::Http {
            path: "/ready".into(),
            port: 8080,
            https: false
        }
    );
    assert_eq!(
        probers["/app-health/web/livez"].action,
        Action::Tcp { port: 8080 }
    );
    assert_eq!(
        probers["/app-health/web/startupz"].action,
        Action::Grpc {
            port: 9090,
            service: "web".into()
        }
    );
}

#[tokio::test]
async fn http_probes_reach_the_app_from_the_passthrough_address() {
    let (port, seen) = http_app().await;
    let p = probes(&format!(
        r#"{{"/app-health/app/readyz": {{"httpGet": {{"path": "/ready", "port": {port}}}}}}}"#
    ));
    let answer = p.probe("/app-health/app/readyz", &kubelet_headers()).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, b"fine");
    let (peer, headers) = seen.lock().expect("lock").clone().expect("probed");
    assert_eq!(peer.ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
    assert_eq!(headers[header::USER_AGENT], "kube-probe/1.33");
    assert_eq!(headers["x-custom"], "kept");
    assert_eq!(headers[header::HOST], format!("10.1.0.5:{port}").as_str());
    assert_eq!(headers[header::CONNECTION], "close");
}

#[tokio::test]
async fn http_answers_map_as_the_kubelet_expects() {
    let (port, _) = http_app().await;
    // One container per page: `/app-health/c-<page>/readyz` GETs `/<page>`.
    let prober = |page: &str, extra: &str| {
        format!(
            r#""/app-health/c-{page}/readyz": {{"httpGet": {{"path": "/{page}", "port": {port}}}{extra}}}"#
        )
    };
    let entries: Vec<String> = ["broken", "moved", "away", "loop", "big"]
        .iter()
        .map(|page| prober(page, ""))
        .chain([prober("slow", r#", "timeoutSeconds": 1"#)])
        .collect();
    let json = format!("{{{}}}", entries.join(", "));
    let p = probes(&json);
    let status = |name: &str| {
        let p = p.clone();
        let name = format!("/app-health/c-{name}/readyz");
        async move { p.probe(&name, &kubelet_headers()).await }
    };
    let broken = status("broken").await;
    assert_eq!(
        (broken.status, broken.body.as_slice()),
        (StatusCode::SERVICE_UNAVAILABLE, &b"down"[..])
    );
    // A same-host redirect is followed (to the broken page); another host's is success.
    assert_eq!(
        status("moved").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(status("away").await.status, StatusCode::OK);
    assert_eq!(
        status("loop").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let started = std::time::Instant::now();
    assert_eq!(
        status("slow").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the timeout applies"
    );
    assert_eq!(status("big").await.body.len(), super::MAX_BODY);
    let unknown = p
        .probe("/app-health/nobody/readyz", &HeaderMap::new())
        .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn tcp_probes_pass_when_the_port_accepts() {
    let listener = tokio::net::TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind");
    let open = listener.local_addr().expect("addr").port();
    let closed = {
        let l = std::net::TcpListener::bind((LOOPBACK, 0)).expect("bind");
        l.local_addr().expect("addr").port()
    };
    let p = probes(&format!(
        r#"{{"/app-health/a/livez": {{"tcpSocket": {{"port": {open}}}}}, "/app-health/b/livez": {{"tcpSocket": {{"port": {closed}}}}}}}"#
    ));
    let accepted = tokio::spawn(async move { listener.accept().await.map(|(_, peer)| peer) });
    assert_eq!(
        p.probe("/app-health/a/livez", &HeaderMap::new())
            .await
            .status,
        StatusCode::OK
    );
    let peer = accepted.await.expect("task").expect("accepted");
    assert_eq!(peer.ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
    assert_eq!(
        p.probe("/app-health/b/livez", &HeaderMap::new())
            .await
            .status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[derive(Clone, PartialEq, Message)]
struct HealthRequest {
    #[prost(string, tag = "1")]
    service: String,
}

#[derive(Clone, PartialEq, Message)]
struct HealthResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// A gRPC health server: `ready` is SERVING (1), anything else NOT_SERVING (2).
async fn grpc_app() -> u16 {
    let listener = tokio::net::TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(
                |request: hyper::Request<hyper::body::Incoming>| async move {
                    let path_ok = request.uri().path() == "/grpc.health.v1.Health/Check";
                    let body = request.into_body().collect().await?.to_bytes();
                    let asked = HealthRequest::decode(body.get(5..).unwrap_or_default())
                        .map(|r| r.service)
                        .unwrap_or_default();
                    let status = if path_ok && asked == "ready" { 1 } else { 2 };
                    let message = HealthResponse { status }.encode_to_vec();
                    let mut framed = vec![0];
                    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
                    framed.extend_from_slice(&message);
                    let trailers = {
                        let mut t = HeaderMap::new();
                        t.insert("grpc-status", HeaderValue::from_static("0"));
                        t
                    };
                    let body = Full::new(Bytes::from(framed)).with_trailers(async move {
                        Some(Ok::<_, std::convert::Infallible>(trailers))
                    });
                    Ok::<_, hyper::Error>(
                        hyper::Response::builder()
                            .header(header::CONTENT_TYPE, "application/grpc")
                            .body(body)
                            .expect("response"),
                    )
                },
            );
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn grpc_probes_pass_only_when_serving() {
    let port = grpc_app().await;
    let p = probes(&format!(
        r#"{{"/app-health/a/readyz": {{"grpc": {{"port": {port}, "service": "ready"}}, "timeoutSeconds": 2}},
            "/app-health/b/readyz": {{"grpc": {{"port": {port}, "service": "other"}}, "timeoutSeconds": 2}}}}"#
    ));
    assert_eq!(
        p.probe("/app-health/a/readyz", &HeaderMap::new())
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        p.probe("/app-health/b/readyz", &HeaderMap::new())
            .await
            .status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn the_destination_is_the_pod_ip_unless_localhost_is_asked_for() {
    let pod = ProbeTarget::new("10.1.0.5".parse().expect("ip"), false);
    assert_eq!(pod.addr(8080), "10.1.0.5:8080".parse().expect("addr"));
    let legacy = ProbeTarget::new("10.1.0.5".parse().expect("ip"), true);
    assert_eq!(legacy.host(), "localhost");
    let v6 = ProbeTarget::new("fd00::5".parse().expect("ip"), false);
    assert_eq!(v6.source, "::6".parse::<IpAddr>().expect("ip"));
    assert_eq!(v6.host(), "[fd00::5]");
}
