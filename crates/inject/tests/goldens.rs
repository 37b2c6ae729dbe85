//! Injection goldens for Istio's common pod shapes: the whole injected Pod for one container,
//! several containers with named ports, a pod with its own init containers, every kind of
//! kubelet probe, the cni-node capture path, a pod's own annotations; and the pods the injector
//! refuses or skips, with the reason. `UPDATE_GOLDEN=1` rewrites the files (review the diff).

use std::path::PathBuf;

use mesh_inject::{decide, inject, Decision, InjectConfig, Workload};
use serde_json::{json, Value};

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.json"))
}

/// A Deployment's pod (owned by its ReplicaSet) in `shop` with `spec`.
fn pod(spec: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "web-7d9c6b5f4-abcde", "namespace": "shop",
            "labels": {"app": "web", "version": "v1", "pod-template-hash": "7d9c6b5f4"},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web-7d9c6b5f4", "uid": "u-1", "controller": true}],
        },
        "spec": spec,
    })
}

fn values(cni: bool) -> Value {
    json!({
        "global": {"hub": "registry.example/mesh", "tag": "1.0.0",
                   "proxy": {"resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}},
        "istio_cni": {"enabled": cni},
        "meshConfig": {"defaultConfig": {"discoveryAddress": "istiod.istio-system.svc:15012"}},
    })
}

fn check(name: &str, pod: &Value, cni: bool) {
    let cfg = InjectConfig::from_values(&values(cni));
    assert_eq!(
        decide(pod, "shop", &cfg),
        Decision::Inject,
        "{name} is injected"
    );
    let workload = Workload::of_pod(pod, "shop");
    let out = inject(pod, &workload, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = serde_json::to_string_pretty(&out).expect("json") + "\n";
    mesh_testutil::golden(&golden_path(name), &text);
    // Injecting the injected pod again gives the same pod.
    let again = inject(&out, &workload, &cfg).unwrap_or_else(|e| panic!("{name} again: {e}"));
    assert_eq!(again, out, "{name}: injection is idempotent");
}

#[test]
fn one_container() {
    let spec = json!({"serviceAccountName": "web",
        "containers": [{"name": "web", "image": "nginx:1.27",
            "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]});
    check("one-container", &pod(spec, json!({})), false);
}

#[test]
fn several_containers_with_named_ports() {
    let spec = json!({"serviceAccountName": "web", "containers": [
        {"name": "web", "image": "nginx:1.27",
         "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                   {"name": "grpc-admin", "containerPort": 9090, "protocol": "TCP"}]},
        {"name": "log-shipper", "image": "fluent-bit:3",
         "ports": [{"name": "metrics", "containerPort": 2020, "protocol": "TCP"}]},
    ]});
    check("several-containers", &pod(spec, json!({})), false);
}

#[test]
fn own_init_containers_stay_before_the_proxys_on_the_init_path() {
    let spec = json!({"serviceAccountName": "web",
        "initContainers": [{"name": "migrate", "image": "web-migrate:1"}],
        "containers": [{"name": "web", "image": "nginx:1.27"}]});
    check("init-containers", &pod(spec.clone(), json!({})), false);
    // With cni-node, istio-validation runs first.
    check("init-containers-cni", &pod(spec, json!({})), true);
}

#[test]
fn every_kind_of_probe_is_rewritten_through_the_agent() {
    let spec = json!({"serviceAccountName": "web", "containers": [{
        "name": "web", "image": "nginx:1.27",
        "ports": [{"name": "http", "containerPort": 8080}, {"name": "grpc", "containerPort": 9090}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": 8080}},
        "startupProbe": {"grpc": {"port": 9090, "service": "health"}},
    }]});
    check("probes", &pod(spec, json!({})), false);
}

#[test]
fn the_pods_annotations_tune_capture_and_the_proxy() {
    let spec = json!({"serviceAccountName": "web",
        "containers": [{"name": "web", "image": "nginx:1.27"}]});
    let annotations = json!({
        "traffic.sidecar.istio.io/excludeOutboundPorts": "5432,6379",
        "traffic.sidecar.istio.io/includeInboundPorts": "8080",
        "sidecar.istio.io/proxyCPU": "50m",
        "prometheus.io/scrape": "true", "prometheus.io/port": "9100",
    });
    check("annotations", &pod(spec, annotations), false);
}

#[test]
fn refused_and_skipped_pods_say_why() {
    let cfg = InjectConfig::from_values(&values(false));
    let host = pod(
        json!({"hostNetwork": true, "containers": [{"name": "agent", "image": "a"}]}),
        json!({}),
    );
    match decide(&host, "shop", &cfg) {
        Decision::Skip(why) => assert!(why.contains("host network"), "{why}"),
        other => panic!("a host-network pod is not injected: {other:?}"),
    }
    let opted_out = pod(
        json!({"containers": [{"name": "web", "image": "nginx"}]}),
        json!({"sidecar.istio.io/inject": "false"}),
    );
    assert!(matches!(
        decide(&opted_out, "shop", &cfg),
        Decision::Skip(_)
    ));
    let workload = Workload::of_pod(&host, "shop");
    for (what, bad) in [
        (
            "its own istio-proxy container",
            pod(
                json!({"containers": [{"name": "istio-proxy", "image": "x"}]}),
                json!({}),
            ),
        ),
        (
            "an invalid port list",
            pod(
                json!({"containers": [{"name": "web", "image": "nginx"}]}),
                json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "5432,http"}),
            ),
        ),
        ("no containers", pod(json!({"containers": []}), json!({}))),
    ] {
        let err = inject(&bad, &workload, &cfg).expect_err(what).to_string();
        assert!(!err.is_empty(), "{what}: a reason");
    }
}
