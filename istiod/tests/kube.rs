//! istiod reading the Kubernetes API (the fake API server from mesh-testutil, through a
//! kubeconfig) serves exactly what it serves from a YAML directory holding the same objects,
//! and follows the API's changes.

use std::time::Duration;

mod common;

use istiod::server::Running;
use mesh_testutil::kube_api::{core_types, mesh_crd_types, FakeApiServer};
use mesh_testutil::{namespace_yaml, pod_yaml, service_yaml, ClusterDir, PodSpec};
use mesh_xds::XdsSnapshot;
use serde_json::Value;

const TOKENS: &str = "tokens:\n- token: node1-token\n  identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel\n  node: node1\n";
const WAIT: Duration = Duration::from_secs(10);

fn manifests() -> Vec<String> {
    let pod = |name: &str, ip: &str, node: &str, app: &str| {
        pod_yaml(&PodSpec {
            namespace: "demo",
            name,
            ip,
            node,
            service_account: app,
            labels: &[("app", app)],
        })
    };
    vec![
        namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
        service_yaml("demo", "server", "10.96.0.10", "server"),
        pod("server-1", "10.244.1.10", "node1", "server"),
        pod("server-2", "10.244.2.10", "node2", "server"),
        pod("client", "10.244.1.11", "node1", "client"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: db\n  namespace: demo\nspec:\n  clusterIP: 10.96.0.40\n  ports:\n  - name: pg\n    port: 5432\n".to_string(),
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: db-manual\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: db\naddressType: IPv4\nports:\n- name: pg\n  port: 5432\n  protocol: TCP\nendpoints:\n- addresses: [192.168.9.1]\n".to_string(),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node1\n  labels:\n    topology.kubernetes.io/region: eu-west1\n    topology.kubernetes.io/zone: eu-west1-b\n".to_string(),
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow-client\n  namespace: demo\nspec:\n  selector:\n    matchLabels: {app: server}\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/client\"]\n".to_string(),
    ]
}

async fn start(
    source: &str,
    state: &tempfile::TempDir,
    tokens: &tempfile::NamedTempFile,
) -> Running {
    start_named(source, state, tokens, "istiod-0").await
}

async fn start_named(
    source: &str,
    state: &tempfile::TempDir,
    tokens: &tempfile::NamedTempFile,
    pod_name: &str,
) -> Running {
    let flags = [
        source.to_string(),
        format!("--tokens-file={}", tokens.path().display()),
        format!("--pod-name={pod_name}"),
    ];
    common::start_istiod(&flags, state.path()).await
}

/// Name -> encoded body of every address and authorization resource.
fn served(r: &Running) -> Vec<(String, Vec<u8>)> {
    let s = r.snapshots.borrow().clone();
    s.addresses()
        .iter()
        .chain(s.authorizations().iter())
        .map(|(name, res)| (name.clone(), res.body.value.clone()))
        .collect()
}

#[tokio::test]
async fn the_api_source_serves_what_the_directory_source_serves() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tokens = tempfile::NamedTempFile::new().expect("tokens");
    std::fs::write(tokens.path(), TOKENS).expect("write tokens");

    let dir = ClusterDir::new();
    for (i, m) in manifests().iter().enumerate() {
        dir.write(&format!("{i}.yaml"), m);
    }
    let state_a = tempfile::tempdir().expect("state");
    let from_dir = start(
        &format!("--config-dir={}", dir.path().display()),
        &state_a,
        &tokens,
    )
    .await;

    let mut types = core_types();
    types.extend(mesh_crd_types());
    let api = FakeApiServer::start(types).await.expect("fake API server");
    for m in manifests() {
        let v: Value = serde_yaml::from_str(&m).expect("yaml");
        api.seed(v).expect("seed");
    }
    // istiod's own namespace, where it keeps the CA Secret (it holds no workloads).
    api.seed(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))
        .expect("seed istio-system");
    let (source, _kubeconfig) = kubeconfig_flag(&api);
    let state_b = tempfile::tempdir().expect("state");
    let from_api = start(&source, &state_b, &tokens).await;

    let (a, b) = (served(&from_dir), served(&from_api));
    assert!(!a.is_empty());
    assert_eq!(
        a.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        b.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    assert_eq!(a, b, "same resources, byte for byte");
    assert!(
        b.iter()
            .any(|(n, _)| n
                == "Kubernetes/discovery.k8s.io/EndpointSlice/demo/db-manual/192.168.9.1"),
        "the hand-made endpoint is a workload"
    );
    let zone = b"eu-west1-b";
    assert!(
        b.iter().any(
            |(n, body)| n.ends_with("/server-1") && body.windows(zone.len()).any(|w| w == zone)
        ),
        "node1's zone is its pods' locality: {:?}",
        b.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );

    // A change through the API reaches the snapshot.
    let mut snaps = from_api.snapshots.clone();
    api.remove(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "server-2", "namespace": "demo"}}))
        .expect("remove");
    let gone = tokio::time::timeout(
        WAIT,
        snaps.wait_for(|s| !s.addresses().contains_key("Kubernetes//Pod/demo/server-2")),
    )
    .await;
    assert!(gone.is_ok(), "the deleted pod leaves WDS");

    // A compacted history and dropped watches force a re-list (410 Gone) of the kinds whose
    // last resource version is gone (the Namespaces): counted, and it changes nothing.
    let version = from_api.snapshots.borrow().version();
    api.compact();
    api.drop_watches();
    let metric = |text: &str, series: &str| {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let relisted = mesh_testutil::eventually_async(WAIT, || async {
        let text = common::http_get(from_api.monitoring_addr, "/metrics").await;
        metric(&text, "istiod_kube_relists_total{kind=\"Namespace\"}") >= 2
    })
    .await;
    let text = common::http_get(from_api.monitoring_addr, "/metrics").await;
    let kube_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("kube") || l.contains("k8s"))
        .collect();
    assert!(
        relisted,
        "the Namespace watcher listed again: {kube_lines:#?}"
    );
    let text = common::http_get(from_api.monitoring_addr, "/metrics").await;
    assert_eq!(
        metric(
            &text,
            "pilot_k8s_reg_events_total{type=\"Pod\",event=\"delete\"}"
        ),
        1,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "pilot_k8s_reg_events_total{type=\"Pod\",event=\"add\"}"
        ),
        3
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        from_api.snapshots.borrow().version(),
        version,
        "nothing changed"
    );
}

/// `--kubeconfig=<file>` for `api`, and the file (kept while the flag is used).
fn kubeconfig_flag(api: &FakeApiServer) -> (String, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().expect("kubeconfig");
    std::fs::write(file.path(), api.kubeconfig()).expect("write kubeconfig");
    (format!("--kubeconfig={}", file.path().display()), file)
}

/// Polls `f` until it holds (10 s).
async fn eventually(f: impl FnMut() -> bool) -> bool {
    mesh_testutil::eventually(WAIT, f).await
}

/// A fake API server with the core types, the mesh's CRDs and `namespaces`, and the tokens
/// file.
async fn api_with_namespaces(namespaces: &[&str]) -> (FakeApiServer, tempfile::NamedTempFile) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tokens = tempfile::NamedTempFile::new().expect("tokens");
    std::fs::write(tokens.path(), TOKENS).expect("write tokens");
    let mut types = core_types();
    types.extend(mesh_crd_types());
    let api = FakeApiServer::start(types).await.expect("fake API server");
    for ns in namespaces {
        api.seed(
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .expect("namespace");
    }
    (api, tokens)
}

#[tokio::test]
async fn the_root_certificate_is_kept_in_every_namespace() {
    let (api, tokens) =
        api_with_namespaces(&["istio-system", "kube-system", "kube-public", "demo"]).await;
    let (source, _kubeconfig) = kubeconfig_flag(&api);
    let state = tempfile::tempdir().expect("state");
    let _istiod = start(&source, &state, &tokens).await;
    let root = std::fs::read_to_string(state.path().join("root-cert.pem")).expect("root");
    let holds_root = |ns: &str| {
        api.get("v1", "ConfigMap", ns, "istio-ca-root-cert")
            .is_some_and(|cm| {
                cm["data"]["root-cert.pem"].as_str() == Some(root.as_str())
                    && cm["metadata"]["labels"]["istio.io/config"] == "true"
            })
    };
    assert!(eventually(|| holds_root("kube-system") && holds_root("demo")).await);
    assert!(api
        .get("v1", "ConfigMap", "kube-public", "istio-ca-root-cert")
        .is_none());
    // Deleted or edited: put back. A new namespace: written.
    api.remove(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio-ca-root-cert", "namespace": "demo"}}))
        .expect("remove");
    api.seed(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio-ca-root-cert", "namespace": "kube-system"},
        "data": {"root-cert.pem": "stale"}}))
        .expect("edit");
    api.seed(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}}),
    )
    .expect("namespace");
    assert!(
        eventually(|| holds_root("demo") && holds_root("kube-system") && holds_root("late")).await,
        "repaired and created"
    );
}

/// The holder of the namespace controller's ConfigMap lock.
fn lock_holder(api: &FakeApiServer) -> Option<String> {
    let cm = api.get(
        "v1",
        "ConfigMap",
        "istio-system",
        "istio-namespace-controller-election",
    )?;
    let raw = cm["metadata"]["annotations"]["control-plane.alpha.kubernetes.io/leader"].as_str()?;
    let record: Value = serde_json::from_str(raw).ok()?;
    record["holderIdentity"].as_str().map(str::to_string)
}

#[tokio::test]
async fn two_istiods_one_writes_and_the_other_takes_over() {
    let (api, tokens) = api_with_namespaces(&["istio-system", "demo"]).await;
    let (source, _kubeconfig) = kubeconfig_flag(&api);
    // Both replicas share one CA, as the istio-ca-secret makes them in a cluster.
    let state = tempfile::tempdir().expect("state");
    let a = start_named(&source, &state, &tokens, "istiod-a").await;
    assert!(eventually(|| lock_holder(&api).as_deref() == Some("istiod-a")).await);
    let b = start_named(&source, &state, &tokens, "istiod-b").await;
    let root = std::fs::read_to_string(state.path().join("root-cert.pem")).expect("root");
    let holds_root = |ns: &str| {
        api.get("v1", "ConfigMap", ns, "istio-ca-root-cert")
            .is_some_and(|cm| cm["data"]["root-cert.pem"].as_str() == Some(root.as_str()))
    };
    assert!(eventually(|| holds_root("demo")).await);
    // Only the leader writes: the ConfigMap carries a's writes, and b never holds the lock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lock_holder(&api).as_deref(), Some("istiod-a"));

    // a stops: it releases the lock, b takes it at its next try (Istio's retry period, 7.5 s
    // plus jitter) and repairs what a no longer does.
    a.shutdown().await.expect("a stops");
    assert!(
        mesh_testutil::eventually(Duration::from_secs(20), || lock_holder(&api).as_deref()
            == Some("istiod-b"))
        .await,
        "b leads after a stopped"
    );
    api.remove(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio-ca-root-cert", "namespace": "demo"}}))
        .expect("remove");
    assert!(eventually(|| holds_root("demo")).await, "b repairs");
    b.shutdown().await.expect("b stops");
    assert_eq!(lock_holder(&api).as_deref(), Some(""), "released on stop");
}

/// The `type` -> (status, reason, message) of an object's stored conditions.
fn stored_conditions(
    api: &FakeApiServer,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Vec<(String, String, String, String)> {
    let obj = api
        .get(api_version, kind, "demo", name)
        .unwrap_or(Value::Null);
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("status"), s("reason"), s("message"))
        })
        .collect()
}

#[tokio::test]
async fn status_conditions_are_applied_with_istios_field_managers() {
    let (api, tokens) = api_with_namespaces(&["istio-system", "demo"]).await;
    for doc in [
        serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "waypoint", "namespace": "demo"},
            "spec": {"gatewayClassName": "istio-waypoint",
                     "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
            "status": {"addresses": [{"type": "Hostname", "value": "waypoint.demo.svc.cluster.local"}]}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "reviews", "namespace": "demo", "labels": {"istio.io/use-waypoint": "waypoint"}},
            "spec": {"selector": {"app": "reviews"}, "clusterIP": "10.96.0.30", "ports": [{"name": "http", "port": 80}]},
            "status": {"conditions": [{"type": "example.com/Other", "status": "True", "reason": "Mine", "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}),
        serde_json::json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "l4", "namespace": "demo"},
            "spec": {"action": "ALLOW", "rules": [{"from": [{"source": {"namespaces": ["demo"]}}]}]}}),
        serde_json::json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "l7", "namespace": "demo"},
            "spec": {"targetRefs": [{"kind": "Service", "group": "", "name": "reviews"}],
                     "action": "ALLOW", "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}}),
    ] {
        api.seed(doc).expect("seed");
    }
    let (source, _kubeconfig) = kubeconfig_flag(&api);
    let state = tempfile::tempdir().expect("state");
    let istiod = start(&source, &state, &tokens).await;
    let bound = (
        "istio.io/WaypointBound".to_string(),
        "True".to_string(),
        "WaypointAccepted".to_string(),
        "Successfully attached to waypoint demo/waypoint".to_string(),
    );
    assert!(
        eventually(|| {
            stored_conditions(&api, "v1", "Service", "reviews").contains(&bound)
                && stored_conditions(&api, "security.istio.io/v1", "AuthorizationPolicy", "l4")
                    .first()
                    .is_some_and(|c| c.0 == "ZtunnelAccepted" && c.2 == "Accepted")
                && stored_conditions(&api, "security.istio.io/v1", "AuthorizationPolicy", "l7")
                    .first()
                    .is_some_and(|c| c.0 == "WaypointAccepted" && c.3 == "bound to demo/waypoint")
        })
        .await,
        "conditions written: {:?} {:?} {:?}",
        stored_conditions(&api, "v1", "Service", "reviews"),
        stored_conditions(&api, "security.istio.io/v1", "AuthorizationPolicy", "l4"),
        stored_conditions(&api, "security.istio.io/v1", "AuthorizationPolicy", "l7")
    );
    let lease = api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "istio-system",
            "istio-status-leader",
        )
        .expect("the status Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "istiod-0");
    let applies = |path: &str, manager: &str| {
        api.requests().iter().any(|r| {
            r.starts_with(&format!("PATCH {path}?"))
                && r.contains(&format!("fieldManager={manager}"))
                && r.contains("force=true")
        })
    };
    assert!(applies(
        "/api/v1/namespaces/demo/services/reviews/status",
        "istio-ambient-service"
    ));
    assert!(applies(
        "/apis/security.istio.io/v1/namespaces/demo/authorizationpolicies/l4/status",
        "istio-ambient-ztunnel-policy"
    ));
    assert!(applies(
        "/apis/security.istio.io/v1/namespaces/demo/authorizationpolicies/l7/status",
        "istio-ambient-waypoint-policy"
    ));

    // Unchanged conditions are not written again.
    let status_writes = || {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("PATCH") && r.contains("/status?"))
            .count()
    };
    let before = status_writes();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        status_writes(),
        before,
        "no rewrites of unchanged conditions"
    );

    // The Service leaves the waypoint: istiod's condition is cleared, another controller's
    // stays; the policy that targets the Service now reports that it is not bound.
    let mut service = api
        .get("v1", "Service", "demo", "reviews")
        .expect("service");
    service["metadata"]["labels"] = serde_json::json!({});
    api.seed(service).expect("relabel");
    assert!(
        eventually(|| {
            stored_conditions(&api, "v1", "Service", "reviews")
                .iter()
                .map(|c| c.0.as_str())
                .collect::<Vec<_>>()
                == ["example.com/Other"]
                && stored_conditions(&api, "security.istio.io/v1", "AuthorizationPolicy", "l7")
                    .first()
                    .is_some_and(|c| c.1 == "False" && c.2 == "AncestorNotBound")
        })
        .await,
        "cleared and re-reported"
    );
    let metrics = common::http_get(istiod.monitoring_addr, "/metrics").await;
    assert!(
        metrics.contains("istiod_status_writes_total{kind=\"Service\",result=\"ok\"} 2"),
        "{metrics}"
    );
}

/// The scope of the served Authorization `ns/name`, if served.
fn policy_scope(r: &Running, key: &str) -> Option<i32> {
    use prost::Message;
    let s = r.snapshots.borrow().clone();
    let res = s.authorizations().get(key)?;
    mesh_proto::security::Authorization::decode(res.body.value.as_slice())
        .ok()
        .map(|a| a.scope)
}

#[tokio::test]
async fn the_mesh_config_configmap_sets_the_trust_domain_and_the_root_namespace() {
    use mesh_proto::security::Scope;
    let (api, tokens) = api_with_namespaces(&["istio-system", "mesh-root", "demo"]).await;
    let mesh = |root: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": format!("trustDomain: example.org\nrootNamespace: {root}\ndefaultConfig:\n  discoveryAddress: istiod.istio-system.svc:15012\n")}})
    };
    api.seed(mesh("mesh-root")).expect("mesh config");
    let pod: Value = serde_yaml::from_str(&pod_yaml(&PodSpec {
        namespace: "demo",
        name: "app",
        ip: "10.244.1.20",
        node: "node1",
        service_account: "app",
        labels: &[],
    }))
    .expect("pod");
    api.seed(pod).expect("pod");
    api.seed(serde_json::json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-nothing", "namespace": "mesh-root"},
        "spec": {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["nowhere"]}}]}]}}))
        .expect("policy");
    let (source, _kubeconfig) = kubeconfig_flag(&api);
    let state = tempfile::tempdir().expect("state");
    let istiod = start(&source, &state, &tokens).await;
    // The trust domain at start: workloads carry it.
    let td = b"example.org";
    assert!(
        served(&istiod)
            .iter()
            .any(|(n, body)| n.ends_with("/app") && body.windows(td.len()).any(|w| w == td)),
        "the workload's trust domain is the mesh config's"
    );
    assert_eq!(
        policy_scope(&istiod, "mesh-root/deny-nothing"),
        Some(Scope::Global as i32),
        "a selector-less policy in the mesh config's root namespace is mesh-wide"
    );

    // The root namespace changes at runtime: the policy is now only its namespace's.
    api.seed(mesh("istio-system")).expect("mesh config");
    assert!(
        eventually(
            || policy_scope(&istiod, "mesh-root/deny-nothing") == Some(Scope::Namespace as i32)
        )
        .await,
        "re-scoped without a restart"
    );
    // A mesh that does not parse changes nothing.
    api.seed(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "istio", "namespace": "istio-system"},
        "data": {"mesh": "rootNamespace: [mesh-root]\n"}}))
        .expect("bad mesh config");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        policy_scope(&istiod, "mesh-root/deny-nothing"),
        Some(Scope::Namespace as i32)
    );
}
