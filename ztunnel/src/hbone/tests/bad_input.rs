//! Bad input on 15008: malformed requests, oversized headers, too many streams, bad client
//! certificates, garbage bytes. Each is refused alone: other tunnels on the same HTTP/2
//! connection, and other connections, keep working.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mesh_identity::tls::{client_config, CertKey};
use mesh_identity::{generate_csr, CaOptions, CertificateAuthority, Identity};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::raw_h2::{self, Answer, RawH2, END_STREAM};
use super::*;

fn raw_request(method: http::Method, uri: &str) -> http::Request<()> {
    http::Request::builder()
        .method(method)
        .version(http::Version::HTTP_2)
        .uri(uri)
        .body(())
        .expect("request")
}

#[tokio::test]
async fn malformed_authority_and_non_connect_are_400_beside_a_live_tunnel() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let conn = fx.connect().await;
    let mut live = conn
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("tunnel");
    live.write_all(b"before ").await.expect("write");
    for uri in ["echo.default.svc:8080", "127.0.0.1", "[::1]"] {
        let err = conn
            .send(raw_request(http::Method::CONNECT, uri))
            .await
            .expect_err("bad authority");
        assert_eq!(
            err.status(),
            Some(http::StatusCode::BAD_REQUEST),
            "{uri}: {err}"
        );
    }
    for method in [http::Method::GET, http::Method::POST] {
        let err = conn
            .send(raw_request(method.clone(), "https://127.0.0.1:80/"))
            .await
            .expect_err("not CONNECT");
        assert_eq!(
            err.status(),
            Some(http::StatusCode::BAD_REQUEST),
            "{method}: {err}"
        );
    }
    assert_eq!(fx.recorder.requests.lock().unwrap().len(), 1);
    assert_eq!(round_trip(live, b"after").await, b"before after");
    let again = conn
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("a new tunnel on the same connection");
    assert_eq!(round_trip(again, b"again").await, b"again");
}

#[tokio::test]
async fn connect_without_authority_is_refused_beside_a_live_tunnel() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let mut raw = RawH2::connect(fx.hbone, fx.client_tls()).await;
    raw.headers(1, &raw_h2::connect_block(Some(&echo.to_string())))
        .await;
    assert_eq!(raw.answer(1, drop).await, Answer::Status(200));
    raw.send(raw_h2::DATA, 0, 1, b"live ").await;

    // No :authority at all: our 400.
    raw.headers(3, &raw_h2::connect_block(None)).await;
    assert_eq!(raw.answer(3, drop).await, Answer::Status(400));
    // A CONNECT with :scheme and :path is malformed (RFC 9113 §8.5): h2 resets the stream.
    let mut block = raw_h2::connect_block(Some(&echo.to_string()));
    raw_h2::field(&mut block, raw_h2::SCHEME, "https");
    raw_h2::field(&mut block, raw_h2::PATH, "/");
    raw.headers(5, &block).await;
    assert_eq!(
        raw.answer(5, drop).await,
        Answer::Reset(raw_h2::PROTOCOL_ERROR)
    );
    // An authority that is a name, sent raw: our 400.
    raw.headers(7, &raw_h2::connect_block(Some("echo.default:80")))
        .await;
    assert_eq!(raw.answer(7, drop).await, Answer::Status(400));

    raw.send(raw_h2::DATA, END_STREAM, 1, b"still here").await;
    assert_eq!(raw.body(1).await, b"live still here");
    assert_eq!(fx.recorder.requests.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn oversized_request_headers_are_refused_alone() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let conn = fx.connect().await;
    let mut live = conn
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("tunnel");
    live.write_all(b"before ").await.expect("write");
    let mut request = ConnectRequest::new(echo, source());
    request.baggage = Some("x".repeat(100 * 1024));
    let err = conn
        .open(&request)
        .await
        .expect_err("a 100 KiB header block must be refused");
    assert!(
        matches!(err.reason(), "status_431" | "request"),
        "431 or a stream reset, got {err}"
    );
    assert_eq!(fx.recorder.requests.lock().unwrap().len(), 1);
    assert_eq!(round_trip(live, b"after").await, b"before after");
    let again = conn
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("the connection still serves new streams");
    assert_eq!(round_trip(again, b"again").await, b"again");
}

#[tokio::test]
async fn streams_over_max_concurrent_are_refused_by_h2() {
    let echo = echo_server().await;
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let max = H2Settings::default().max_concurrent_streams;
    let mut raw = RawH2::connect(fx.hbone, fx.client_tls()).await;
    let block = raw_h2::connect_block(Some(&echo.to_string()));
    let ids: Vec<u32> = (0..=max).map(|i| 2 * i + 1).collect();
    for id in &ids {
        raw.headers(*id, &block).await;
    }
    let mut answers = std::collections::HashMap::new();
    while answers.len() < ids.len() {
        let frame = raw.read().await.expect("connection open");
        assert_ne!(frame.kind, raw_h2::GOAWAY, "{frame:?}");
        match frame.kind {
            raw_h2::HEADERS => answers.insert(frame.stream, Answer::Status(200)),
            raw_h2::RST_STREAM => {
                answers.insert(frame.stream, Answer::Reset(raw_h2::code(&frame.payload)))
            }
            _ => None,
        };
    }
    let refused: Vec<_> = answers
        .iter()
        .filter(|(_, a)| **a == Answer::Reset(raw_h2::REFUSED_STREAM))
        .map(|(id, _)| *id)
        .collect();
    let ok = answers
        .values()
        .filter(|a| **a == Answer::Status(200))
        .count();
    assert_eq!(refused, vec![2 * max + 1], "{answers:?}");
    assert_eq!(ok, max as usize);
    assert_eq!(fx.recorder.requests.lock().unwrap().len(), max as usize);

    // Ending one tunnel frees a slot on the same connection.
    raw.send(raw_h2::DATA, END_STREAM, 1, b"one").await;
    assert_eq!(raw.body(1).await, b"one");
    let next = 2 * max + 3;
    raw.headers(next, &block).await;
    assert_eq!(raw.answer(next, drop).await, Answer::Status(200));
    raw.send(raw_h2::DATA, END_STREAM, next, b"next").await;
    assert_eq!(raw.body(next).await, b"next");
}

/// Runs one server-side handshake against a client using `tls`; returns the server's error.
async fn refused_handshake(fx: &Fixture, tls: Arc<ClientConfig>) -> HboneError {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let client = tokio::spawn(async move {
        // The client may only learn of the refusal on its first read.
        if let Ok(conn) = Connection::connect(addr, tls, &H2Settings::default()).await {
            let target: SocketAddr = "127.0.0.1:9".parse().expect("addr");
            let _ = conn.open(&ConnectRequest::new(target, source())).await;
        }
    });
    let (tcp, peer) = listener.accept().await.expect("accept");
    let err = tokio::time::timeout(WAIT, fx.server.serve_connection(tcp, peer))
        .await
        .expect("handshake outcome in time")
        .expect_err("the handshake must be refused");
    client.abort();
    err
}

/// The good client still gets a tunnel through the fixture's listener.
async fn still_serving(fx: &Fixture) {
    let echo = echo_server().await;
    let tunnel = fx
        .connect()
        .await
        .open(&ConnectRequest::new(echo, source()))
        .await
        .expect("tunnel");
    assert_eq!(round_trip(tunnel, b"ok").await, b"ok");
}

fn client_with(fx: &Fixture, cert: CertKey) -> Arc<ClientConfig> {
    let config = client_config(Some(cert), &fx.mesh.roots(), vec![fx.server_id.clone()]);
    Arc::new(config.expect("client config"))
}

#[tokio::test]
async fn expired_client_certificate_is_refused_with_a_clear_error() {
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let csr = generate_csr(&fx.client_id).expect("csr");
    let chain = fx
        .mesh
        .ca
        .sign_csr(&csr.csr_pem, &fx.client_id, Some(Duration::from_secs(1)))
        .expect("sign");
    let cert = CertKey::from_pem(&chain, &csr.key_pem).expect("cert");
    // Validity has one-second resolution.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let err = refused_handshake(&fx, client_with(&fx, cert)).await;
    assert_eq!(err.reason(), "tls", "{err}");
    assert!(err.to_string().contains("expired"), "{err}");
    assert!(fx.recorder.requests.lock().unwrap().is_empty());
    still_serving(&fx).await;
}

#[tokio::test]
async fn client_certificate_without_spiffe_id_is_refused() {
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    // Chains to the mesh root, but names a DNS host instead of a SPIFFE identity.
    let serving = fx
        .mesh
        .ca
        .serving_cert(&["client.example.com"], &[])
        .expect("serving cert");
    let cert = CertKey::from_pem(&serving.chain_pem, &serving.key_pem).expect("cert");
    let err = refused_handshake(&fx, client_with(&fx, cert)).await;
    assert_eq!(err.reason(), "tls", "{err}");
    assert!(err.to_string().contains("spiffe"), "{err}");
    still_serving(&fx).await;
}

#[tokio::test]
async fn client_certificate_of_another_trust_domain_is_refused() {
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let options = CaOptions {
        trust_domain: "evil.local".into(),
        ..CaOptions::default()
    };
    let foreign = CertificateAuthority::self_signed(dir.path(), options).expect("foreign CA");
    let intruder = Identity::new("evil.local", "default", "client").expect("identity");
    let csr = generate_csr(&intruder).expect("csr");
    let chain = foreign
        .sign_csr(&csr.csr_pem, &intruder, None)
        .expect("sign");
    let cert = CertKey::from_pem(&chain, &csr.key_pem).expect("cert");
    let err = refused_handshake(&fx, client_with(&fx, cert)).await;
    assert_eq!(err.reason(), "tls", "{err}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    still_serving(&fx).await;
}

#[tokio::test]
async fn plaintext_garbage_and_silent_connections_do_not_disturb_a_good_one() {
    let fx = Fixture::start(vec![], H2Settings::default()).await;
    let mut clients = Vec::new();
    for bytes in [
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\xff\xff\x00\x01\x02 truncated TLS record with garbage",
        &[0xffu8; 4096][..],
    ] {
        let mut tcp = TcpStream::connect(fx.hbone).await.expect("connect");
        tcp.write_all(bytes).await.expect("write");
        clients.push(tcp);
    }
    let _silent = TcpStream::connect(fx.hbone).await.expect("silent connect");

    still_serving(&fx).await;
    for mut tcp in clients {
        // The server closes each (possibly after a TLS alert).
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(WAIT, tcp.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the server must close a garbage connection");
    }
    // Only the good client's request reached the connector.
    assert_eq!(fx.recorder.requests.lock().unwrap().len(), 1);
}
