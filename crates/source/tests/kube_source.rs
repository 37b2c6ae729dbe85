//! `KubeSource` against the fake API server: initial sync, deltas, re-list after 410, a CRD
//! served late, bad objects, and the same objects as `DirectorySource` reads from files.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mesh_api::{Kind, Object, ObjectKey};
use mesh_source::{ClusterSource, KubeOptions, KubeSource, SourceEvent};
use mesh_testutil::kube_api::{core_types, mesh_crd_types, FakeApiServer};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec: {nodeName: node1, serviceAccountName: web, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.1.0.5, podIPs: [{ip: 10.1.0.5}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: shop, labels: {app: db}}
spec: {nodeName: node2, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.1.0.6}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.0.10, selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow, namespace: shop}
spec: {action: ALLOW, rules: [{from: [{source: {principals: ["cluster.local/ns/shop/sa/client"]}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: shop}
spec: {hosts: [web], http: [{route: [{destination: {host: web}}]}]}
"#;

fn documents() -> Vec<Value> {
    serde_yaml::Deserializer::from_str(MANIFESTS)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect()
}

async fn server(crds: bool) -> FakeApiServer {
    let mut types = core_types();
    if crds {
        types.extend(mesh_crd_types());
    }
    let s = FakeApiServer::start(types).await.expect("fake API server");
    // No bookmark may move a watcher past the compactions the tests make.
    s.set_bookmark_interval(Duration::from_secs(600));
    for d in documents() {
        if crds || !d["apiVersion"].as_str().unwrap_or("").contains('.') {
            s.seed(d).expect("seed");
        }
    }
    s
}

async fn start(server: &FakeApiServer, options: KubeOptions) -> mpsc::Receiver<SourceEvent> {
    let client = server.client();
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(Box::new(KubeSource::new(client, options)).run(tx));
    rx
}

async fn next(rx: &mut mpsc::Receiver<SourceEvent>) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event in time")
        .expect("source running")
}

/// Events until `Synced`: the objects applied and the problems reported.
async fn initial(
    rx: &mut mpsc::Receiver<SourceEvent>,
) -> (BTreeMap<ObjectKey, Arc<Object>>, Vec<String>) {
    let (mut objects, mut problems) = (BTreeMap::new(), Vec::new());
    loop {
        match next(rx).await {
            SourceEvent::Applied(o) => {
                objects.insert(o.key(), o);
            }
            SourceEvent::Invalid(e) => problems.push(e.to_string()),
            SourceEvent::Synced => return (objects, problems),
            SourceEvent::Deleted(k) => panic!("deleted {k} before sync"),
        }
    }
}

/// Nothing more arrives for a while.
async fn quiet(rx: &mut mpsc::Receiver<SourceEvent>) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(700), rx.recv()).await {
        seen.push(format!("{ev:?}"));
    }
    seen
}

fn options() -> KubeOptions {
    KubeOptions {
        crd_poll: Duration::from_millis(200),
        ..KubeOptions::default()
    }
}

#[tokio::test]
async fn syncs_once_then_sends_deltas_and_relists_without_noise() {
    let server = server(true).await;
    server
        .seed(json!({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": "bad", "namespace": "shop"},
                     "spec": {"ports": [{"port": "eighty"}]}}))
        .expect("seed bad");
    let mut rx = start(
        &server,
        KubeOptions {
            pod_field_selector: Some("spec.nodeName=node1".into()),
            ..options()
        },
    )
    .await;
    let (objects, problems) = initial(&mut rx).await;
    let keys: Vec<String> = objects.keys().map(ToString::to_string).collect();
    assert_eq!(
        keys,
        [
            "Namespace/shop",
            "Pod/shop/web-1",
            "Service/shop/web",
            "AuthorizationPolicy/shop/allow",
            "VirtualService/shop/web",
        ],
        "only node1's pods; the bad Service is reported, not applied"
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("Service shop/bad") && problems[0].contains("spec.ports[0].port"),
        "{problems:?}"
    );
    // A delta.
    server
        .seed(json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "web-2", "namespace": "shop", "labels": {"app": "web"}},
                     "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "x"}]}}))
        .expect("seed");
    assert!(matches!(next(&mut rx).await, SourceEvent::Applied(o) if o.key().name == "web-2"));
    // The API server goes away; meanwhile a Service is deleted, other changes happen and the
    // history is compacted past every watcher's version. Back up, every watcher lists again:
    // exactly that deletion comes out, nothing for the unchanged objects.
    server.set_available(false);
    server
        .remove(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"}}))
        .expect("remove");
    server
        .seed(json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "db-2", "namespace": "shop"},
                     "spec": {"nodeName": "node2", "containers": [{"name": "c", "image": "x"}]}}))
        .expect("seed node2 pod");
    server.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.set_available(true);
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, SourceEvent::Deleted(k) if k.to_string() == "Service/shop/web"),
        "{ev:?}"
    );
    let rest = quiet(&mut rx).await;
    assert!(
        rest.is_empty(),
        "no other events after the re-list: {rest:?}"
    );
    let relists = server
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch=true"))
        .count();
    assert!(
        relists >= 2,
        "services were listed again: {:?}",
        server.requests()
    );
}

#[tokio::test]
async fn kinds_whose_crd_is_missing_sync_empty_and_start_when_served() {
    let server = server(false).await;
    let mut rx = start(&server, options()).await;
    let (objects, _) = initial(&mut rx).await;
    assert!(objects
        .keys()
        .all(|k| !matches!(k.kind, Kind::VirtualService | Kind::AuthorizationPolicy)));
    for t in mesh_crd_types() {
        server.add_type(t);
    }
    server
        .seed(
            documents()
                .into_iter()
                .find(|d| d["kind"] == "VirtualService")
                .expect("vs"),
        )
        .expect("seed vs");
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, SourceEvent::Applied(o) if o.key().to_string() == "VirtualService/shop/web"),
        "{ev:?}"
    );
}

#[tokio::test]
async fn the_api_yields_the_objects_the_directory_source_reads() {
    let server = server(true).await;
    let mut rx = start(&server, options()).await;
    let (from_api, problems) = initial(&mut rx).await;
    assert!(problems.is_empty(), "{problems:?}");
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("all.yaml"), MANIFESTS).expect("write");
    let (from_files, errors) = mesh_source::load_directory(dir.path());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(from_api.len(), from_files.len());
    for (_, file_obj) in from_files {
        let key = file_obj.key();
        let api_obj = from_api
            .get(&key)
            .unwrap_or_else(|| panic!("{key} from the API"));
        // The server's own fields aside, the objects are the same.
        let mut normalized = (**api_obj).clone();
        let m = normalized.metadata_mut();
        m.uid = None;
        m.resource_version = None;
        m.creation_timestamp = None;
        m.generation = None;
        assert_eq!(normalized, *file_obj, "{key}");
    }
}
