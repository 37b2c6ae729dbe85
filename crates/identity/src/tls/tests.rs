use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;
use crate::ca::{CaOptions, CertificateAuthority};
use crate::csr::generate_csr;

struct Mesh {
    _dir: tempfile::TempDir,
    ca: CertificateAuthority,
}

impl Mesh {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = CertificateAuthority::self_signed(dir.path(), CaOptions::default()).expect("ca");
        Mesh { _dir: dir, ca }
    }

    fn roots(&self) -> Vec<CertificateDer<'static>> {
        parse_certs(self.ca.root_cert_pem(), "root").expect("root")
    }

    fn cert_for(&self, identity: &Identity) -> CertKey {
        let csr = generate_csr(identity).expect("csr");
        let chain = self
            .ca
            .sign_csr(&csr.csr_pem, identity, None)
            .expect("signed");
        CertKey::from_pem(&chain, &csr.key_pem).expect("cert key")
    }
}

fn id(s: &str) -> Identity {
    Identity::parse(s).expect("identity")
}

/// Runs a handshake over an in-memory pipe, exchanging one message. Returns the client's
/// result and, on success, the identity the server saw.
async fn handshake(
    server: ServerConfig,
    client: ClientConfig,
) -> (Result<(), std::io::Error>, Option<Identity>) {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let acceptor = TlsAcceptor::from(Arc::new(server));
    let server_task = tokio::spawn(async move {
        let mut tls = acceptor.accept(s).await.ok()?;
        let (_, conn) = tls.get_ref();
        assert_eq!(conn.alpn_protocol(), Some(ALPN_H2));
        assert_eq!(
            conn.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        assert_eq!(
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
        );
        let peer = peer_identity_of(conn.peer_certificates()).ok();
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.ok()?;
        tls.write_all(b"pong").await.ok()?;
        tls.shutdown().await.ok()?;
        peer
    });
    let connector = TlsConnector::from(Arc::new(client));
    let name = ServerName::try_from("10.0.0.2").expect("name");
    let result = async {
        let mut tls = connector.connect(name, c).await?;
        tls.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"pong");
        Ok(())
    }
    .await;
    let peer = server_task.await.expect("server task");
    (result, peer)
}

#[tokio::test]
async fn mutual_tls_with_matching_spiffe_identity() {
    let mesh = Mesh::new();
    let server_id = id("spiffe://cluster.local/ns/default/sa/server");
    let client_id = id("spiffe://cluster.local/ns/default/sa/client");
    let server = server_config(
        mesh.cert_for(&server_id),
        &mesh.roots(),
        ClientAuth::RequireSpiffe,
    )
    .expect("server config");
    let client = client_config(
        Some(mesh.cert_for(&client_id)),
        &mesh.roots(),
        vec![
            id("spiffe://cluster.local/ns/default/sa/other"),
            server_id.clone(),
        ],
    )
    .expect("client config");
    let (result, peer) = handshake(server, client).await;
    result.expect("handshake and echo succeed");
    assert_eq!(peer, Some(client_id));
}

#[tokio::test]
async fn mismatching_expected_identity_fails_naming_it() {
    let mesh = Mesh::new();
    let server_id = id("spiffe://cluster.local/ns/default/sa/server");
    let expected = id("spiffe://cluster.local/ns/default/sa/database");
    let server = server_config(mesh.cert_for(&server_id), &mesh.roots(), ClientAuth::None)
        .expect("server config");
    let client = client_config(None, &mesh.roots(), vec![expected.clone()]).expect("client");
    let (result, peer) = handshake(server, client).await;
    let err = result.expect_err("wrong identity refused");
    let msg = err.to_string();
    assert!(
        msg.contains(&server_id.to_string()) && msg.contains(&expected.to_string()),
        "{msg}"
    );
    assert_eq!(peer, None);
}

#[tokio::test]
async fn untrusted_root_and_missing_client_cert_fail() {
    let mesh = Mesh::new();
    let stranger = Mesh::new();
    let server_id = id("spiffe://cluster.local/ns/default/sa/server");
    let server = || {
        server_config(
            mesh.cert_for(&server_id),
            &mesh.roots(),
            ClientAuth::RequireSpiffe,
        )
        .expect("server config")
    };
    // Server chain does not lead to the client's roots.
    let client = client_config(None, &stranger.roots(), vec![server_id.clone()]).expect("client");
    let (result, _) = handshake(server(), client).await;
    // Both roots are named O=cluster.local, so webpki may report the signature instead.
    let err = result.expect_err("untrusted chain");
    let msg = err.to_string();
    assert!(
        msg.contains("UnknownIssuer") || msg.contains("BadSignature"),
        "{msg}"
    );
    // No client certificate for a server that requires one.
    let client = client_config(None, &mesh.roots(), vec![server_id.clone()]).expect("client");
    let (result, peer) = handshake(server(), client).await;
    assert!(
        result.is_err() || peer.is_none(),
        "server must refuse an anonymous client"
    );
    assert_eq!(peer, None);
    // Client certificate from another CA.
    let client_id = id("spiffe://cluster.local/ns/default/sa/client");
    let client = client_config(
        Some(stranger.cert_for(&client_id)),
        &mesh.roots(),
        vec![server_id.clone()],
    )
    .expect("client");
    let (_, peer) = handshake(server(), client).await;
    assert_eq!(peer, None);
}

#[tokio::test]
async fn server_name_verification_for_istiod() {
    let mesh = Mesh::new();
    let ips = ["127.0.0.1".parse().expect("ip")];
    let serving = mesh
        .ca
        .serving_cert(&["istiod.istio-system.svc", "localhost"], &ips)
        .expect("serving");
    let cert = CertKey::from_pem(&serving.chain_pem, &serving.key_pem).expect("cert");
    let roots = mesh.roots();
    for (name, ok) in [
        ("istiod.istio-system.svc", true),
        ("127.0.0.1", true),
        ("evil.example", false),
    ] {
        let server = server_config(cert.clone(), &roots, ClientAuth::None).expect("server");
        let client = client_config_for_server_name(&roots).expect("client");
        let (c, s) = tokio::io::duplex(64 * 1024);
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let srv = tokio::spawn(async move { acceptor.accept(s).await.map(|_| ()) });
        let connector = TlsConnector::from(Arc::new(client));
        let name_owned = ServerName::try_from(name).expect("name").to_owned();
        let res = connector.connect(name_owned, c).await;
        assert_eq!(res.is_ok(), ok, "{name}: {:?}", res.err());
        drop(srv);
    }
}

#[test]
fn peer_identity_rules() {
    let mesh = Mesh::new();
    let ident = id("spiffe://cluster.local/ns/a/sa/b");
    let cert = mesh.cert_for(&ident);
    assert_eq!(peer_identity(&cert.chain[0]).expect("identity"), ident);
    let serving = mesh.ca.serving_cert(&["localhost"], &[]).expect("serving");
    let leaf = parse_certs(&serving.chain_pem[0], "leaf").expect("leaf");
    let err = peer_identity(&leaf[0]).expect_err("no spiffe");
    assert_eq!(err.reason(), "no_spiffe_id");
    assert_eq!(
        peer_identity_of(None).expect_err("none").reason(),
        "no_certificates"
    );
    assert_eq!(root_store(&[]).expect_err("no roots").reason(), "no_roots");
    assert_eq!(
        CertKey::from_pem(&["junk"], "junk")
            .expect_err("junk")
            .reason(),
        "no_certificates"
    );
}

#[tokio::test]
async fn only_istio_cipher_suites_are_offered_and_aes_256_is_preferred() {
    let suites: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
    assert_eq!(
        suites,
        [
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        ]
    );
    let mesh = Mesh::new();
    let server_id = id("spiffe://cluster.local/ns/default/sa/server");
    let server = server_config(mesh.cert_for(&server_id), &mesh.roots(), ClientAuth::None)
        .expect("server config");
    // A peer that only speaks ChaCha20-Poly1305 finds no common suite.
    let chacha_only = rustls::crypto::CryptoProvider {
        cipher_suites: vec![rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256],
        ..rustls::crypto::ring::default_provider()
    };
    let client = ClientConfig::builder_with_provider(Arc::new(chacha_only))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_root_certificates(root_store(&mesh.roots()).expect("roots"))
        .with_no_client_auth();
    let (c, s) = tokio::io::duplex(64 * 1024);
    let acceptor = TlsAcceptor::from(Arc::new(server.clone()));
    let server_task = tokio::spawn(async move { acceptor.accept(s).await.map(|_| ()) });
    let name = ServerName::try_from("10.0.0.2").expect("name");
    let refused = TlsConnector::from(Arc::new(client)).connect(name, c).await;
    assert!(refused.is_err());
    let server_err = server_task
        .await
        .expect("task")
        .expect_err("no common suite");
    assert!(
        server_err.to_string().contains("NoCipherSuitesInCommon"),
        "{server_err}"
    );
}
