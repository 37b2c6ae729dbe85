//! Loopback tests of the HBONE server, client, pool and copy helper with certificates from a
//! self-signed mesh CA.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_identity::Identity;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::copy::{copy_bidirectional, AsyncIo, ByteCounters, Transferred};
use super::*;

mod bad_input;
mod lifecycle;
mod raw_h2;

const WAIT: Duration = Duration::from_secs(10);

use mesh_testutil::TestPki as Mesh;

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa).expect("identity")
}

/// What a finished tunnel reported: its totals, or the failure's reason and partial totals.
type Finished = (Identity, Result<Transferred, (&'static str, Transferred)>);

/// Records every request, accepted tunnel and finished tunnel; answers 401 for targets in
/// `deny`, 400 for targets in `bad`, dials the rest (after `delay`, if any).
#[derive(Default)]
struct Recorder {
    requests: Mutex<Vec<InboundRequest>>,
    accepted: Mutex<usize>,
    finished: Mutex<Vec<Finished>>,
    deny: Vec<SocketAddr>,
    bad: Vec<SocketAddr>,
    delay: Option<Duration>,
}

impl Recorder {
    fn record(&self, peer: Identity, end: TunnelEnd) {
        let result = match end.result {
            Ok(()) => Ok(end.transferred),
            Err(e) => Err((e.reason(), end.transferred)),
        };
        self.finished.lock().unwrap().push((peer, result));
    }
}

impl Connector for Arc<Recorder> {
    fn connect(
        &self,
        request: InboundRequest,
    ) -> server::BoxFuture<'static, Result<Accepted, Refusal>> {
        self.requests.lock().unwrap().push(request.clone());
        let this = self.clone();
        Box::pin(async move {
            if this.deny.contains(&request.target) {
                return Err(Refusal::Denied {
                    reason: "test policy".into(),
                });
            }
            if this.bad.contains(&request.target) {
                return Err(Refusal::BadRequest {
                    reason: "not this workload".into(),
                });
            }
            if let Some(delay) = this.delay {
                tokio::time::sleep(delay).await;
            }
            let upstream = TcpStream::connect(request.target).await.map_err(|source| {
                Refusal::ConnectFailed {
                    target: request.target,
                    source,
                }
            })?;
            *this.accepted.lock().unwrap() += 1;
            let peer = request.peer_identity;
            let recorder = this.clone();
            Ok(Accepted::new(upstream, move |end: TunnelEnd| {
                recorder.record(peer, end)
            }))
        })
    }
}

/// A TCP echo server: reads until EOF, writes everything back, then closes.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut data = Vec::new();
                tcp.read_to_end(&mut data).await.expect("echo read");
                tcp.write_all(&data).await.expect("echo write");
                tcp.shutdown().await.expect("echo shutdown");
            });
        }
    });
    addr
}

struct Fixture {
    mesh: Mesh,
    server_id: Identity,
    client_id: Identity,
    hbone: SocketAddr,
    recorder: Arc<Recorder>,
    server: Arc<Server>,
}

impl Fixture {
    async fn start(deny: Vec<SocketAddr>, settings: H2Settings) -> Self {
        Self::with_recorder(
            Recorder {
                deny,
                ..Recorder::default()
            },
            settings,
        )
        .await
    }

    async fn with_recorder(recorder: Recorder, settings: H2Settings) -> Self {
        let mesh = Mesh::new();
        let server_id = id("server");
        let recorder = Arc::new(recorder);
        let server = Arc::new(Server::new(
            mesh.server_tls(&server_id),
            settings,
            recorder.clone(),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind hbone");
        let hbone = listener.local_addr().expect("hbone addr");
        tokio::spawn(server.clone().run(listener, std::future::pending()));
        Fixture {
            mesh,
            server_id,
            client_id: id("client"),
            hbone,
            recorder,
            server,
        }
    }

    fn client_tls(&self) -> Arc<ClientConfig> {
        self.mesh
            .client_tls(Some(&self.client_id), vec![self.server_id.clone()])
    }

    async fn connect(&self) -> Connection {
        Connection::connect(self.hbone, self.client_tls(), &H2Settings::default())
            .await
            .expect("HBONE connection")
    }
}

fn source() -> SocketAddr {
    "127.0.0.1:41000".parse().expect("source addr")
}

/// Writes `payload`, half-closes, and returns everything read back until EOF.
async fn round_trip(mut tunnel: Tunnel, payload: &[u8]) -> Vec<u8> {
    tunnel.write_all(payload).await.expect("tunnel write");
    tunnel.shutdown().await.expect("tunnel half-close");
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, tunnel.read_to_end(&mut back))
        .await
        .expect("echo in time")
        .expect("tunnel read");
    back
}

async fn wait_for_finished(recorder: &Recorder, count: usize) {
    tokio::time::timeout(WAIT, async {
        while recorder.finished.lock().unwrap().len() < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("tunnels finished in time");
}

#[tokio::test]
async fn echo_through_tunnel_with_half_close_and_peer_identity() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let conn = fx.connect().await;
    assert_eq!(conn.peer_identity(), &fx.server_id);
    let mut request = ConnectRequest::new(echo, source());
    request.baggage = Some("k8s.namespace.name=default".into());
    let tunnel = conn.open(&request).await.expect("tunnel");
    let payload = b"hello over hbone".repeat(1000);
    assert_eq!(round_trip(tunnel, &payload).await, payload);

    let requests = fx.recorder.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    let seen = &requests[0];
    assert_eq!(seen.peer_identity, fx.client_id);
    assert_eq!(seen.target, echo);
    assert_eq!(seen.local_addr, fx.hbone);
    assert_eq!(seen.headers[FORWARDED_HEADER], "for=\"127.0.0.1:41000\"");
    assert_eq!(seen.headers[BAGGAGE_HEADER], "k8s.namespace.name=default");

    wait_for_finished(&fx.recorder, 1).await;
    let finished = fx.recorder.finished.lock().unwrap();
    let expected = Transferred {
        sent: payload.len() as u64,
        received: payload.len() as u64,
    };
    assert_eq!(finished[0], (fx.client_id.clone(), Ok(expected)));
}

#[tokio::test]
async fn client_expecting_another_san_fails_the_handshake() {
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let tls = fx
        .mesh
        .client_tls(Some(&fx.client_id), vec![id("someone-else")]);
    let err = Connection::connect(fx.hbone, tls, &H2Settings::default())
        .await
        .expect_err("wrong SAN must fail");
    assert_eq!(err.reason(), "tls", "{err}");
    assert!(fx.recorder.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn client_without_certificate_is_rejected() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let tls = fx.mesh.client_tls(None, vec![fx.server_id.clone()]);
    // TLS 1.3: the server's rejection of the missing client certificate may only surface on
    // the first request.
    let result = match Connection::connect(fx.hbone, tls, &H2Settings::default()).await {
        Ok(conn) => conn
            .open(&ConnectRequest::new(echo, source()))
            .await
            .map(drop),
        Err(e) => Err(e),
    };
    assert!(result.is_err(), "anonymous client must not get a tunnel");
    assert!(fx.recorder.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn policy_refusal_is_401() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![echo], H2Settings::default()).await;
    let conn = fx.connect().await;
    let mut denied = ConnectRequest::new(echo, source());
    denied.early_data = bytes::Bytes::from_static(b"discarded with the stream");
    let err = conn.open(&denied).await.expect_err("denied");
    assert_eq!(err.status(), Some(http::StatusCode::UNAUTHORIZED), "{err}");
    assert_eq!(err.reason(), "status_401");
    assert_eq!(*fx.recorder.accepted.lock().unwrap(), 0, "nothing dialed");
    // The connection survives a refused stream.
    let other = echo_server().await;
    let tunnel = conn
        .open(&ConnectRequest::new(other, source()))
        .await
        .expect("allowed");
    assert_eq!(round_trip(tunnel, b"still works").await, b"still works");
}

#[tokio::test]
async fn early_data_reaches_the_target_ahead_of_the_rest_and_is_counted() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let conn = fx.connect().await;
    let mut request = ConnectRequest::new(echo, source());
    request.early_data = bytes::Bytes::from_static(b"early ");
    let tunnel = conn.open(&request).await.expect("tunnel");
    assert_eq!(round_trip(tunnel, b"rest").await, b"early rest");
    wait_for_finished(&fx.recorder, 1).await;
    let finished = fx.recorder.finished.lock().unwrap();
    let expected = Transferred {
        sent: 10,
        received: 10,
    };
    assert_eq!(finished[0], (fx.client_id.clone(), Ok(expected)));
}

/// A bare HTTP/2 server that answers only once the stream's first DATA has arrived: a client
/// that held its early data until the answer would wait forever.
#[tokio::test]
async fn early_data_is_sent_before_the_answer() {
    let mesh = Mesh::new();
    let server_id = id("server");
    let acceptor = tokio_rustls::TlsAcceptor::from(mesh.server_tls(&server_id));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let tls = acceptor.accept(tcp).await.expect("server TLS");
        let mut h2 = h2::server::handshake(tls).await.expect("server h2");
        let (request, mut respond) = h2
            .accept()
            .await
            .expect("a request")
            .expect("a valid request");
        // Keep the connection moving while the body is read.
        tokio::spawn(async move { while h2.accept().await.is_some() {} });
        assert_eq!(request.method(), http::Method::CONNECT);
        let mut body = request.into_body();
        let first = body
            .data()
            .await
            .expect("DATA before any answer")
            .expect("a DATA frame");
        respond
            .send_response(http::Response::new(()), false)
            .expect("answer 200");
        (first, body, respond)
    });
    let tls = mesh.client_tls(Some(&id("client")), vec![server_id]);
    let conn = Connection::connect(addr, tls, &H2Settings::default())
        .await
        .expect("connect");
    let mut request = ConnectRequest::new("127.0.0.1:9".parse().expect("target"), source());
    request.early_data = bytes::Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n");
    let tunnel = tokio::time::timeout(WAIT, conn.open(&request))
        .await
        .expect("the answer came, so the early data went first")
        .expect("tunnel");
    let (first, _body, _respond) = server.await.expect("server task");
    assert_eq!(&first[..], b"GET / HTTP/1.1\r\n\r\n");
    drop(tunnel);
}

#[tokio::test]
async fn refusal_as_bad_request_is_400() {
    let echo = echo_server().await;
    let fx = Fixture::with_recorder(
        Recorder {
            bad: vec![echo],
            ..Recorder::default()
        },
        H2Settings::default(),
    )
    .await;
    let conn = fx.connect().await;
    let err = conn
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect_err("bad request");
    assert_eq!(err.status(), Some(http::StatusCode::BAD_REQUEST), "{err}");
    assert_eq!(err.reason(), "status_400");
    assert_eq!(*fx.recorder.accepted.lock().unwrap(), 0);
}

#[tokio::test]
async fn dial_failure_is_503() {
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    };
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let conn = fx.connect().await;
    let err = conn
        .open(&ConnectRequest::new(closed, source()))
        .await
        .expect_err("closed port");
    assert_eq!(
        err.status(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE),
        "{err}"
    );
}

#[tokio::test]
async fn twenty_concurrent_streams_share_one_connection() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let conn = fx.connect().await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let tunnel = conn
                .open(&ConnectRequest::new(echo, source()))
                .await
                .expect("tunnel");
            let payload = format!("stream {i} ").repeat(500).into_bytes();
            assert_eq!(round_trip(tunnel, &payload).await, payload);
        }));
    }
    for task in tasks {
        task.await.expect("stream task");
    }
    let requests = fx.recorder.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 20);
    assert!(requests
        .iter()
        .all(|r| r.peer_addr == requests[0].peer_addr));
    wait_for_finished(&fx.recorder, 20).await;
    assert_eq!(conn.active_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_one_destination_dials_one_connection_per_stream_cap() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let pool = Arc::new(Pool::new(H2Settings {
        max_streams_per_connection: 10,
        ..H2Settings::default()
    }));
    let key = PoolKey::new(fx.client_id.clone(), vec![fx.server_id.clone()], fx.hbone);
    let request = ConnectRequest::new(echo, source());
    let opens = (0..50).map(|_| {
        let (pool, key, request, tls) =
            (pool.clone(), key.clone(), request.clone(), fx.client_tls());
        tokio::spawn(async move { pool.open(&key, tls, &request).await })
    });
    let mut held = Vec::new();
    for open in opens {
        held.push(open.await.expect("join").expect("tunnel"));
    }
    assert_eq!(
        pool.connections(&key),
        5,
        "50 concurrent tunnels at 10 streams each need 5 connections, not one per caller"
    );
    assert_eq!(pool.dials_in_progress(), 0, "dial locks are released");
    assert_eq!(fx.server.open_connections(), 5);
    for tunnel in held {
        assert_eq!(round_trip(tunnel, b"burst").await, b"burst");
    }
    // Once the burst is over, the pool keeps one idle connection and lets the others close
    // at once (not after the unused-release timeout).
    tokio::time::timeout(WAIT, async {
        while pool.connections(&key) > 1 || fx.server.open_connections() > 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "spare connections not released: {} pooled, {} open at the server",
            pool.connections(&key),
            fx.server.open_connections()
        )
    });
    assert_eq!(pool.connections(&key), 1);
    // The one kept is reused.
    let again = pool
        .open(&key, fx.client_tls(), &request)
        .await
        .expect("reuse");
    assert_eq!(round_trip(again, b"after").await, b"after");
    assert_eq!(fx.server.open_connections(), 1, "no new dial");
}

#[tokio::test]
async fn pool_reuses_connections_and_caps_streams_per_connection() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let pool = Pool::new(H2Settings {
        max_streams_per_connection: 2,
        ..H2Settings::default()
    });
    let key = PoolKey::new(fx.client_id.clone(), vec![fx.server_id.clone()], fx.hbone);
    let request = ConnectRequest::new(echo, source());
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            pool.open(&key, fx.client_tls(), &request)
                .await
                .expect("pooled tunnel"),
        );
    }
    assert_eq!(
        pool.connections(&key),
        2,
        "2 streams per connection → 2 connections"
    );
    let first = held.remove(0);
    assert_eq!(round_trip(first, b"one").await, b"one");
    // The freed slot is reused instead of dialing a third connection.
    let again = pool
        .open(&key, fx.client_tls(), &request)
        .await
        .expect("reuse");
    assert_eq!(pool.connections(&key), 2);
    assert_eq!(round_trip(again, b"two").await, b"two");
    for tunnel in held {
        assert_eq!(round_trip(tunnel, b"held").await, b"held");
    }
    let peers: std::collections::HashSet<_> = fx
        .recorder
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.peer_addr)
        .collect();
    assert_eq!(peers.len(), 2, "the server saw exactly two TCP connections");
}

#[tokio::test]
async fn copy_propagates_half_close_both_ways_and_counts_bytes() {
    let (client, proxy_down) = tokio::io::duplex(64 * 1024);
    let (proxy_up, server) = tokio::io::duplex(64 * 1024);
    let counters = Arc::new(ByteCounters::default());
    let copy_counters = counters.clone();
    let copy = tokio::spawn(async move {
        copy_bidirectional(AsyncIo(proxy_down), AsyncIo(proxy_up), &copy_counters).await
    });
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);

    client_write
        .write_all(&[7u8; 5000])
        .await
        .expect("client write");
    client_write.shutdown().await.expect("client half-close");
    let mut at_server = Vec::new();
    server_read
        .read_to_end(&mut at_server)
        .await
        .expect("server reads EOF");
    assert_eq!(at_server.len(), 5000);
    // The other direction still flows after the first half-close.
    server_write
        .write_all(b"reply")
        .await
        .expect("server write");
    server_write.shutdown().await.expect("server half-close");
    let mut at_client = Vec::new();
    client_read
        .read_to_end(&mut at_client)
        .await
        .expect("client reads EOF");
    assert_eq!(at_client, b"reply");

    let transferred = copy.await.expect("copy task").expect("copy");
    assert_eq!(
        transferred,
        Transferred {
            sent: 5000,
            received: 5
        }
    );
    assert_eq!((counters.sent(), counters.received()), (5000, 5));
}

#[test]
fn pool_key_ignores_destination_identity_order() {
    let dst: SocketAddr = "10.0.0.1:15008".parse().expect("addr");
    let a = PoolKey::new(id("src"), vec![id("b"), id("a"), id("a")], dst);
    let b = PoolKey::new(id("src"), vec![id("a"), id("b")], dst);
    assert_eq!(a, b);
}

#[test]
fn connect_request_carries_authority_and_forwarded() {
    let target: SocketAddr = "[fd00::1]:8080".parse().expect("target");
    let src: SocketAddr = "[fd00::2]:5555".parse().expect("src");
    let mut request = ConnectRequest::new(target, src);
    request.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
    let http = request.to_http().expect("request");
    assert_eq!(http.method(), http::Method::CONNECT);
    assert_eq!(
        http.uri().authority().expect("authority").as_str(),
        "[fd00::1]:8080"
    );
    assert_eq!(http.headers()[FORWARDED_HEADER], "for=\"[fd00::2]:5555\"");
    assert!(http.headers().contains_key(TRACEPARENT_HEADER));
    request.baggage = Some("bad\nvalue".into());
    let err = request.to_http().expect_err("newline in header");
    assert_eq!(err.reason(), "invalid_header");
}

#[test]
fn a_stream_that_may_have_run_is_told_apart_from_one_that_never_did() {
    let failed = |sent, reason: h2::Reason| HboneError::Request {
        authority: "10.0.0.1:80".into(),
        source: reason.into(),
        sent,
    };
    // Never left, or refused unprocessed: safe to send again elsewhere.
    assert!(!failed(false, h2::Reason::INTERNAL_ERROR).may_have_been_processed());
    assert!(!failed(true, h2::Reason::REFUSED_STREAM).may_have_been_processed());
    // Left and then failed: the peer may have acted on it.
    assert!(failed(true, h2::Reason::INTERNAL_ERROR).may_have_been_processed());
    assert!(failed(true, h2::Reason::CANCEL).may_have_been_processed());
    let answered = HboneError::Status {
        authority: "10.0.0.1:80".into(),
        status: http::StatusCode::SERVICE_UNAVAILABLE,
    };
    assert!(!answered.may_have_been_processed());
}

#[tokio::test]
async fn shutdown_stops_accepting_and_run_returns_once_open_tunnels_finish() {
    let echo = echo_server().await;
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
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run(listener, async move {
        let _ = stopped.await;
    }));
    let tls = mesh.client_tls(Some(&id("client")), vec![server_id]);
    let conn = Connection::connect(hbone, tls.clone(), &H2Settings::default())
        .await
        .expect("connect");
    let mut tunnel = conn
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("tunnel");
    tunnel.write_all(b"before ").await.expect("write");

    stop.send(()).expect("stop");
    tokio::time::timeout(WAIT, async {
        while TcpStream::connect(hbone).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the listener is closed after shutdown");
    assert!(!run.is_finished(), "run waits for the open tunnel");
    assert_eq!(round_trip(tunnel, b"after").await, b"before after");
    tokio::time::timeout(WAIT, run)
        .await
        .expect("run returns once drained")
        .expect("run task")
        .expect("run");
    // `run` held the only handle: the tunnel was reported before it returned.
    let finished = recorder.finished.lock().unwrap().clone();
    assert_eq!(finished.len(), 1);
    assert!(finished[0].1.is_ok(), "{finished:?}");
}
