//! Routing flows: outbound -> HBONE -> inbound, service endpoints, passthrough, SAN checks,
//! malformed requests, drain.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mesh_proto::workload::{self as pb, load_balancing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::fixture::*;
use crate::hbone::{self, ConnectRequest, Connection, H2Settings, Server};

#[tokio::test]
async fn outbound_hbone_inbound_echo_with_identities_and_metrics() {
    let TwoPods {
        mesh,
        a,
        pods,
        echo,
        ..
    } = two_pods(21, b"echo:").await;

    let payload = b"hello through hbone".repeat(100);
    let tcp = mesh.connect(a, pods[0].outbound, echo).await;
    let back = round_trip(tcp, &payload).await;
    assert_eq!(back, [b"echo:".as_slice(), &payload].concat());

    let client = "spiffe://cluster.local/ns/default/sa/client-sa";
    let server = "spiffe://cluster.local/ns/default/sa/server-sa";
    let inbound = mesh
        .metric_line(&[
            "istio_tcp_connections_closed_total{",
            "reporter=\"destination\"",
        ])
        .await;
    for part in [
        format!("source_principal=\"{client}\""),
        format!("destination_principal=\"{server}\""),
        "source_workload=\"client\"".to_string(),
        "destination_workload=\"server\"".to_string(),
        "source_workload_namespace=\"default\"".to_string(),
        "source_app=\"client\"".to_string(),
        "destination_version=\"v1\"".to_string(),
        "source_cluster=\"Kubernetes\"".to_string(),
        "destination_service=\"unknown\"".to_string(),
        "request_protocol=\"tcp\"".to_string(),
        "response_flags=\"-\"".to_string(),
        "connection_security_policy=\"mutual_tls\"".to_string(),
    ] {
        assert!(inbound.contains(&part), "{part} missing in {inbound}");
    }
    assert!(inbound.ends_with(" 1"), "{inbound}");
    let outbound = mesh
        .metric_line(&[
            "istio_tcp_received_bytes_total{",
            "reporter=\"source\"",
            &format!("destination_principal=\"{server}\""),
        ])
        .await;
    assert!(
        outbound.ends_with(&format!(" {}", payload.len())),
        "{outbound}"
    );
    let sent = mesh
        .metric_line(&["istio_tcp_sent_bytes_total{", "reporter=\"destination\""])
        .await;
    assert!(sent.ends_with(&format!(" {}", payload.len() + 5)), "{sent}");
    assert!(mesh.render().contains("istio_build{component=\"ztunnel\""));
}

/// A server that answers every connection with `tag` and closes.
async fn tag_server(addr: SocketAddr, tag: &'static [u8]) {
    let listener = TcpListener::bind(addr).await.expect("bind tag server");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let _ = tcp.write_all(tag).await;
        }
    });
}

fn service(vip: std::net::IpAddr, lb: Option<pb::LoadBalancing>) -> pb::Service {
    pb::Service {
        name: "echo".to_string(),
        namespace: "default".to_string(),
        hostname: "echo.default.svc.cluster.local".to_string(),
        addresses: vec![pb::NetworkAddress {
            network: String::new(),
            address: match vip {
                std::net::IpAddr::V4(v) => v.octets().to_vec(),
                std::net::IpAddr::V6(v) => v.octets().to_vec(),
            },
            length: None,
        }],
        ports: vec![pb::Port {
            service_port: 80,
            target_port: u32::from(APP_PORT),
            app_protocol: 0,
        }],
        load_balancing: lb,
        ..Default::default()
    }
}

fn endpoint(name: &str, ip: std::net::IpAddr, healthy: bool) -> pb::Workload {
    let mut w = workload(name, ip, "echo-sa", pb::TunnelProtocol::None);
    w.status = if healthy {
        pb::WorkloadStatus::Healthy
    } else {
        pb::WorkloadStatus::Unhealthy
    } as i32;
    w.services.insert(
        "default/echo.default.svc.cluster.local".to_string(),
        pb::PortList {
            ports: vec![pb::Port {
                service_port: 80,
                target_port: u32::from(APP_PORT),
                app_protocol: 0,
            }],
        },
    );
    w
}

#[tokio::test]
async fn service_vip_goes_to_healthy_endpoints_only() {
    let mesh = Mesh::new();
    let a = ip(22, 1);
    let (good, bad) = (ip(22, 2), ip(22, 3));
    let vip = ip(22, 100);
    mesh.add_workload(workload(
        "client",
        a,
        "client-sa",
        pb::TunnelProtocol::Hbone,
    ));
    mesh.add_workload(endpoint("good", good, true));
    mesh.add_workload(endpoint("bad", bad, false));
    mesh.add_service(service(vip, None));
    tag_server(SocketAddr::new(good, APP_PORT), b"good").await;
    tag_server(SocketAddr::new(bad, APP_PORT), b"bad").await;
    let pod = mesh.start_pod(a, "client", "client-sa");
    for _ in 0..12 {
        let tcp = mesh
            .connect(a, pod.outbound, SocketAddr::new(vip, 80))
            .await;
        assert_eq!(round_trip(tcp, b"").await, b"good");
    }
    mesh.metric_line(&[
        "istio_tcp_connections_opened_total{",
        "destination_service=\"echo.default.svc.cluster.local\"",
        "destination_service_name=\"echo\"",
        "destination_workload=\"good\"",
        "connection_security_policy=\"none\"",
        "} 12",
    ])
    .await;

    // With ALLOW_ALL both are eligible; the unhealthy one shows up eventually.
    mesh.add_service(service(
        vip,
        Some(pb::LoadBalancing {
            health_policy: load_balancing::HealthPolicy::AllowAll as i32,
            ..Default::default()
        }),
    ));
    let mut seen_bad = false;
    for _ in 0..40 {
        let tcp = mesh
            .connect(a, pod.outbound, SocketAddr::new(vip, 80))
            .await;
        seen_bad |= round_trip(tcp, b"").await == b"bad";
    }
    assert!(seen_bad, "ALLOW_ALL must also pick the unhealthy endpoint");
}

#[tokio::test]
async fn service_without_endpoints_closes_with_no_healthy_upstream() {
    let mesh = Mesh::new();
    let a = ip(23, 1);
    let vip = ip(23, 100);
    mesh.add_workload(workload(
        "client",
        a,
        "client-sa",
        pb::TunnelProtocol::Hbone,
    ));
    mesh.add_workload(endpoint("bad", ip(23, 3), false));
    mesh.add_service(service(vip, None));
    let pod = mesh.start_pod(a, "client", "client-sa");
    let tcp = mesh
        .connect(a, pod.outbound, SocketAddr::new(vip, 80))
        .await;
    assert_eq!(round_trip(tcp, b"x").await, b"");
    mesh.metric_line(&[
        "istio_tcp_connections_failed_total{",
        "destination_service=\"unknown\"",
        "response_flags=\"CONNECT\"",
    ])
    .await;
}

#[tokio::test]
async fn unknown_destination_is_passed_through() {
    let mesh = Mesh::new();
    let a = ip(24, 1);
    mesh.add_workload(workload(
        "client",
        a,
        "client-sa",
        pb::TunnelProtocol::Hbone,
    ));
    let pod = mesh.start_pod(a, "client", "client-sa");
    let outside = echo_server(SocketAddr::new(ip(24, 50), APP_PORT), b"outside:").await;
    let tcp = mesh.connect(a, pod.outbound, outside).await;
    assert_eq!(round_trip(tcp, b"hi").await, b"outside:hi");
    mesh.metric_line(&[
        "istio_tcp_connections_closed_total{",
        "reporter=\"source\"",
        "destination_workload=\"unknown\"",
        "destination_principal=\"unknown\"",
        "connection_security_policy=\"none\"",
    ])
    .await;
}

#[tokio::test]
async fn source_not_in_state_times_out_and_closes() {
    let mesh = Mesh::new();
    let a = ip(25, 1);
    let pod = mesh.start_pod(a, "client", "client-sa");
    let outside = echo_server(SocketAddr::new(ip(25, 50), APP_PORT), b"").await;
    let started = Instant::now();
    let tcp = mesh.connect(a, pod.outbound, outside).await;
    assert_eq!(round_trip(tcp, b"hi").await, b"");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "waited for xDS first"
    );
    // A workload of another pod at that IP is not this pod either.
    mesh.add_workload(workload(
        "someone-else",
        a,
        "client-sa",
        pb::TunnelProtocol::Hbone,
    ));
    let tcp = mesh.connect(a, pod.outbound, outside).await;
    assert_eq!(round_trip(tcp, b"hi").await, b"");
}

#[tokio::test]
async fn destination_with_wrong_identity_is_refused() {
    let mesh = Mesh::new();
    let (a, b) = (ip(26, 1), ip(26, 2));
    mesh.add_workload(workload(
        "client",
        a,
        "client-sa",
        pb::TunnelProtocol::Hbone,
    ));
    mesh.add_workload(workload(
        "server",
        b,
        "server-sa",
        pb::TunnelProtocol::Hbone,
    ));
    let pod = mesh.start_pod(a, "client", "client-sa");
    // An impostor on the destination's HBONE port with a valid mesh cert for another SA.
    let impostor = std::sync::Arc::new(Server::new(
        mesh.pki.server_tls(&id("impostor")),
        H2Settings::default(),
        |_req: hbone::InboundRequest| async {
            Err::<tokio::net::TcpStream, _>(hbone::Refusal::Denied {
                reason: "impostor never serves".to_string(),
            })
        },
    ));
    let listener = TcpListener::bind(SocketAddr::new(b, HBONE_PORT))
        .await
        .expect("bind impostor");
    tokio::spawn(impostor.run(listener, std::future::pending()));
    let tcp = mesh
        .connect(a, pod.outbound, SocketAddr::new(b, APP_PORT))
        .await;
    assert_eq!(round_trip(tcp, b"secret").await, b"");
    mesh.metric_line(&[
        "istio_tcp_connections_failed_total{",
        "reporter=\"source\"",
        "response_flags=\"CONNECT\"",
        "destination_principal=\"spiffe://cluster.local/ns/default/sa/server-sa\"",
    ])
    .await;
}

#[tokio::test]
async fn malformed_connect_is_400_and_other_tunnels_on_the_connection_work() {
    let mesh = Mesh::new();
    let b = ip(27, 2);
    mesh.add_workload(workload(
        "server",
        b,
        "server-sa",
        pb::TunnelProtocol::Hbone,
    ));
    let _pod = mesh.start_pod(b, "server", "server-sa");
    let echo = echo_server(SocketAddr::new(b, APP_PORT), b"").await;
    let tls = mesh
        .pki
        .client_tls(Some(&id("client-sa")), vec![id("server-sa")]);
    let conn = Connection::connect(SocketAddr::new(b, HBONE_PORT), tls, &H2Settings::default())
        .await
        .expect("HBONE connection to the pod");
    let bad = http::Request::builder()
        .method(http::Method::CONNECT)
        .version(http::Version::HTTP_2)
        .uri("echo.default.svc:8080")
        .body(())
        .expect("request");
    let err = conn.send(bad).await.expect_err("malformed authority");
    assert_eq!(err.status(), Some(http::StatusCode::BAD_REQUEST), "{err}");
    let source: SocketAddr = "127.27.0.9:5000".parse().expect("addr");
    let mut tunnel = conn
        .open(&ConnectRequest::new(echo, source))
        .await
        .expect("a good tunnel on the same connection");
    tunnel.write_all(b"still fine").await.expect("write");
    tunnel.shutdown().await.expect("half-close");
    let mut back = Vec::new();
    tunnel.read_to_end(&mut back).await.expect("read");
    assert_eq!(back, b"still fine");
}

#[tokio::test]
async fn hbone_to_an_ip_without_workload_fails_the_handshake() {
    let mesh = Mesh::new();
    let b = ip(28, 2);
    let _pod = mesh.start_pod(b, "server", "server-sa");
    let tls = mesh
        .pki
        .client_tls(Some(&id("client-sa")), vec![id("server-sa")]);
    let result =
        Connection::connect(SocketAddr::new(b, HBONE_PORT), tls, &H2Settings::default()).await;
    let err = result.expect_err("no certificate for an unknown local IP");
    assert!(matches!(err.reason(), "tls" | "dial"), "{err}");
}

#[tokio::test]
async fn drain_stops_accepting_finishes_open_connections_then_aborts_at_deadline() {
    let TwoPods {
        mesh,
        a,
        mut pods,
        echo,
        ..
    } = two_pods(29, b"").await;

    // One completed tunnel leaves a pooled HBONE connection into pod B.
    let tcp = mesh.connect(a, pods[0].outbound, echo).await;
    assert_eq!(round_trip(tcp, b"warm").await, b"warm");
    // An open connection during A's drain.
    let mut open = mesh.connect(a, pods[0].outbound, echo).await;
    open.write_all(b"before ").await.expect("write");

    let drained = tokio::spawn(pods[0].take().drain(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = tokio::net::TcpStream::connect(pods[0].outbound).await;
    assert!(refused.is_err(), "the outbound listener is closed on drain");
    assert!(!drained.is_finished(), "waits for the open connection");
    assert_eq!(round_trip(open, b"after").await, b"before after");
    tokio::time::timeout(Duration::from_secs(3), drained)
        .await
        .expect("drain ends once the connection is done")
        .expect("drain task");

    // Pod B drains promptly although A's pool still holds an idle HBONE connection to it.
    let started = Instant::now();
    pods[1].take().drain(Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "GOAWAY ends idle HBONE connections"
    );

    // A connection still open at the deadline is closed.
    let c = ip(29, 3);
    mesh.add_workload(workload("third", c, "third-sa", pb::TunnelProtocol::None));
    let mut pod_c = mesh.start_pod(c, "third", "third-sa");
    let outside = echo_server(SocketAddr::new(ip(29, 50), APP_PORT), b"").await;
    let mut stuck = mesh.connect(c, pod_c.outbound, outside).await;
    stuck.write_all(b"never finished").await.expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    pod_c.take().drain(Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, stuck.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the aborted connection is closed at the deadline"
    );
    assert!(rest.is_empty());
}

#[tokio::test]
async fn hbone_target_outside_the_pod_is_400_not_401() {
    let mesh = Mesh::new();
    let (b, c) = (ip(30, 2), ip(30, 3));
    mesh.add_workload(workload(
        "server",
        b,
        "server-sa",
        pb::TunnelProtocol::Hbone,
    ));
    mesh.add_workload(workload("other", c, "other-sa", pb::TunnelProtocol::Hbone));
    let _pod = mesh.start_pod(b, "server", "server-sa");
    let echo = echo_server(SocketAddr::new(b, APP_PORT), b"").await;
    let tls = mesh
        .pki
        .client_tls(Some(&id("client-sa")), vec![id("server-sa")]);
    let conn = Connection::connect(SocketAddr::new(b, HBONE_PORT), tls, &H2Settings::default())
        .await
        .expect("HBONE connection to the pod");
    let source: SocketAddr = "127.30.0.9:5000".parse().expect("addr");
    for target in [
        SocketAddr::new(c, APP_PORT),
        SocketAddr::new(ip(30, 99), APP_PORT),
    ] {
        let err = conn
            .open(&ConnectRequest::new(target, source))
            .await
            .expect_err("not this pod's workload");
        assert_eq!(
            err.status(),
            Some(http::StatusCode::BAD_REQUEST),
            "{target}: {err}"
        );
    }
    let tunnel = conn
        .open(&ConnectRequest::new(echo, source))
        .await
        .expect("the pod's own target");
    assert_eq!(round_trip_tunnel(tunnel, b"own").await, b"own");
}

async fn round_trip_tunnel(mut tunnel: hbone::Tunnel, payload: &[u8]) -> Vec<u8> {
    tunnel.write_all(payload).await.expect("write");
    tunnel.shutdown().await.expect("half-close");
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, tunnel.read_to_end(&mut back))
        .await
        .expect("echo in time")
        .expect("read");
    back
}

#[tokio::test]
async fn inbound_tunnel_open_at_the_drain_deadline_is_closed_and_recorded() {
    let mesh = Mesh::new();
    let b = ip(31, 2);
    mesh.add_workload(workload(
        "server",
        b,
        "server-sa",
        pb::TunnelProtocol::Hbone,
    ));
    let mut pod = mesh.start_pod(b, "server", "server-sa");
    // An application that never answers and reports what it read once closed.
    let app = TcpListener::bind(SocketAddr::new(b, APP_PORT))
        .await
        .expect("bind app");
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut tcp, _) = app.accept().await.expect("accept");
        let mut seen = Vec::new();
        let _ = tcp.read_to_end(&mut seen).await;
        let _ = closed_tx.send(seen);
    });
    let tls = mesh
        .pki
        .client_tls(Some(&id("client-sa")), vec![id("server-sa")]);
    let conn = Connection::connect(SocketAddr::new(b, HBONE_PORT), tls, &H2Settings::default())
        .await
        .expect("HBONE connection to the pod");
    let source: SocketAddr = "127.31.0.9:5000".parse().expect("addr");
    let mut tunnel = conn
        .open(&ConnectRequest::new(SocketAddr::new(b, APP_PORT), source))
        .await
        .expect("tunnel");
    tunnel.write_all(b"partial").await.expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    pod.take().drain(Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    let seen = tokio::time::timeout(WAIT, closed)
        .await
        .expect("the application's connection is closed at the deadline")
        .expect("app task");
    assert_eq!(seen, b"partial");
    let closed_line = mesh
        .metric_line(&[
            "istio_tcp_connections_closed_total{",
            "reporter=\"destination\"",
            "destination_workload=\"server\"",
        ])
        .await;
    assert!(closed_line.ends_with(" 1"), "{closed_line}");
    mesh.metric_line(&[
        "istio_tcp_received_bytes_total{",
        "reporter=\"destination\"",
    ])
    .await;
    let render = mesh.render();
    assert!(
        render
            .lines()
            .any(|l| l.starts_with("istio_tcp_received_bytes_total{")
                && l.contains("reporter=\"destination\"")
                && l.ends_with(" 7")),
        "the aborted tunnel's bytes are counted:\n{render}"
    );
}
