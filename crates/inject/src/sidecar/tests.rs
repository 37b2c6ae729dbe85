use super::*;
use crate::{decide, patch, Decision, Policy};

fn pod() -> Value {
    json!({
        "metadata": {"name": "web-7d9c6b5f4-abcde", "namespace": "shop",
            "labels": {"app": "web", "version": "v2"},
            "annotations": {"prometheus.io/port": "9100"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web-7d9c6b5f4", "controller": true, "uid": "u"}]},
        "spec": {
            "serviceAccountName": "web",
            "containers": [{"name": "web", "image": "nginx",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}}}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    })
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .map_or(&Value::Null, |v| &v["value"])
}

#[test]
fn a_pod_gets_the_proxy_init_step_volumes_labels_and_status() {
    let cfg = InjectConfig::from_values(
        &json!({"global": {"hub": "registry.example/mesh", "tag": "1.0"}}),
    );
    let workload = Workload::of_pod(&pod(), "shop");
    assert_eq!(workload.name, "web");
    assert_eq!(
        workload.owner,
        "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"
    );
    let out = inject(&pod(), &workload, &cfg).expect("inject");
    let containers = out["spec"]["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2);
    let proxy = &containers[1];
    assert_eq!(proxy["name"], "istio-proxy");
    assert_eq!(proxy["image"], "registry.example/mesh/proxyv2:1.0");
    assert_eq!(proxy["args"][0], "proxy");
    assert_eq!(proxy["args"][1], "sidecar");
    assert_eq!(proxy["args"][3], "$(POD_NAMESPACE).svc.cluster.local");
    assert_eq!(proxy["securityContext"]["runAsUser"], 1337);
    assert_eq!(env(proxy, "CA_ADDR"), "istiod.istio-system.svc:15012");
    assert_eq!(env(proxy, "ISTIO_META_APP_CONTAINERS"), "web");
    assert_eq!(env(proxy, "ISTIO_META_WORKLOAD_NAME"), "web");
    assert_eq!(
        env(proxy, "ISTIO_KUBE_APP_PROBERS"),
        r#"{"/app-health/web/readyz":{"httpGet":{"path":"/ready","port":8080}}}"#
    );
    assert_eq!(
        env(proxy, "ISTIO_PROMETHEUS_ANNOTATIONS"),
        r#"{"port":"9100"}"#
    );
    assert_eq!(
        containers[0]["readinessProbe"]["httpGet"],
        json!({"path": "/app-health/web/readyz", "port": 15020, "scheme": "HTTP"})
    );
    let init = &out["spec"]["initContainers"][0];
    assert_eq!(init["name"], "istio-init");
    assert_eq!(
        init["args"],
        json!([
            "istio-iptables",
            "-p",
            "15001",
            "-z",
            "15006",
            "-u",
            "1337",
            "-m",
            "REDIRECT",
            "-i",
            "*",
            "-x",
            "",
            "-b",
            "*",
            "-d",
            "15090,15021,15020",
            "--log_output_level=default:info"
        ])
    );
    assert_eq!(
        init["securityContext"]["capabilities"]["add"],
        json!(["NET_ADMIN", "NET_RAW"])
    );
    let volumes: Vec<&str> = out["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(volumes[0], "data");
    assert!(volumes.contains(&"istio-token") && volumes.contains(&"istiod-ca-cert"));
    let status: Value = serde_json::from_str(
        out["metadata"]["annotations"]["sidecar.istio.io/status"]
            .as_str()
            .expect("status"),
    )
    .expect("json");
    assert_eq!(status["containers"], json!(["istio-proxy"]));
    assert_eq!(status["initContainers"], json!(["istio-init"]));
    assert_eq!(status["revision"], "default");
    assert_eq!(status["volumes"].as_array().map(Vec::len), Some(8));
    let a = &out["metadata"]["annotations"];
    assert_eq!(a["kubectl.kubernetes.io/default-container"], "web");
    assert_eq!(a["prometheus.io/port"], "15020");
    assert_eq!(a["prometheus.io/path"], "/stats/prometheus");
    let l = &out["metadata"]["labels"];
    assert_eq!(l["security.istio.io/tlsMode"], "istio");
    assert_eq!(l["service.istio.io/canonical-name"], "web");
    assert_eq!(l["service.istio.io/canonical-revision"], "v2");
}

#[test]
fn injecting_twice_is_injecting_once_and_the_patch_replays() {
    let cfg = InjectConfig::default();
    let workload = Workload::of_pod(&pod(), "shop");
    let once = inject(&pod(), &workload, &cfg).expect("once");
    let twice = inject(&once, &workload, &cfg).expect("twice");
    assert_eq!(once["spec"], twice["spec"]);
    let ops = patch(&pod(), &once);
    let ops: json_patch::Patch = serde_json::from_value(ops).expect("a JSON patch");
    let mut replayed = pod();
    json_patch::patch(&mut replayed, &ops).expect("applies");
    assert_eq!(replayed, once);
}

#[test]
fn with_cni_the_init_step_only_validates_and_annotations_tune_capture() {
    let cfg = InjectConfig::from_values(
        &json!({"pilot": {"cni": {"enabled": true}}, "revision": "canary"}),
    );
    let mut p = pod();
    p["metadata"]["annotations"] = json!({
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/8",
        "traffic.sidecar.istio.io/excludeInboundPorts": "9000",
        "traffic.sidecar.istio.io/excludeOutboundPorts": "5432",
        "prometheus.io/scrape": "false",
        "sidecar.istio.io/rewriteAppHTTPProbers": "false",
    });
    let out = inject(&p, &Workload::of_pod(&p, "shop"), &cfg).expect("inject");
    let init = &out["spec"]["initContainers"][0];
    assert_eq!(init["name"], "istio-validation");
    let args: Vec<&str> = init["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["-x", "10.0.0.0/8"]),
        "{args:?}"
    );
    assert!(
        args.windows(2)
            .any(|w| w == ["-d", "9000,15090,15021,15020"]),
        "{args:?}"
    );
    assert!(args.windows(2).any(|w| w == ["-o", "5432"]), "{args:?}");
    assert!(args.ends_with(&["--run-validation", "--skip-rule-apply"]));
    assert_eq!(init["securityContext"]["runAsUser"], 1337);
    assert_eq!(
        out["metadata"]["annotations"]["prometheus.io/scrape"],
        "false"
    );
    assert_eq!(
        out["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
        "http"
    );
    let proxy = &out["spec"]["containers"][1];
    assert_eq!(
        env(proxy, "CA_ADDR"),
        "istiod-canary.istio-system.svc:15012"
    );
    assert_eq!(out["metadata"]["annotations"]["istio.io/rev"], "canary");
}

#[test]
fn the_pods_proxy_config_and_resource_annotations_apply_to_it_alone() {
    let cfg = InjectConfig::from_values(&json!({
        "meshConfig": {"defaultConfig": {"discoveryAddress": "istiod.istio-system.svc:15012", "proxyMetadata": {"A": "1"}}}
    }));
    let w = Workload::new("shop", "Pod", "v1", "x");
    let mut p = pod();
    p["metadata"]["annotations"] = json!({
        "proxy.istio.io/config": "holdApplicationUntilProxyStarts: true\nproxyMetadata:\n  B: \"2\"\n",
        "sidecar.istio.io/proxyCPU": "50m",
        "sidecar.istio.io/proxyMemoryLimit": "256Mi",
    });
    let out = inject(&p, &w, &cfg).expect("injected");
    let proxy = &out["spec"]["containers"][0];
    assert_eq!(proxy["name"], "istio-proxy", "held: the proxy comes first");
    assert_eq!(
        proxy["lifecycle"]["postStart"]["exec"]["command"],
        json!(["pilot-agent", "wait"])
    );
    let env = |name: &str| {
        proxy["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .map(|v| v["value"].clone())
    };
    let proxy_config: Value = serde_json::from_str(
        env("PROXY_CONFIG")
            .and_then(|v| v.as_str().map(String::from))
            .as_deref()
            .unwrap_or("{}"),
    )
    .expect("json");
    assert_eq!(
        proxy_config["discoveryAddress"],
        "istiod.istio-system.svc:15012"
    );
    assert_eq!(proxy_config["proxyMetadata"], json!({"A": "1", "B": "2"}));
    assert_eq!(
        proxy["resources"],
        json!({"requests": {"cpu": "50m"}, "limits": {"memory": "256Mi"}})
    );
    // Another pod keeps the injector's defaults.
    let plain = inject(&pod(), &w, &cfg).expect("injected");
    assert_ne!(plain["spec"]["containers"][0]["name"], "istio-proxy");
    p["metadata"]["annotations"] = json!({"proxy.istio.io/config": "[1, 2"});
    let err = inject(&p, &w, &cfg).expect_err("bad yaml").to_string();
    assert!(err.contains("proxy.istio.io/config"), "{err}");
}

#[test]
fn bad_input_is_named() {
    let cfg = InjectConfig::default();
    let w = Workload::new("shop", "Pod", "v1", "x");
    let err = inject(&json!({"spec": {"containers": []}}), &w, &cfg).expect_err("no containers");
    assert_eq!(err.to_string(), "the pod spec has no containers");
    let mut p = pod();
    let mut own = pod();
    own["spec"]["containers"][0]["name"] = json!("istio-proxy");
    assert!(inject(&own, &w, &cfg)
        .expect_err("own proxy")
        .to_string()
        .contains("istio-proxy"));
    assert_eq!(
        inject(&json!(5), &w, &cfg).expect_err("scalar").reason(),
        "shape"
    );
    p["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] = json!("NONE");
    let none = inject(&p, &w, &cfg).expect("no capture");
    assert_eq!(none["spec"]["initContainers"], json!(null), "no init step");
    p["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] = json!("MAGIC");
    let err = inject(&p, &w, &cfg).expect_err("bad mode");
    assert!(
        err.to_string()
            .contains("sidecar.istio.io/interceptionMode is \"MAGIC\""),
        "{err}"
    );
    p["metadata"]["annotations"] = json!({"status.sidecar.istio.io/port": "http"});
    assert_eq!(
        inject(&p, &w, &cfg).expect_err("bad port").reason(),
        "bad_annotation"
    );
    // Capture annotations the init step or cni-node could not apply fail admission.
    for (key, value, names) in [
        ("includeOutboundIPRanges", "10.0.0.0/8,10.1", "\"10.1\""),
        ("excludeOutboundIPRanges", "*", "\"*\""),
        ("includeInboundPorts", "80,http", "\"http\""),
        ("excludeOutboundPorts", "70000", "\"70000\""),
        ("excludeInterfaces", "eth0/1", "\"eth0/1\""),
    ] {
        let name = format!("traffic.sidecar.istio.io/{key}");
        p["metadata"]["annotations"] = json!({ name.clone(): value });
        let err = inject(&p, &w, &cfg).expect_err(key).to_string();
        assert!(err.contains(&name) && err.contains(names), "{key}: {err}");
    }
    p["metadata"]["annotations"] = json!({
        "traffic.sidecar.istio.io/includeOutboundIPRanges": "*",
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.10/32, 0.0.0.0/0",
        "traffic.sidecar.istio.io/includeInboundPorts": "",
    });
    inject(&p, &w, &cfg).expect("valid capture annotations");
}

#[test]
fn decisions_follow_the_label_then_the_annotation_then_the_policy() {
    let p = |labels: Value, annotations: Value| json!({"metadata": {"labels": labels, "annotations": annotations}, "spec": {}});
    let inject_label = |v: &str| json!({"sidecar.istio.io/inject": v});
    let enabled = InjectConfig::default();
    let disabled = InjectConfig {
        policy: Policy::Disabled,
        ..InjectConfig::default()
    };
    assert_eq!(
        decide(&p(json!({}), json!({})), "shop", &enabled),
        Decision::Inject
    );
    assert!(matches!(
        decide(&p(json!({}), json!({})), "shop", &disabled),
        Decision::Skip(_)
    ));
    assert_eq!(
        decide(&p(inject_label("true"), json!({})), "shop", &disabled),
        Decision::Inject
    );
    assert!(matches!(
        decide(
            &p(inject_label("false"), inject_label("true")),
            "shop",
            &enabled
        ),
        Decision::Skip(_)
    ));
    assert_eq!(
        decide(&p(json!({}), inject_label("true")), "shop", &disabled),
        Decision::Inject
    );
    assert!(matches!(
        decide(&p(json!({}), json!({})), "kube-system", &enabled),
        Decision::Skip(_)
    ));
    let mut host = p(json!({}), json!({}));
    host["spec"]["hostNetwork"] = json!(true);
    assert!(matches!(decide(&host, "shop", &enabled), Decision::Skip(_)));
}

#[test]
fn never_and_always_selectors_decide_pods_that_say_nothing() {
    let values = |policy: &str| {
        json!({
            "global": {"proxy": {"autoInject": policy}},
            "sidecarInjectorWebhook": {
                "neverInjectSelector": [
                    {"matchExpressions": [{"key": "openshift.io/build.name", "operator": "Exists"}]},
                    {"matchLabels": {"team": "batch"}},
                    {},
                    {"matchExpressions": [{"key": "x", "operator": "Near", "values": ["y"]}]},
                ],
                "alwaysInjectSelector": [
                    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]},
                    {"matchLabels": {"team": "batch"}},
                ],
            }
        })
    };
    let enabled = InjectConfig::from_values(&values("enabled"));
    let disabled = InjectConfig::from_values(&values("disabled"));
    // The invalid selector is left out; the empty one selects nothing.
    assert_eq!(enabled.never_inject.len(), 3);
    let pod = |labels: Value| json!({"metadata": {"labels": labels}, "spec": {}});
    let build = pod(json!({"openshift.io/build.name": "b1"}));
    assert!(
        matches!(decide(&build, "shop", &enabled), Decision::Skip(why) if why.contains("neverInjectSelector"))
    );
    let web = pod(json!({"tier": "web"}));
    assert_eq!(decide(&web, "shop", &disabled), Decision::Inject);
    assert!(matches!(
        decide(&pod(json!({"tier": "db"})), "shop", &disabled),
        Decision::Skip(_)
    ));
    // Never wins over always.
    assert!(matches!(
        decide(&pod(json!({"team": "batch"})), "shop", &disabled),
        Decision::Skip(_)
    ));
    // The pod's own word wins over both.
    let mut said = build.clone();
    said["metadata"]["labels"]["sidecar.istio.io/inject"] = json!("true");
    assert_eq!(decide(&said, "shop", &enabled), Decision::Inject);
    // An empty selector ({}) matches nothing: other pods follow the policy.
    assert_eq!(
        decide(&pod(json!({"a": "b"})), "shop", &enabled),
        Decision::Inject
    );
}

#[test]
fn a_proxy_that_takes_hbone_gets_the_tunnel_label() {
    let hbone = InjectConfig::from_values(&json!({
        "meshConfig": {"defaultConfig": {"proxyMetadata": {"ISTIO_META_ENABLE_HBONE": "true"}}}
    }));
    let w = Workload::new("shop", "Pod", "v1", "x");
    let out = inject(&pod(), &w, &hbone).expect("injected");
    assert_eq!(
        out["metadata"]["labels"]["networking.istio.io/tunnel"],
        "http"
    );
    // A value the pod set itself stays; without the metadata there is no label.
    let mut own = pod();
    own["metadata"]["labels"]["networking.istio.io/tunnel"] = json!("tcp");
    let out = inject(&own, &w, &hbone).expect("injected");
    assert_eq!(
        out["metadata"]["labels"]["networking.istio.io/tunnel"],
        "tcp"
    );
    let out = inject(&pod(), &w, &InjectConfig::default()).expect("injected");
    assert!(out["metadata"]["labels"]
        .get("networking.istio.io/tunnel")
        .is_none());
}
