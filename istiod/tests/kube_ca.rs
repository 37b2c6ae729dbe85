//! The CA on Kubernetes: callers are authenticated by TokenReview against the (fake) API
//! server, and a node agent's node comes from the pod its bound token names. The full matrix:
//! a good token, the wrong audience, a user that is not a service account, and impersonation on
//! the same node, on another node, by an untrusted account and after the caller's pod is gone.

mod common;

use istiod::ca::IMPERSONATED_IDENTITY;
use istiod::server::Running;
use mesh_identity::{generate_csr, Identity};
use mesh_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use mesh_proto::ca::IstioCertificateRequest;
use mesh_testutil::kube_api::{core_types, FakeApiServer, FakeToken};
use mesh_testutil::{namespace_yaml, pod_yaml, PodSpec};
use serde_json::Value;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Code, Request};

struct Cluster {
    api: FakeApiServer,
    istiod: Running,
    _kubeconfig: tempfile::NamedTempFile,
    _state: tempfile::TempDir,
}

fn pod(ns: &str, name: &str, ip: &str, node: &str, sa: &str) -> Value {
    serde_yaml::from_str(&pod_yaml(&PodSpec {
        namespace: ns,
        name,
        ip,
        node,
        service_account: sa,
        labels: &[("app", sa)],
    }))
    .expect("pod yaml")
}

/// istiod on the fake API server with a ztunnel on node1, productpage on node1 and reviews on
/// node2, and a token for each (bound to its pod, audience istio-ca).
async fn cluster() -> Cluster {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = FakeApiServer::start(core_types())
        .await
        .expect("fake API server");
    for ns in ["istio-system", "default"] {
        api.seed(serde_yaml::from_str(&namespace_yaml(ns, &[])).expect("ns"))
            .expect("seed namespace");
    }
    let pods = [
        (
            "istio-system",
            "ztunnel-a",
            "10.244.1.2",
            "node1",
            "ztunnel",
        ),
        (
            "default",
            "productpage-1",
            "10.244.1.10",
            "node1",
            "productpage",
        ),
        ("default", "reviews-1", "10.244.2.10", "node2", "reviews"),
    ];
    for (ns, name, ip, node, sa) in pods {
        api.seed(pod(ns, name, ip, node, sa)).expect("seed pod");
        let uid = api.get("v1", "Pod", ns, name).expect("stored")["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string();
        api.add_token(
            &format!("{sa}-token"),
            FakeToken {
                namespace: ns.into(),
                service_account: sa.into(),
                audiences: vec!["istio-ca".into()],
                pod: Some((name.into(), uid)),
                user: None,
            },
        );
    }
    api.add_token(
        "other-audience-token",
        FakeToken {
            namespace: "default".into(),
            service_account: "productpage".into(),
            audiences: vec!["https://kubernetes.default.svc".into()],
            pod: None,
            user: None,
        },
    );
    api.add_token(
        "alice-token",
        FakeToken {
            namespace: String::new(),
            service_account: String::new(),
            audiences: vec!["istio-ca".into()],
            pod: None,
            user: Some("alice@example.com".into()),
        },
    );
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
    std::fs::write(kubeconfig.path(), api.kubeconfig()).expect("write kubeconfig");
    let state = tempfile::tempdir().expect("state");
    let flags = [
        format!("--kubeconfig={}", kubeconfig.path().display()),
        "--ca-trusted-node-accounts=istio-system/ztunnel".to_string(),
    ];
    let istiod = common::start_istiod(&flags, state.path()).await;
    Cluster {
        api,
        istiod,
        _kubeconfig: kubeconfig,
        _state: state,
    }
}

async fn ca_client(r: &Running) -> IstioCertificateServiceClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&r.root_cert_pem))
        .domain_name("istiod.istio-system.svc");
    let channel = Channel::from_shared(format!("https://{}", r.secure_grpc_addr))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect");
    IstioCertificateServiceClient::new(channel)
}

/// Asks for `identity` (impersonating it when `impersonate`) with `token`; the gRPC code, or
/// OK with the identity of the issued leaf.
async fn ask(
    client: &mut IstioCertificateServiceClient<Channel>,
    token: &str,
    identity: &str,
    impersonate: bool,
) -> Result<Identity, (Code, String)> {
    let id = Identity::parse(identity).expect("identity");
    let csr = generate_csr(&id).expect("csr");
    let metadata = impersonate.then(|| prost_types::Struct {
        fields: [(
            IMPERSONATED_IDENTITY.to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    });
    let mut req = Request::new(IstioCertificateRequest {
        csr: csr.csr_pem,
        validity_duration: 3600,
        metadata,
    });
    let value = format!("Bearer {token}").parse().expect("header");
    req.metadata_mut().insert("authorization", value);
    match client.create_certificate(req).await {
        Ok(resp) => {
            let chain = resp.into_inner().cert_chain;
            let leaf = mesh_identity::tls::parse_certs(&chain[0], "leaf").expect("leaf");
            Ok(mesh_identity::tls::peer_identity(&leaf[0]).expect("spiffe id"))
        }
        Err(status) => Err((status.code(), status.message().to_string())),
    }
}

const ZTUNNEL: &str = "spiffe://cluster.local/ns/istio-system/sa/ztunnel";
const PRODUCTPAGE: &str = "spiffe://cluster.local/ns/default/sa/productpage";
const REVIEWS: &str = "spiffe://cluster.local/ns/default/sa/reviews";

fn refused(r: Result<Identity, (Code, String)>, code: Code, needle: &str) {
    match r {
        Ok(id) => panic!("issued {id} where {code:?} ({needle}) was expected"),
        Err((got, message)) => {
            assert_eq!(got, code, "{message}");
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    }
}

#[tokio::test]
async fn token_review_authenticates_callers_and_the_pod_decides_the_node() {
    let c = cluster().await;
    let mut client = ca_client(&c.istiod).await;

    // A service account's own certificate.
    let own = ask(&mut client, "productpage-token", PRODUCTPAGE, false).await;
    assert_eq!(own.expect("own identity").to_string(), PRODUCTPAGE);
    let own = ask(&mut client, "ztunnel-token", ZTUNNEL, false).await;
    assert_eq!(own.expect("the node agent's own").to_string(), ZTUNNEL);
    // A CSR for somebody else, without impersonation, is refused.
    refused(
        ask(&mut client, "productpage-token", REVIEWS, false).await,
        Code::PermissionDenied,
        "the caller is authorised for spiffe://cluster.local/ns/default/sa/productpage",
    );

    // The TokenReview refuses: unknown token, wrong audience.
    refused(
        ask(&mut client, "forged", PRODUCTPAGE, false).await,
        Code::Unauthenticated,
        "rejected the token",
    );
    refused(
        ask(&mut client, "other-audience-token", PRODUCTPAGE, false).await,
        Code::Unauthenticated,
        "audiences",
    );
    // Authenticated, but a person rather than a service account.
    refused(
        ask(&mut client, "alice-token", PRODUCTPAGE, false).await,
        Code::Unauthenticated,
        "alice@example.com",
    );

    // The trusted node agent on node1 may have node1's workloads, not node2's.
    let page = ask(&mut client, "ztunnel-token", PRODUCTPAGE, true).await;
    assert_eq!(page.expect("same node").to_string(), PRODUCTPAGE);
    refused(
        ask(&mut client, "ztunnel-token", REVIEWS, true).await,
        Code::PermissionDenied,
        "no such workload runs on node node1",
    );
    // A workload is no node agent, even for a neighbour on its own node.
    refused(
        ask(&mut client, "reviews-token", PRODUCTPAGE, true).await,
        Code::PermissionDenied,
        "CA_TRUSTED_NODE_ACCOUNTS",
    );

    // The ztunnel pod moves to node2 under the same name (a new uid): the old token's pod is
    // gone, and the API server stops accepting the token.
    c.api
        .remove(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ztunnel-a", "namespace": "istio-system"}}))
        .expect("delete pod");
    c.api
        .seed(pod(
            "istio-system",
            "ztunnel-a",
            "10.244.2.2",
            "node2",
            "ztunnel",
        ))
        .expect("recreate pod");
    refused(
        ask(&mut client, "ztunnel-token", PRODUCTPAGE, true).await,
        Code::Unauthenticated,
        "no longer exists",
    );

    // Every refusal is counted by reason.
    let stats = metrics(&c.istiod).await;
    for reason in [
        "token_rejected",
        "not_service_account",
        "impersonation_not_on_node",
        "impersonation_not_node_agent",
    ] {
        assert!(
            stats.contains(reason),
            "{reason} missing from the CA metrics"
        );
    }
    // The caller's identity and the server kept serving throughout.
    let own = ask(&mut client, "reviews-token", REVIEWS, false).await;
    assert_eq!(own.expect("still serving").to_string(), REVIEWS);
}

/// The Prometheus text of istiod's monitoring port.
async fn metrics(r: &Running) -> String {
    common::http_get(r.monitoring_addr, "/metrics").await
}
