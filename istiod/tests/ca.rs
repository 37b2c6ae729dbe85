//! The certificate service over real gRPC (TLS on loopback, as on 15012) with the generated
//! tonic client: issuance, plugged-in and self-signed CAs, and every refusal.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use istiod::auth::TokenFileAuthenticator;
use istiod::ca::{CaService, CaStats, NodeLocator, IMPERSONATED_IDENTITY};
use mesh_identity::ca::{CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE};
use mesh_identity::tls::{parse_certs, peer_identity, provider, root_store, SpiffeServerVerifier};
use mesh_identity::{generate_csr, CaOptions, CertificateAuthority, Identity};
use mesh_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use mesh_proto::ca::IstioCertificateRequest;
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{ServerName, UnixTime};
use tokio::task::JoinHandle;
use tonic::transport::{Channel, ClientTlsConfig, ServerTlsConfig};
use tonic::{Code, Request};

const TD: &str = "cluster.local";
const ISTIOD_NAME: &str = "istiod.istio-system.svc";

/// RSA-1024 CSR for spiffe://cluster.local/ns/default/sa/legacy (ring cannot make one).
const RSA1024_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIIBiDCB8gIBADAAMIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDJ0uDTIlX0
XeJNnfFqAsjPIybil0F/c0EH/RFLIJycndfKyHj/efNQHdAdUqRXg4MrTIZRMUAY
H2LbdhfGo3foDjS4XuMMkcq4vguhdNfnw/aSBRw1qXNUAUvWPq+4QuYvzqAorNO0
jZ8ZQUeKcQeN0hOS5vwFlcQ6+O/acERWMwIDAQABoEkwRwYJKoZIhvcNAQkOMTow
ODA2BgNVHREELzAthitzcGlmZmU6Ly9jbHVzdGVyLmxvY2FsL25zL2RlZmF1bHQv
c2EvbGVnYWN5MA0GCSqGSIb3DQEBCwUAA4GBABFQSNZW5RXoxgy/Ap3VNuq5B2CK
RGXmr/YDlCUoRIpg4DgDQiQIOkEUEnYI5FgIuJJgTc2Gw7b1C9JhOTvMaA48K5G/
1kIFcBCU6cODxluDtAIzgJhDH6YmzblHvuxjr6nn/l9bBfL4CRkpVvU802eDLVTU
iV2ee9EjvtdBbkV0
-----END CERTIFICATE REQUEST-----
";

const TOKENS: &str = r#"
tokens:
- token: ztunnel-node1-token
  identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel
  node: node1
- token: app-token
  identity: spiffe://cluster.local/ns/default/sa/app
- token: expired-token
  identity: spiffe://cluster.local/ns/default/sa/old
  expires: 2020-01-01T00:00:00Z
"#;

fn id(s: &str) -> Identity {
    Identity::parse(s).expect("identity")
}

/// Workloads by node: (node, namespace, service account).
struct Placement(HashSet<(String, String, String)>);

impl NodeLocator for Placement {
    fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.0
            .contains(&(node.into(), namespace.into(), service_account.into()))
    }

    /// The token file names nodes itself: the CA never looks a pod up in the local mode.
    fn pod(&self, _namespace: &str, _name: &str) -> Option<istiod::model::PodFacts> {
        None
    }
}

fn placement() -> Arc<Placement> {
    let on = |n: &str, ns: &str, sa: &str| (n.to_string(), ns.to_string(), sa.to_string());
    Arc::new(Placement(
        [
            on("node1", "default", "productpage"),
            on("node2", "default", "reviews"),
        ]
        .into_iter()
        .collect(),
    ))
}

struct Server {
    addr: SocketAddr,
    root_pem: String,
    stats: Arc<CaStats>,
    task: JoinHandle<()>,
    _tokens: tempfile::TempDir,
}

/// Serves `ca` over TLS (istiod's own serving certificate) on 127.0.0.1:0.
async fn serve(ca: CertificateAuthority) -> Server {
    let tokens = tempfile::tempdir().expect("tempdir");
    let token_path = tokens.path().join("tokens.yaml");
    std::fs::write(&token_path, TOKENS).expect("write tokens");
    let auth = TokenFileAuthenticator::new(&token_path).expect("token file");
    let ips = ["127.0.0.1".parse().expect("ip")];
    let serving = ca
        .serving_cert(&[ISTIOD_NAME, "localhost"], &ips)
        .expect("serving cert");
    let root_pem = ca.root_cert_pem().to_string();
    let svc = CaService::new(
        istiod::live_ca::LiveCa::new(Arc::new(ca)),
        Arc::new(auth),
        placement(),
        "Kubernetes",
    );
    let stats = svc.stats();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(
        serving.chain_pem.concat(),
        serving.key_pem,
    ));
    let router = tonic::transport::Server::builder()
        .tls_config(tls)
        .expect("tls config")
        .add_service(svc.into_server());
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        router
            .serve_with_incoming(incoming)
            .await
            .expect("server runs");
    });
    Server {
        addr,
        root_pem,
        stats,
        task,
        _tokens: tokens,
    }
}

async fn client(server: &Server) -> IstioCertificateServiceClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&server.root_pem))
        .domain_name(ISTIOD_NAME);
    let channel = Channel::from_shared(format!("https://{}", server.addr))
        .expect("uri")
        .tls_config(tls)
        .expect("client tls")
        .connect()
        .await
        .expect("connect to CA");
    IstioCertificateServiceClient::new(channel)
}

fn request(
    token: Option<&str>,
    csr: &str,
    impersonate: Option<&str>,
    ttl_s: i64,
) -> Request<IstioCertificateRequest> {
    let metadata = impersonate.map(|who| prost_types::Struct {
        fields: [(
            IMPERSONATED_IDENTITY.to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(who.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    });
    let mut req = Request::new(IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: ttl_s,
        metadata,
    });
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header");
        req.metadata_mut().insert("authorization", value);
    }
    req.metadata_mut()
        .insert("clusterid", "Kubernetes".parse().expect("header"));
    req
}

/// Verifies the chain to `root_pem` at `at` and returns the leaf's identity.
fn verify(chain: &[String], root_pem: &str, expected: &Identity, at: UnixTime) -> Identity {
    assert_eq!(
        chain.last().map(String::as_str),
        Some(root_pem),
        "root last"
    );
    let roots = parse_certs(root_pem, "root").expect("root");
    let certs: Vec<_> = chain
        .iter()
        .flat_map(|p| parse_certs(p, "chain").expect("chain pem"))
        .collect();
    let verifier = SpiffeServerVerifier::new(
        root_store(&roots).expect("roots"),
        vec![expected.clone()],
        provider(),
    );
    let name = ServerName::try_from("10.0.0.1").expect("name");
    verifier
        .verify_server_cert(&certs[0], &certs[1..], &name, &[], at)
        .expect("chain verifies to the root and carries the expected identity");
    peer_identity(&certs[0]).expect("spiffe san")
}

fn in_future(secs: u64) -> UnixTime {
    let now = UnixTime::now().as_secs();
    UnixTime::since_unix_epoch(Duration::from_secs(now + secs))
}

#[tokio::test]
async fn issues_for_the_caller_and_for_workloads_on_the_callers_node() {
    let state = tempfile::tempdir().expect("tempdir");
    let ca = CertificateAuthority::self_signed(state.path(), CaOptions::default()).expect("ca");
    let server = serve(ca).await;
    let mut client = client(&server).await;

    let app = id("spiffe://cluster.local/ns/default/sa/app");
    let csr = generate_csr(&app).expect("csr");
    let resp = client
        .create_certificate(request(Some("app-token"), &csr.csr_pem, None, 3600))
        .await
        .expect("own identity issued")
        .into_inner();
    assert_eq!(resp.cert_chain.len(), 2, "leaf and self-signed root");
    assert_eq!(
        verify(&resp.cert_chain, &server.root_pem, &app, UnixTime::now()),
        app
    );
    // Requested one hour: valid in 50 minutes, expired in 2 hours.
    verify(&resp.cert_chain, &server.root_pem, &app, in_future(50 * 60));
    let roots = parse_certs(&server.root_pem, "root").expect("root");
    let verifier = SpiffeServerVerifier::new(
        root_store(&roots).expect("roots"),
        vec![app.clone()],
        provider(),
    );
    let leaf = parse_certs(&resp.cert_chain[0], "leaf").expect("leaf");
    let name = ServerName::try_from("10.0.0.1").expect("name");
    assert!(verifier
        .verify_server_cert(&leaf[0], &[], &name, &[], in_future(2 * 3600))
        .is_err());

    let page = id("spiffe://cluster.local/ns/default/sa/productpage");
    let csr = generate_csr(&page).expect("csr");
    let resp = client
        .create_certificate(request(
            Some("ztunnel-node1-token"),
            &csr.csr_pem,
            Some(&page.to_string()),
            0,
        ))
        .await
        .expect("impersonated identity issued")
        .into_inner();
    verify(
        &resp.cert_chain,
        &server.root_pem,
        &page,
        in_future(23 * 3600),
    );
    assert_eq!(server.stats.issued(), 2);
    server.task.abort();
}

fn write_plugged_ca(dir: &Path) -> (String, String) {
    let params = |cn: &str| {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, TD);
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        p
    };
    let root_key = KeyPair::generate().expect("key");
    let root_params = params("Test Root CA");
    let root = root_params.self_signed(&root_key).expect("root");
    let issuer = rcgen::Issuer::new(root_params, root_key);
    let int_key = KeyPair::generate().expect("key");
    let int = params("Test Intermediate CA")
        .signed_by(&int_key, &issuer)
        .expect("intermediate");
    std::fs::write(dir.join(CA_CERT_FILE), int.pem()).expect("write");
    std::fs::write(dir.join(CA_KEY_FILE), int_key.serialize_pem()).expect("write");
    std::fs::write(dir.join(ROOT_CERT_FILE), root.pem()).expect("write");
    std::fs::write(dir.join(CERT_CHAIN_FILE), int.pem() + &root.pem()).expect("write");
    (root.pem(), int.pem())
}

#[tokio::test]
async fn plugged_in_ca_chains_through_its_intermediate() {
    let cacerts = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let (root_pem, int_pem) = write_plugged_ca(cacerts.path());
    let ca = CertificateAuthority::load(Some(cacerts.path()), state.path(), CaOptions::default())
        .expect("plugged-in CA");
    let server = serve(ca).await;
    assert_eq!(server.root_pem, root_pem);
    let mut client = client(&server).await;
    let app = id("spiffe://cluster.local/ns/default/sa/app");
    let csr = generate_csr(&app).expect("csr");
    let chain = client
        .create_certificate(request(Some("app-token"), &csr.csr_pem, None, 0))
        .await
        .expect("issued")
        .into_inner()
        .cert_chain;
    assert_eq!(chain.len(), 3, "leaf, intermediate, root");
    assert_eq!(chain[1], int_pem);
    verify(&chain, &root_pem, &app, UnixTime::now());
    server.task.abort();
}

#[tokio::test]
async fn self_signed_root_is_reloaded_after_restart() {
    let state = tempfile::tempdir().expect("tempdir");
    let app = id("spiffe://cluster.local/ns/default/sa/app");
    let mut chains = Vec::new();
    let mut roots = Vec::new();
    for _ in 0..2 {
        let ca = CertificateAuthority::self_signed(state.path(), CaOptions::default()).expect("ca");
        let server = serve(ca).await;
        let mut client = client(&server).await;
        let csr = generate_csr(&app).expect("csr");
        let chain = client
            .create_certificate(request(Some("app-token"), &csr.csr_pem, None, 0))
            .await
            .expect("issued")
            .into_inner()
            .cert_chain;
        chains.push(chain);
        roots.push(server.root_pem.clone());
        server.task.abort();
    }
    assert_eq!(roots[0], roots[1], "same root after restart");
    // A certificate from before the restart still validates against the reloaded root.
    verify(&chains[0], &roots[1], &app, UnixTime::now());
    verify(&chains[1], &roots[0], &app, UnixTime::now());
}

struct Refusal {
    name: &'static str,
    token: Option<&'static str>,
    csr: String,
    impersonate: Option<&'static str>,
    code: Code,
    needles: &'static [&'static str],
}

fn refusals() -> Vec<Refusal> {
    let app = id("spiffe://cluster.local/ns/default/sa/app");
    let app_csr = generate_csr(&app).expect("csr").csr_pem;
    let reviews = "spiffe://cluster.local/ns/default/sa/reviews";
    let reviews_csr = generate_csr(&id(reviews)).expect("csr").csr_pem;
    let admin_csr = generate_csr(&id("spiffe://cluster.local/ns/kube-system/sa/admin"))
        .expect("csr")
        .csr_pem;
    let ed_key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519");
    let mut ed_params = CertificateParams::default();
    ed_params.subject_alt_names = vec![rcgen::SanType::URI(
        app.to_string().try_into().expect("ia5"),
    )];
    let ed_csr = ed_params
        .serialize_request(&ed_key)
        .expect("csr")
        .pem()
        .expect("pem");
    let r = |name, token, csr: &str, impersonate, code, needles| Refusal {
        name,
        token,
        csr: csr.to_string(),
        impersonate,
        code,
        needles,
    };
    vec![
        r(
            "missing token",
            None,
            &app_csr,
            None,
            Code::Unauthenticated,
            &["authorization"],
        ),
        r(
            "unknown token",
            Some("who-knows"),
            &app_csr,
            None,
            Code::Unauthenticated,
            &["unknown bearer token"],
        ),
        r(
            "expired token",
            Some("expired-token"),
            &app_csr,
            None,
            Code::Unauthenticated,
            &["expired", "sa/old"],
        ),
        r(
            "not on node",
            Some("ztunnel-node1-token"),
            &reviews_csr,
            Some(reviews),
            Code::PermissionDenied,
            &["sa/ztunnel", "node1", "sa/reviews"],
        ),
        r(
            "non-node impersonation",
            Some("app-token"),
            &reviews_csr,
            Some(reviews),
            Code::PermissionDenied,
            &["sa/app", "not a node agent", "sa/reviews"],
        ),
        r(
            "foreign trust domain",
            Some("ztunnel-node1-token"),
            &app_csr,
            Some("spiffe://evil.example/ns/default/sa/productpage"),
            Code::PermissionDenied,
            &["evil.example", "node1"],
        ),
        r(
            "foreign CSR SAN",
            Some("app-token"),
            &admin_csr,
            None,
            Code::PermissionDenied,
            &["sa/admin", "sa/app"],
        ),
        r(
            "Ed25519 CSR",
            Some("app-token"),
            &ed_csr,
            None,
            Code::InvalidArgument,
            &["Ed25519", "P-256"],
        ),
        r(
            "RSA-1024 CSR",
            Some("app-token"),
            RSA1024_CSR,
            None,
            Code::InvalidArgument,
            &["RSA 1024-bit"],
        ),
        r(
            "garbage CSR",
            Some("app-token"),
            "this is not a CSR",
            None,
            Code::InvalidArgument,
            &["CSR", "PEM"],
        ),
        r(
            "bad impersonation value",
            Some("ztunnel-node1-token"),
            &app_csr,
            Some("reviews"),
            Code::InvalidArgument,
            &["ImpersonatedIdentity", "spiffe://"],
        ),
    ]
}

#[tokio::test]
async fn refusals_name_the_problem_and_the_server_keeps_serving() {
    let state = tempfile::tempdir().expect("tempdir");
    let ca = CertificateAuthority::self_signed(state.path(), CaOptions::default()).expect("ca");
    let server = serve(ca).await;
    let mut client = client(&server).await;
    let cases = refusals();
    for case in &cases {
        let status = client
            .create_certificate(request(case.token, &case.csr, case.impersonate, 0))
            .await
            .expect_err(case.name);
        assert_eq!(
            status.code(),
            case.code,
            "{}: {}",
            case.name,
            status.message()
        );
        for needle in case.needles {
            assert!(
                status.message().contains(needle),
                "{}: {:?} lacks {needle:?}",
                case.name,
                status.message()
            );
        }
        assert!(
            !status.message().contains("-token"),
            "{}: token leaked",
            case.name
        );
        assert!(
            !status.message().contains(".yaml") && !status.message().contains("/tmp"),
            "{}: a server-side path leaked: {}",
            case.name,
            status.message()
        );
    }

    let mut wrong_cluster = request(
        Some("app-token"),
        &generate_csr(&id("spiffe://cluster.local/ns/default/sa/app"))
            .expect("csr")
            .csr_pem,
        None,
        0,
    );
    wrong_cluster
        .metadata_mut()
        .insert("clusterid", "other".parse().expect("header"));
    let status = client
        .create_certificate(wrong_cluster)
        .await
        .expect_err("cluster");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(status.message().contains("other") && status.message().contains("Kubernetes"));

    // Still serving, on the same connection.
    let app = id("spiffe://cluster.local/ns/default/sa/app");
    let csr = generate_csr(&app).expect("csr");
    let chain = client
        .create_certificate(request(Some("app-token"), &csr.csr_pem, None, 0))
        .await
        .expect("server keeps serving")
        .into_inner()
        .cert_chain;
    verify(&chain, &server.root_pem, &app, UnixTime::now());
    assert_eq!(server.stats.issued(), 1);
    assert_eq!(server.stats.refused_total(), cases.len() as u64 + 1);
    let refused = server.stats.refused();
    for reason in [
        "missing_authorization",
        "unknown_token",
        "expired_token",
        "impersonation_not_on_node",
        "impersonation_not_node_agent",
        "foreign_identity",
        "unsupported_key",
        "csr_not_pem",
        "cluster_mismatch",
    ] {
        assert!(
            refused.contains_key(reason),
            "{reason} missing from {refused:?}"
        );
    }
    server.task.abort();
}
