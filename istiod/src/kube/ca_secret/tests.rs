use super::*;
use mesh_testutil::kube_api::{core_types, FakeApiServer};

fn options() -> CaOptions {
    CaOptions {
        trust_domain: "cluster.local".to_string(),
        ..CaOptions::default()
    }
}

/// A fake API server with istiod's namespace.
async fn api() -> (FakeApiServer, Client) {
    let server = FakeApiServer::start(core_types())
        .await
        .expect("fake API server");
    let client = server.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = k8s_openapi::api::core::v1::Namespace {
        metadata: ObjectMeta {
            name: Some("istio-system".to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    (server, client)
}

fn root(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(CA_CERT_FILE)).expect("ca-cert.pem")
}

#[tokio::test]
async fn replicas_and_restarts_share_one_root_through_the_secret() {
    let (_api, client) = api().await;
    let first = tempfile::tempdir().expect("tempdir");
    let second = tempfile::tempdir().expect("tempdir");

    let outcome = sync(&client, "istio-system", first.path(), &options())
        .await
        .expect("first istiod stores its root");
    assert_eq!(outcome, Outcome::Created);
    let outcome = sync(&client, "istio-system", second.path(), &options())
        .await
        .expect("second istiod reads it");
    assert_eq!(outcome, Outcome::Loaded);
    assert_eq!(root(first.path()), root(second.path()));
    // The copy loads as a CA, key and all.
    CertificateAuthority::self_signed(second.path(), options()).expect("loads");

    let secrets: Api<Secret> = Api::namespaced(client, "istio-system");
    let stored = secrets.get(CA_SECRET).await.expect("the Secret");
    assert_eq!(stored.type_.as_deref(), Some(CA_SECRET_TYPE));
    let data = stored.data.expect("data");
    assert_eq!(data[CA_CERT_FILE].0, root(first.path()).into_bytes());
    for key in ["ca-key.pem", "cert-chain.pem", "key.pem", "root-cert.pem"] {
        assert!(data.contains_key(key), "{key}");
    }
}

#[tokio::test]
async fn a_secret_without_its_key_is_refused_by_name_and_the_directory_is_kept() {
    let (_api, client) = api().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "istio-system");
    let broken = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_string()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            CA_CERT_FILE.to_string(),
            ByteString(b"not a certificate".to_vec()),
        )])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &broken)
        .await
        .expect("create");
    let dir = tempfile::tempdir().expect("tempdir");
    let err = sync(&client, "istio-system", dir.path(), &options())
        .await
        .expect_err("no ca-key.pem");
    assert_eq!(
        err.to_string(),
        "Secret istio-system/istio-ca-secret has no ca-key.pem: add it, or delete the Secret to have istiod make a new root"
    );
    assert!(!dir.path().join(CA_KEY_FILE).exists());
}

#[tokio::test]
async fn a_secret_that_makes_no_ca_leaves_the_state_directory_alone() {
    let (_api, client) = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    CertificateAuthority::self_signed(dir.path(), options()).expect("a root of its own");
    let before = root(dir.path());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "istio-system");
    let garbage = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_string()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                CA_CERT_FILE.to_string(),
                ByteString(b"not a certificate".to_vec()),
            ),
            (CA_KEY_FILE.to_string(), ByteString(b"not a key".to_vec())),
        ])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &garbage)
        .await
        .expect("create");
    let err = sync(&client, "istio-system", dir.path(), &options())
        .await
        .expect_err("unusable");
    assert!(
        err.to_string()
            .starts_with("Secret istio-system/istio-ca-secret does not hold a usable CA"),
        "{err}"
    );
    assert_eq!(root(dir.path()), before);
}
