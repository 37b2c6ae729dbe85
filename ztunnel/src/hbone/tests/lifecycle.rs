//! Server lifecycle: graceful drain, abort on drop, and exactly one completion per accepted
//! tunnel.

use std::time::Duration;

use mesh_testutil::SilentRelay;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test]
async fn drain_sends_goaway_and_waits_for_open_tunnels() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let busy = fx.connect().await;
    let mut tunnel = busy
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("tunnel");
    tunnel.write_all(b"before ").await.expect("write");
    let _idle = fx.connect().await;
    wait_until("two connections", || fx.server.open_connections() == 2).await;

    fx.server.drain();
    fx.server.drain(); // idempotent
    let drained = {
        let server = fx.server.clone();
        tokio::spawn(async move { server.drained().await })
    };
    wait_until("the idle connection to close", || {
        fx.server.open_connections() == 1
    })
    .await;
    // A connection accepted after the drain started gets a GOAWAY straight away.
    let _late = Connection::connect(fx.hbone, fx.client_tls(), &H2Settings::default())
        .await
        .expect("the listener still accepts");
    wait_until("the late connection to close", || {
        fx.server.open_connections() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!drained.is_finished(), "drained waits for the open tunnel");
    assert_eq!(fx.server.open_tunnels(), 1);

    assert_eq!(round_trip(tunnel, b"after").await, b"before after");
    tokio::time::timeout(WAIT, drained)
        .await
        .expect("drained once the tunnel finished")
        .expect("drained task");
    assert!(fx.server.is_idle(), "{:?}", fx.server);
    let finished = fx.recorder.finished.lock().unwrap().clone();
    let total = Transferred {
        sent: 12,
        received: 12,
    };
    assert_eq!(finished, vec![(fx.client_id.clone(), Ok(total))]);
}

/// An upstream that reports what it read before its connection closed.
async fn recording_upstream() -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accept");
        let mut seen = Vec::new();
        let _ = tcp.read_to_end(&mut seen).await;
        let _ = tx.send(seen);
    });
    (addr, rx)
}

#[tokio::test]
async fn dropping_the_server_aborts_its_tunnels_and_reports_them() {
    let (upstream, closed) = recording_upstream().await;
    let mesh = Mesh::new();
    let server_id = id("server");
    let recorder = Arc::new(Recorder::default());
    let server = Arc::new(Server::new(
        mesh.server_tls(&server_id),
        H2Settings::default(),
        recorder.clone(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind hbone");
    let hbone = listener.local_addr().expect("hbone addr");
    // `run` holds the only handle: aborting it drops the server.
    let run = tokio::spawn(server.run(listener, std::future::pending()));
    let tls = mesh.client_tls(Some(&id("client")), vec![server_id]);
    let conn = Connection::connect(hbone, tls, &H2Settings::default())
        .await
        .expect("connect");
    let mut tunnel = conn
        .open(&ConnectRequest::new(upstream, source()))
        .await
        .expect("tunnel");
    tunnel.write_all(b"partial").await.expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;

    run.abort();
    let seen = tokio::time::timeout(WAIT, closed)
        .await
        .expect("the upstream connection is closed")
        .expect("upstream task");
    assert_eq!(seen, b"partial");
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(WAIT, tunnel.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the client's tunnel ends");
    wait_for_finished(&recorder, 1).await;
    let finished = recorder.finished.lock().unwrap().clone();
    let partial = Transferred {
        sent: 7,
        received: 0,
    };
    assert_eq!(finished, vec![(id("client"), Err(("aborted", partial)))]);
}

#[tokio::test]
async fn every_accepted_tunnel_is_reported_exactly_once_under_cancellation() {
    let echo = echo_server().await;
    let recorder = Recorder {
        delay: Some(Duration::from_millis(3)),
        ..Recorder::default()
    };
    let fx = Fixture::with_recorder(recorder, H2Settings::default()).await;
    let conn = fx.connect().await;
    let mut tasks = Vec::new();
    for i in 0..60u64 {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            // Some requests are cancelled before, some right after, the 200.
            let patience = Duration::from_micros(500 * (i % 12));
            let opened = tokio::time::timeout(patience, async {
                conn.open(&ConnectRequest::new(echo, source())).await
            })
            .await;
            if let Ok(Ok(tunnel)) = opened {
                if i % 2 == 0 {
                    assert_eq!(round_trip(tunnel, b"x").await, b"x");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    drop(conn);
    fx.server.drain();
    tokio::time::timeout(WAIT, fx.server.drained())
        .await
        .expect("drained");
    let accepted = *fx.recorder.accepted.lock().unwrap();
    let finished = fx.recorder.finished.lock().unwrap().clone();
    assert!(accepted > 0, "some tunnels were accepted");
    assert_eq!(finished.len(), accepted, "{finished:?}");
}

/// HTTP/2 settings pinging every 200 ms (`true`) or never.
fn pinging(on: bool) -> H2Settings {
    H2Settings {
        keepalive_interval: on.then_some(Duration::from_millis(200)),
        keepalive_timeout: Duration::from_secs(1),
        ..H2Settings::default()
    }
}

/// An HBONE connection through a relay, used once and left idle for a while (so that PINGs,
/// where on, have been answered), then cut off by the relay falling silent: neither side's TCP
/// sees anything wrong.
async fn partitioned(server: H2Settings, client: H2Settings) -> (Connection, SilentRelay) {
    let fx = Fixture::start(vec![], server).await;
    let relay = SilentRelay::to(fx.hbone).await.expect("relay");
    let conn = Connection::connect(relay.addr(), fx.client_tls(), &client)
        .await
        .expect("connect");
    let tunnel = conn
        .open(&ConnectRequest::new(echo_server().await, source()))
        .await
        .expect("tunnel");
    assert_eq!(round_trip(tunnel, b"hello").await, b"hello");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!conn.is_closed(), "a live connection was closed");
    assert_eq!(relay.closed_by_server(), 0, "a live connection was closed");
    relay.silence(true);
    (conn, relay)
}

#[tokio::test]
async fn the_client_closes_an_hbone_connection_whose_pings_go_unanswered() {
    let (conn, _relay) = partitioned(pinging(false), pinging(true)).await;
    wait_until("the client closed the connection", || conn.is_closed()).await;
}

#[tokio::test]
async fn the_server_closes_an_hbone_connection_whose_pings_go_unanswered() {
    let (_conn, relay) = partitioned(pinging(true), pinging(false)).await;
    wait_until("the server closed the connection", || {
        relay.closed_by_server() == 1
    })
    .await;
}
