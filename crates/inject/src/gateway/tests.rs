//! The gateway template on a pod as Istio's gateway chart writes it.

use serde_json::{json, Value};

use crate::{inject, InjectConfig, InjectError, Workload};

/// The pod template of the gateway chart's Deployment.
fn gateway_pod() -> Value {
    json!({
        "metadata": {"name": "istio-ingressgateway-5d8f7-x2x9k", "namespace": "istio-ingress",
            "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway",
                       "sidecar.istio.io/inject": "true"},
            "annotations": {"inject.istio.io/templates": "gateway",
                            "prometheus.io/port": "15020", "prometheus.io/scrape": "true"}},
        "spec": {
            "serviceAccountName": "istio-ingressgateway",
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
            "containers": [{"name": "istio-proxy", "image": "auto",
                "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "runAsNonRoot": true,
                                    "capabilities": {"drop": ["ALL"]}},
                "env": [{"name": "ISTIO_META_UNPRIVILEGED_POD", "value": "true"}],
                "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "2000m", "memory": "1024Mi"}}}],
        },
    })
}

fn cfg() -> InjectConfig {
    InjectConfig::from_values(&json!({"global": {"hub": "registry.example/mesh", "tag": "1.0"}}))
}

#[test]
fn the_pods_own_proxy_becomes_a_router_with_the_proxys_volumes() {
    let pod = gateway_pod();
    let workload = Workload::of_pod(&pod, "istio-ingress");
    let out = inject(&pod, &workload, &cfg()).expect("inject");
    let containers = out["spec"]["containers"].as_array().expect("containers");
    assert_eq!(
        containers.len(),
        1,
        "the pod's own istio-proxy, no second one"
    );
    let proxy = &containers[0];
    assert_eq!(
        proxy["image"],
        cfg().image(),
        "image: auto is the proxy image"
    );
    let args: Vec<&str> = (proxy["args"].as_array().expect("args").iter())
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        &args[..4],
        [
            "proxy",
            "router",
            "--domain",
            "$(POD_NAMESPACE).svc.cluster.local"
        ]
    );
    assert_eq!(
        proxy["securityContext"]["runAsUser"], 1337,
        "the pod's own wins"
    );
    assert_eq!(proxy["resources"]["limits"]["cpu"], "2000m");
    assert_eq!(proxy["readinessProbe"]["httpGet"]["port"], 15021);
    assert!(proxy.get("startupProbe").is_none());
    let env = proxy["env"].as_array().expect("env");
    for name in [
        "ISTIO_META_UNPRIVILEGED_POD",
        "POD_NAME",
        "PROXY_CONFIG",
        "CA_ADDR",
    ] {
        assert!(env.iter().any(|e| e["name"] == name), "{name}");
    }
    assert_eq!(
        (proxy["ports"].as_array().expect("ports").iter())
            .filter(|p| p["containerPort"] == 15090)
            .count(),
        1
    );
    assert!(out["spec"].get("initContainers").is_none(), "no capture");
    let volumes = out["spec"]["volumes"].as_array().expect("volumes");
    assert!(volumes.iter().any(|v| v["name"] == "istio-token"));
    let labels = &out["metadata"]["labels"];
    assert!(labels.get("security.istio.io/tlsMode").is_none());
    assert_eq!(
        labels["service.istio.io/canonical-name"],
        "istio-ingressgateway"
    );
    let annotations = &out["metadata"]["annotations"];
    assert!(annotations["sidecar.istio.io/status"].is_string());
    assert_eq!(
        annotations["prometheus.io/port"], "15020",
        "the chart's scrape port stays"
    );
    // Injecting again changes nothing.
    assert_eq!(inject(&out, &workload, &cfg()).expect("again"), out);
}

#[test]
fn an_unknown_template_is_refused_by_name() {
    let mut pod = gateway_pod();
    pod["metadata"]["annotations"]["inject.istio.io/templates"] = json!("gateway,spire");
    let workload = Workload::of_pod(&pod, "istio-ingress");
    let err = inject(&pod, &workload, &cfg()).expect_err("refused");
    assert!(matches!(err, InjectError::BadAnnotation { .. }));
    assert!(err.to_string().contains("\"spire\""), "{err}");
}
