//! The validating webhook: AdmissionReview v1 round trips over TLS on istiod's webhook port
//! (verified against istiod's root, as the API server verifies with the caBundle), the
//! ValidatingWebhookConfiguration kept with the caBundle and Istio's failurePolicy rule, and a
//! plugged-in CA rotated under a running istiod.

use std::sync::Arc;
use std::time::Duration;

mod common;

use istiod::server::Running;
use mesh_testutil::kube_api::{core_types, FakeApiServer, ResourceType};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(10);

struct Cluster {
    api: FakeApiServer,
    istiod: Running,
    _files: (tempfile::NamedTempFile, tempfile::TempDir),
}

fn webhook_configuration() -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "istio-validator-istio-system", "labels": {"istio.io/rev": "default"}},
        "webhooks": [{"name": "rev.validation.istio.io",
            "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system", "path": "/validate"}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["networking.istio.io"],
                "apiVersions": ["*"], "resources": ["*"]}],
            "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"]}]})
}

/// istiod on a fake API server holding Istio's webhook configuration (and, with
/// `istio_gateway_crd`, the networking.istio.io Gateway CRD), started with `flags`.
async fn cluster(istio_gateway_crd: bool, flags: &[String]) -> Cluster {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut types = core_types();
    if istio_gateway_crd {
        types.push(ResourceType::custom(
            "networking.istio.io",
            "v1",
            "gateways",
            "Gateway",
            true,
        ));
    }
    let api = FakeApiServer::start(types).await.expect("fake API server");
    for ns in ["istio-system", "demo"] {
        api.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .expect("namespace");
    }
    api.seed(webhook_configuration())
        .expect("webhook configuration");
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
    std::fs::write(kubeconfig.path(), api.kubeconfig()).expect("write kubeconfig");
    let state = tempfile::tempdir().expect("state");
    let mut all = vec![format!("--kubeconfig={}", kubeconfig.path().display())];
    all.extend(flags.iter().cloned());
    let istiod = common::start_istiod(&all, state.path()).await;
    Cluster {
        api,
        istiod,
        _files: (kubeconfig, state),
    }
}

/// POSTs `body` to `path` over TLS, verifying istiod's certificate for istiod.istio-system.svc
/// against its root; returns the status code and the body.
async fn post(r: &Running, path: &str, body: &[u8]) -> (u16, String) {
    post_trusting(r, &r.root_cert_pem, path, body)
        .await
        .expect("TLS handshake")
}

/// The same, trusting only `roots_pem`; an error if the handshake fails.
async fn post_trusting(
    r: &Running,
    roots_pem: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(roots_pem.as_bytes()) {
        roots.add(cert.expect("root pem")).expect("root");
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(r.webhook_addr)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("istiod.istio-system.svc").expect("name");
    let mut tls = connector.connect(name, tcp).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: istiod.istio-system.svc\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    tls.write_all(body).await.expect("write body");
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

fn review(uid: &str, object: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "namespace": "shop", "name": "x",
            "kind": {"group": "networking.istio.io", "version": "v1", "kind": object["kind"]},
            "object": object}}),
    )
    .expect("json")
}

async fn eventually(what: &str, f: impl FnMut() -> bool) {
    assert!(
        mesh_testutil::eventually(WAIT, f).await,
        "timed out waiting for {what}"
    );
}

/// The first webhook of Istio's configuration, as stored.
fn webhook(api: &FakeApiServer) -> Value {
    api.get(
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "",
        "istio-validator-istio-system",
    )
    .map(|c| c["webhooks"][0].clone())
    .unwrap_or(Value::Null)
}

fn ca_bundle(api: &FakeApiServer) -> Value {
    webhook(api)["clientConfig"]["caBundle"].clone()
}

fn failure_policy(api: &FakeApiServer) -> Value {
    webhook(api)["failurePolicy"].clone()
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn admission_reviews_over_tls_allow_valid_and_deny_invalid_config() {
    let c = cluster(true, &[]).await;
    let valid = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "shop"},
        "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}});
    let (code, body) = post(&c.istiod, "/validate", &review("u1", valid)).await;
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "u1");
    assert_eq!(answer["response"]["allowed"], true);

    let invalid = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "shop"}, "spec": {"hosts": "reviews"}});
    let (code, body) = post(
        &c.istiod,
        "/validate/networking.istio.io/v1/virtualservices",
        &review("u2", invalid),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview");
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(message.contains("spec.hosts"), "{message}");

    let (code, body) = post(&c.istiod, "/validate", b"{\"kind\": \"Pod\"}").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("AdmissionReview"), "{body}");

    // The configuration gets the root as caBundle; the fake API server calls no webhooks, so
    // the dry-run invalid Gateway is not denied and validation stays fail-open.
    let bundle = base64(c.istiod.root_cert_pem.as_bytes());
    eventually("the caBundle", || ca_bundle(&c.api) == bundle.as_str()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(failure_policy(&c.api), "Ignore");
    assert!(
        c.api
            .get(
                "networking.istio.io/v1",
                "Gateway",
                "istio-system",
                "invalid-gateway"
            )
            .is_none(),
        "the probe is a dry run"
    );
    assert!(c.api.requests().iter().any(|r| r
        .starts_with("POST /apis/networking.istio.io/v1/namespaces/istio-system/gateways?")
        && r.contains("dryRun=All")));
}

#[tokio::test]
async fn without_the_gateway_crd_validation_turns_fail_closed() {
    let c = cluster(false, &[]).await;
    let bundle = base64(c.istiod.root_cert_pem.as_bytes());
    eventually("caBundle and Fail", || {
        ca_bundle(&c.api) == bundle.as_str() && failure_policy(&c.api) == "Fail"
    })
    .await;
}

/// A plugged-in CA directory whose signing CA is a fresh self-signed root, trusting
/// `extra_roots` besides it; returns its root.
fn plugged_in_ca(dir: &std::path::Path, extra_roots: &str) -> String {
    let made = tempfile::tempdir().expect("dir");
    let ca = mesh_identity::CertificateAuthority::self_signed(made.path(), Default::default())
        .expect("ca");
    let root = ca.root_cert_pem().to_string();
    let key = std::fs::read(made.path().join("ca-key.pem")).expect("key");
    // The kubelet swaps a mounted Secret's files all at once; write the key last so that the
    // files in between do not load.
    std::fs::write(dir.join("root-cert.pem"), format!("{root}{extra_roots}")).expect("write");
    std::fs::write(dir.join("ca-cert.pem"), &root).expect("write");
    std::fs::write(dir.join("ca-key.pem"), key).expect("write");
    root
}

fn root_configmap(api: &FakeApiServer) -> Value {
    api.get("v1", "ConfigMap", "demo", "istio-ca-root-cert")
        .map(|c| c["data"]["root-cert.pem"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_rotated_plugged_in_root_reaches_configmaps_webhooks_and_serving_certificates() {
    let cacerts = tempfile::tempdir().expect("cacerts");
    let old_root = plugged_in_ca(cacerts.path(), "");
    let c = cluster(
        false,
        &[
            format!("--cacerts-dir={}", cacerts.path().display()),
            "--cacerts-poll=100ms".into(),
        ],
    )
    .await;
    assert_eq!(c.istiod.root_cert_pem, old_root);
    eventually("the old root published", || {
        root_configmap(&c.api) == old_root.as_str()
            && ca_bundle(&c.api) == base64(old_root.as_bytes()).as_str()
    })
    .await;

    // A key that does not belong to the certificate: refused, counted, the old CA kept.
    let stranger = tempfile::tempdir().expect("dir");
    mesh_identity::CertificateAuthority::self_signed(stranger.path(), Default::default())
        .expect("ca");
    std::fs::copy(
        stranger.path().join("ca-key.pem"),
        cacerts.path().join("ca-key.pem"),
    )
    .expect("copy");
    let metrics_show_error = || async {
        common::http_get(c.istiod.monitoring_addr, "/metrics")
            .await
            .contains("istiod_cacerts_reloads_total{result=\"error\"} 1")
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while !metrics_show_error().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload error counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        root_configmap(&c.api),
        old_root.as_str(),
        "last good CA kept"
    );
    post_trusting(&c.istiod, &old_root, "/validate", b"{}")
        .await
        .expect("still served by the old CA");

    // The new root beside the old one: both published; istiod's own certificate now chains to
    // the new root alone.
    let new_root = plugged_in_ca(cacerts.path(), &old_root);
    let bundle = format!("{new_root}{old_root}");
    eventually("the new roots published", || {
        root_configmap(&c.api) == bundle.as_str()
            && ca_bundle(&c.api) == base64(bundle.as_bytes()).as_str()
    })
    .await;
    let root_file = c._files.1.path().join("root-cert.pem");
    assert_eq!(
        std::fs::read_to_string(root_file).expect("root file"),
        bundle
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while post_trusting(&c.istiod, &new_root, "/validate", b"{}")
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "serving certificate not re-issued by the new CA"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(common::http_get(c.istiod.monitoring_addr, "/metrics")
        .await
        .contains("istiod_cacerts_reloads_total{result=\"ok\"}"));
}

fn pod_review(uid: &str, pod: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "namespace": "shop",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": pod}}),
    )
    .expect("json")
}

#[tokio::test]
async fn the_injector_answers_pods_with_a_json_patch_over_tls() {
    let inject = tempfile::tempdir().expect("inject dir");
    std::fs::write(
        inject.path().join("values"),
        r#"{"global": {"hub": "registry.example/mesh", "tag": "9.9"}}"#,
    )
    .expect("values");
    std::fs::write(inject.path().join("config"), "policy: enabled\n").expect("config");
    let c = cluster(
        false,
        &[format!("--inject-dir={}", inject.path().display())],
    )
    .await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-7d9c6b5f4-", "labels": {"app": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web-7d9c6b5f4", "controller": true, "uid": "u"}]},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    let (code, body) = post(&c.istiod, "/inject", &pod_review("p1", pod.clone())).await;
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], "p1");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("patch"))
        .expect("base64");
    let ops: Vec<Value> = serde_json::from_slice(&patch).expect("JSON patch");
    let proxy = ops
        .iter()
        .find(|op| op["path"] == "/spec/containers/1")
        .map(|op| &op["value"])
        .expect("the proxy container is added");
    assert_eq!(proxy["name"], "istio-proxy");
    assert_eq!(proxy["image"], "registry.example/mesh/proxyv2:9.9");
    let owner = proxy["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "ISTIO_META_OWNER"))
        .map(|v| v["value"].clone());
    assert_eq!(
        owner,
        Some(json!(
            "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"
        ))
    );

    // Opted out: allowed as it is. Not injectable: denied with the reason.
    let mut opted_out = pod.clone();
    opted_out["metadata"]["labels"]["sidecar.istio.io/inject"] = json!("false");
    let (_, body) = post(
        &c.istiod,
        "/inject/cluster/Kubernetes",
        &pod_review("p2", opted_out),
    )
    .await;
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview");
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"]["patch"].is_null(), "{body}");
    let mut empty = pod;
    empty["spec"]["containers"] = json!([]);
    let (_, body) = post(&c.istiod, "/inject", &pod_review("p3", empty)).await;
    let answer: Value = serde_json::from_str(&body).expect("AdmissionReview");
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no containers")),
        "{body}"
    );
    let (code, _) = post(&c.istiod, "/inject", b"[]").await;
    assert_eq!(code, 400);

    // The injector's webhook configuration gets the root as its caBundle.
    c.api
        .seed(json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "istio-sidecar-injector", "labels": {"istio.io/rev": "default"}},
            "webhooks": [{"name": "namespace.sidecar-injector.istio.io",
                "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system", "path": "/inject"}},
                "admissionReviewVersions": ["v1"], "sideEffects": "None"}]}))
        .expect("injector configuration");
    let bundle = base64(c.istiod.root_cert_pem.as_bytes());
    eventually("the injector's caBundle", || {
        c.api
            .get(
                "admissionregistration.k8s.io/v1",
                "MutatingWebhookConfiguration",
                "",
                "istio-sidecar-injector",
            )
            .is_some_and(|m| m["webhooks"][0]["clientConfig"]["caBundle"] == bundle.as_str())
    })
    .await;
}
