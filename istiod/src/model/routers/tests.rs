//! Gateway proxies through the model: which pods a Gateway selects, their listening ports from
//! the gateway's Service, the VirtualServices bound to it, and pushes only on change.

use mesh_api::{Kind, ObjectKey};
use mesh_proto::envoy::pb::envoy::config::route::v3::RouteConfiguration;
use mesh_proto::type_url;
use mesh_xds::XdsSnapshot;
use prost::Message;
use serde_json::json;

use crate::envoy::WaypointKey;
use crate::model::testing::{namespace, obj, pod_json, service};
use crate::model::{Model, ModelConfig};

fn key() -> WaypointKey {
    WaypointKey {
        namespace: "istio-system".into(),
        name: "ingress-1".into(),
    }
}

fn mesh() -> Model {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("istio-system", json!({})));
    m.apply(namespace("shop", json!({})));
    m.apply(service(
        "shop",
        "echo",
        json!({"app": "echo"}),
        "10.96.0.10",
    ));
    m.apply(obj(pod_json(
        "shop",
        "echo-1",
        "10.1.0.5",
        json!({"app": "echo"}),
    )));
    // The gateway's pod and its Service (80 -> the pod's `http-web`, 8080).
    let labels = json!({"istio": "ingressgateway"});
    m.apply(obj(pod_json(
        "istio-system",
        "ingress-1",
        "10.1.0.9",
        labels.clone(),
    )));
    m.apply(service("istio-system", "ingress", labels, "10.96.0.90"));
    m.apply(obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "Gateway",
        "metadata": {"name": "ingress", "namespace": "istio-system"},
        "spec": {"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]},
        ]},
    })));
    m
}

fn virtual_service() -> mesh_api::Object {
    obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "echo", "namespace": "shop"},
        "spec": {"hosts": ["echo.example.com"], "gateways": ["istio-system/ingress"],
                 "http": [{"route": [{"destination": {"host": "echo", "port": {"number": 80}}}]}]},
    }))
}

#[test]
fn a_selected_pod_gets_its_gateways_servers_and_bound_routes() {
    let mut m = mesh();
    let s = m.build();
    assert_eq!(s.routers().count(), 1, "only the selected pod");
    let node = mesh_proto::envoy::pb::envoy::config::core::v3::Node {
        id: "router~10.1.0.9~ingress-1.istio-system~istio-system.svc.cluster.local".into(),
        ..Default::default()
    };
    let scope = s.scope_of(&node);
    let lds = s.scoped_resources(&scope, type_url::LISTENER).expect("lds");
    assert!(
        lds.contains_key("0.0.0.0_8080"),
        "{:?}",
        lds.keys().collect::<Vec<_>>()
    );
    let route = |s: &crate::model::Snapshot| {
        let rds = s.router(&key()).get(type_url::ROUTE).expect("rds");
        RouteConfiguration::decode(rds["http.8080"].body.value.as_slice()).expect("route")
    };
    assert_eq!(route(&s).virtual_hosts[0].name, "blackhole:8080");
    m.apply(virtual_service());
    let s = m.build();
    assert_eq!(route(&s).virtual_hosts[0].name, "echo.example.com:80");
    let cds = s.router(&key()).get(type_url::CLUSTER).expect("cds");
    assert!(cds.contains_key("outbound|80||echo.shop.svc.cluster.local"));
    // Something unrelated: no push.
    let before = s.router(&key()).changed_in;
    m.apply(namespace("unrelated", json!({})));
    assert_eq!(m.build().router(&key()).changed_in, before);
    // The Gateway gone: the proxy is pushed an empty configuration while its pod lives.
    m.delete(&ObjectKey::new(
        Kind::IstioGateway,
        "istio-system",
        "ingress",
    ));
    let s = m.build();
    let view = s.router(&key());
    assert!(view.changed_in > before, "pushed");
    assert!(view.by_type.values().all(|r| r.is_empty()), "nothing left");
    m.delete(&ObjectKey::new(Kind::Pod, "istio-system", "ingress-1"));
    assert_eq!(m.build().routers().count(), 0, "the pod gone: forgotten");
}

#[test]
fn credentials_come_from_secrets_of_the_gateways_namespace() {
    let mut m = mesh();
    m.apply(obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "Gateway",
        "metadata": {"name": "ingress", "namespace": "istio-system"},
        "spec": {"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["*"],
             "tls": {"mode": "MUTUAL", "credentialName": "cert"}},
        ]},
    })));
    let errors = |s: &crate::model::Snapshot| -> Vec<String> {
        s.router(&key())
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let s = m.build();
    assert!(
        errors(&s).iter().any(|e| e.contains("no Secret cert")),
        "{:?}",
        errors(&s)
    );
    let dir = tempfile::tempdir().expect("dir");
    let tls = mesh_testutil::TlsFiles::generate(dir.path(), "ca", "echo.example.com");
    let (cert, pem_key) = tls.server_pem();
    // The certificate in one Secret (`data`, as the API serves it), the CA in `<name>-cacert`.
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    m.apply(obj(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "cert", "namespace": "istio-system"},
        "data": {"tls.crt": b64(cert), "tls.key": b64(pem_key)},
    })));
    let s = m.build();
    assert!(
        errors(&s).iter().any(|e| e.contains("has no CA")),
        "{:?}",
        errors(&s)
    );
    m.apply(obj(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cert-cacert", "namespace": "istio-system"},
        "stringData": {"ca.crt": tls.ca_pem()},
    })));
    let s = m.build();
    assert!(errors(&s).is_empty(), "{:?}", errors(&s));
    let sds = s.router(&key()).get(type_url::SECRET).expect("sds");
    assert!(sds.contains_key("kubernetes://cert") && sds.contains_key("kubernetes://cert-cacert"));
    assert!(s
        .router(&key())
        .get(type_url::LISTENER)
        .expect("lds")
        .contains_key("0.0.0.0_443"));
    // A Secret of another namespace does not count.
    m.delete(&ObjectKey::new(Kind::Secret, "istio-system", "cert"));
    m.apply(obj(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cert", "namespace": "shop"},
        "stringData": {"cert": cert, "key": pem_key},
    })));
    assert!(errors(&m.build())
        .iter()
        .any(|e| e.contains("no Secret cert")));
}
