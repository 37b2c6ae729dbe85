//! The waypoint index through the model: binding, incremental regeneration, workload traffic.

use mesh_api::{Kind, ObjectKey};
use mesh_proto::type_url;
use mesh_xds::XdsSnapshot;
use serde_json::json;

use crate::envoy::WaypointKey;
use crate::model::testing::{authz, namespace, obj, pod, service};
use crate::model::{Model, ModelConfig, Snapshot};

fn key() -> WaypointKey {
    WaypointKey {
        namespace: "shop".into(),
        name: "waypoint".into(),
    }
}

/// The shop's waypoint Gateway, ready (its controller wrote addresses).
fn gateway(waypoint_for: Option<&str>) -> mesh_api::Object {
    gateway_with(waypoint_for, "istio-waypoint", true)
}

fn gateway_with(waypoint_for: Option<&str>, class: &str, ready: bool) -> mesh_api::Object {
    let labels = match waypoint_for {
        Some(v) => json!({"istio.io/waypoint-for": v}),
        None => json!({}),
    };
    let addresses = if ready {
        json!([{"type": "IPAddress", "value": "10.96.0.20"},
               {"type": "Hostname", "value": "waypoint.shop.svc.cluster.local"}])
    } else {
        json!([])
    };
    obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "shop", "labels": labels},
        "spec": {"gatewayClassName": class,
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
        "status": {"addresses": addresses},
    }))
}

fn clusters(s: &Snapshot) -> Vec<String> {
    s.waypoint(&key())
        .get(type_url::CLUSTER)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn shop() -> Model {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace(
        "shop",
        json!({"istio.io/dataplane-mode": "ambient", "istio.io/use-waypoint": "waypoint"}),
    ));
    m.apply(gateway(None));
    m.apply(service(
        "shop",
        "echo",
        json!({"app": "echo"}),
        "10.96.0.10",
    ));
    m.apply(pod("shop", "echo-1", "10.1.0.5", json!({"app": "echo"})));
    m
}

#[test]
fn services_of_a_labelled_namespace_are_served_by_its_waypoint() {
    let mut m = shop();
    let s = m.build();
    let c = clusters(&s);
    assert!(
        c.contains(&"inbound-vip|80|http|echo.shop.svc.cluster.local".to_string()),
        "{c:?}"
    );
    assert!(
        c.contains(&"inbound-vip|9000|tcp|echo.shop.svc.cluster.local".to_string()),
        "{c:?}"
    );
    let eds = s.waypoint(&key()).get(type_url::ENDPOINT).expect("eds");
    let cla = eds
        .get("inbound-vip|80|http|echo.shop.svc.cluster.local")
        .expect("cla");
    assert!(String::from_utf8_lossy(&cla.body.value).contains("10.1.0.5:8080"));
    // An opted-out service is not served.
    m.apply(obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "direct", "namespace": "shop", "labels": {"istio.io/use-waypoint": "none"}},
        "spec": {"clusterIP": "10.96.0.11", "selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80}]},
    })));
    let s = m.build();
    assert!(!clusters(&s).iter().any(|c| c.contains("direct.shop")));
}

#[test]
fn only_changes_that_touch_a_waypoint_regenerate_it() {
    let mut m = shop();
    let first = m.build();
    let v = first.waypoint(&key()).changed_in;
    let scope = "waypoint:shop/waypoint";
    // Elsewhere: nothing changes for the waypoint, and its proxies are told so.
    m.apply(namespace("other", json!({})));
    m.apply(service("other", "db", json!({"app": "db"}), "10.96.1.1"));
    m.apply(pod("other", "db-1", "10.1.1.5", json!({"app": "db"})));
    let s = m.build();
    assert_eq!(s.waypoint(&key()).changed_in, v);
    assert_eq!(
        s.scoped_changes_since(scope, first.version()),
        Some(Default::default())
    );
    // A new endpoint of a bound service: regenerated, a push is due.
    m.apply(pod("shop", "echo-2", "10.1.0.6", json!({"app": "echo"})));
    let s2 = m.build();
    assert!(s2.waypoint(&key()).changed_in > v);
    assert_eq!(s2.scoped_changes_since(scope, s.version()), None);
    // An HTTPRoute on the service and a policy targeting it regenerate it too.
    let before = s2.waypoint(&key()).changed_in;
    m.apply(obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "shop"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "echo"}],
                 "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}]},
    })));
    let s3 = m.build();
    assert!(s3.waypoint(&key()).changed_in > before);
    m.apply(authz(
        "shop",
        "deny",
        json!({"targetRefs": [{"kind": "Service", "group": "", "name": "echo"}], "action": "DENY",
               "rules": [{"to": [{"operation": {"paths": ["/admin*"]}}]}]}),
    ));
    let s4 = m.build();
    assert!(s4.waypoint(&key()).changed_in > s3.waypoint(&key()).changed_in);
    // Waypoint policies are not ztunnel policies.
    assert!(s4.authorizations().get("shop/deny").is_none());
    // The service leaves the waypoint: its clusters go.
    m.delete(&ObjectKey::new(Kind::Service, "shop", "echo"));
    let s5 = m.build();
    assert!(!clusters(&s5).iter().any(|c| c.contains("echo.shop")));
}

/// The waypoint hostname WDS gives the address `key` (a workload or a service), if any.
fn waypoint_hostname(s: &Snapshot, key: &str) -> Option<String> {
    use mesh_proto::workload::{address::Type, gateway_address::Destination};
    let r = s.addresses().get(key).expect("address");
    let a = <mesh_proto::workload::Address as prost::Message>::decode(r.body.value.as_slice())
        .expect("decode");
    let waypoint = match a.r#type {
        Some(Type::Workload(w)) => w.waypoint,
        Some(Type::Service(svc)) => svc.waypoint,
        None => panic!("empty address {key}"),
    };
    match waypoint?.destination {
        Some(Destination::Hostname(h)) => Some(h.hostname),
        other => panic!("not a hostname waypoint: {other:?}"),
    }
}

fn workload_waypoint(s: &Snapshot) -> bool {
    waypoint_hostname(s, "Kubernetes//Pod/shop/echo-1").is_some()
}

fn service_waypoint(s: &Snapshot) -> bool {
    waypoint_hostname(s, "shop/echo.shop.svc.cluster.local").is_some()
}

#[test]
fn a_waypoint_binds_only_once_ready_of_its_class_and_for_service_traffic() {
    let mut m = shop();
    m.apply(gateway_with(None, "istio-waypoint", false));
    let s = m.build();
    assert!(
        !service_waypoint(&s),
        "no addresses yet: traffic bypasses it"
    );
    assert!(clusters(&s).iter().all(|c| !c.starts_with("inbound-vip")));
    m.apply(gateway(None));
    assert!(service_waypoint(&m.build()), "ready: bound");
    m.apply(gateway(Some("workload")));
    assert!(
        !service_waypoint(&m.build()),
        "waypoint-for: workload refuses services"
    );
    m.apply(gateway_with(None, "istio", true));
    assert!(
        !service_waypoint(&m.build()),
        "another class is not a waypoint"
    );
    m.delete(&ObjectKey::new(Kind::Gateway, "shop", "waypoint"));
    assert!(
        !service_waypoint(&m.build()),
        "a missing waypoint is bypassed"
    );
    m.apply(gateway(Some("all")));
    let s = m.build();
    assert!(service_waypoint(&s) && workload_waypoint(&s));
}

#[test]
fn workloads_use_the_waypoint_only_when_it_serves_workload_traffic() {
    let mut m = shop();
    let s = m.build();
    assert!(
        service_waypoint(&s) && !workload_waypoint(&s),
        "default: service traffic only"
    );
    m.apply(gateway(Some("all")));
    let s = m.build();
    assert!(
        service_waypoint(&s) && workload_waypoint(&s),
        "waypoint-for: all"
    );
    m.apply(gateway(Some("service")));
    assert!(!workload_waypoint(&m.build()));
}

#[test]
fn a_gateway_class_label_sets_the_default_traffic_type() {
    let mut m = shop();
    let class = |labels: serde_json::Value| {
        obj(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "istio-waypoint", "labels": labels},
            "spec": {"controllerName": "istio.io/mesh-controller"},
        }))
    };
    m.apply(class(json!({"istio.io/waypoint-for": "all"})));
    let s = m.build();
    assert!(
        service_waypoint(&s) && workload_waypoint(&s),
        "class default: all"
    );
    m.apply(gateway(Some("service")));
    assert!(!workload_waypoint(&m.build()), "the Gateway's label wins");
    m.apply(gateway(None));
    m.apply(class(json!({"istio.io/waypoint-for": "workload"})));
    let s = m.build();
    assert!(
        !service_waypoint(&s) && workload_waypoint(&s),
        "class default: workload"
    );
}

#[test]
fn a_renamed_waypoint_is_reached_by_the_hostname_in_its_status() {
    let mut m = shop();
    let mut gw = gateway(None);
    if let mesh_api::Object::Gateway(g) = &mut gw {
        let status = g.status.as_mut().expect("status");
        status.addresses[1].value = "wp.shop.svc.cluster.local".into();
    }
    m.apply(gw);
    let s = m.build();
    let host = waypoint_hostname(&s, "shop/echo.shop.svc.cluster.local").expect("bound");
    assert_eq!(host, "wp.shop.svc.cluster.local");
    // The Gateway's own proxies (labelled with the Gateway's name) still get its services.
    assert!(
        clusters(&s)
            .iter()
            .any(|c| c.contains("echo.shop.svc.cluster.local")),
        "{:?}",
        clusters(&s)
    );
}

fn destination_rule(ns: &str, name: &str, host: &str, subset: &str) -> mesh_api::Object {
    obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"host": host, "subsets": [{"name": subset, "labels": {"app": "echo"}}]},
    }))
}

#[test]
fn destination_rules_add_subset_clusters_by_istios_namespace_precedence() {
    let mut m = shop();
    let first = m.build();
    let has = |s: &Snapshot, subset: &str| {
        clusters(s).contains(&format!(
            "inbound-vip|80|http/{subset}|echo.shop.svc.cluster.local"
        ))
    };
    // A root-namespace rule applies when nothing nearer does.
    m.apply(destination_rule(
        "istio-system",
        "root",
        "echo.shop.svc.cluster.local",
        "fromroot",
    ));
    let s = m.build();
    assert!(s.waypoint(&key()).changed_in > first.waypoint(&key()).changed_in);
    assert!(has(&s, "fromroot"));
    // The service's (here also the waypoint's) namespace wins over the root namespace, and a
    // short host is read in the rule's namespace.
    m.apply(destination_rule("shop", "local", "echo", "v1"));
    let s = m.build();
    assert!(has(&s, "v1") && !has(&s, "fromroot"), "{:?}", clusters(&s));
    // Two rules for the host in one namespace: their subsets merge.
    m.apply(destination_rule(
        "shop",
        "more",
        "echo.shop.svc.cluster.local",
        "v2",
    ));
    let s = m.build();
    assert!(has(&s, "v1") && has(&s, "v2"), "{:?}", clusters(&s));
    // A rule for sidecars only (workloadSelector) does not apply to the waypoint.
    m.delete(&ObjectKey::new(Kind::DestinationRule, "shop", "local"));
    m.delete(&ObjectKey::new(Kind::DestinationRule, "shop", "more"));
    m.apply(obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": "sidecars", "namespace": "shop"},
        "spec": {"host": "echo", "workloadSelector": {"matchLabels": {"app": "x"}},
                 "subsets": [{"name": "sc", "labels": {"app": "echo"}}]},
    })));
    let s = m.build();
    assert!(!has(&s, "sc") && has(&s, "fromroot"), "{:?}", clusters(&s));
}

#[test]
fn grpc_and_tcp_routes_regenerate_the_waypoint_of_their_parent() {
    let mut m = shop();
    let before = m.build().waypoint(&key()).changed_in;
    m.apply(obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": "g", "namespace": "shop"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "echo"}],
                 "rules": [{"matches": [{"method": {"service": "a.B", "method": "C"}}],
                            "backendRefs": [{"name": "echo", "port": 80}]}]},
    })));
    let s = m.build();
    let after = s.waypoint(&key()).changed_in;
    assert!(after > before);
    let lds = s.waypoint(&key()).get(type_url::LISTENER).expect("lds");
    let main = lds.get("main_internal").expect("main_internal");
    assert!(
        String::from_utf8_lossy(&main.body.value).contains("/a.B/C"),
        "the GRPCRoute's method path is served"
    );
    // A TCPRoute whose backend is not a service of the waypoint: the regenerated waypoint
    // reports it (a route to the port's own service would generate the same configuration).
    m.apply(obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TCPRoute",
        "metadata": {"name": "t", "namespace": "shop"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "echo", "port": 9000}],
                 "rules": [{"backendRefs": [{"name": "elsewhere", "port": 9000}]}]},
    })));
    let s = m.build();
    assert!(s.waypoint(&key()).changed_in > after);
    assert!(
        s.waypoint(&key())
            .errors
            .iter()
            .any(|e| e.to_string().starts_with("TCPRoute shop/t")),
        "{:?}",
        s.waypoint(&key()).errors
    );
}

/// Whether any of the waypoint's listeners writes an access log to `path`.
fn logs_to(s: &Snapshot, path: &str) -> bool {
    s.waypoint(&key()).get(type_url::LISTENER).is_some_and(|m| {
        m.values().any(|r| {
            r.body
                .value
                .windows(path.len())
                .any(|w| w == path.as_bytes())
        })
    })
}

#[test]
fn new_model_settings_regenerate_every_waypoint_and_only_changed_resources() {
    let mut m = shop();
    let s = m.build();
    assert!(!logs_to(&s, "/dev/stdout"), "no access log by default");
    let before = s.addresses().clone();
    m.reconfigure(ModelConfig {
        access_log_file: "/dev/stdout".into(),
        ..ModelConfig::default()
    });
    let s = m.build();
    assert!(
        logs_to(&s, "/dev/stdout"),
        "the mesh config's accessLogFile reached the waypoint"
    );
    assert!(
        s.addresses()
            .iter()
            .all(|(name, r)| before.get(name).is_some_and(|b| b.version == r.version)),
        "workloads and services did not change, so their versions did not"
    );
    // The same settings again: nothing to do.
    let version = m.version();
    m.reconfigure(ModelConfig {
        access_log_file: "/dev/stdout".into(),
        ..ModelConfig::default()
    });
    assert!(!m.has_pending(), "unchanged settings mark nothing");
    assert_eq!(m.version(), version);
}

fn request_authn(ns: &str, name: &str, spec: serde_json::Value) -> mesh_api::Object {
    obj(json!({
        "apiVersion": "security.istio.io/v1", "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
}

/// Whether the waypoint's `main_internal` listener checks JWTs.
fn checks_tokens(s: &Snapshot) -> bool {
    let lds = s.waypoint(&key()).get(type_url::LISTENER).cloned();
    lds.and_then(|m| m.get("main_internal").cloned())
        .is_some_and(|l| {
            String::from_utf8_lossy(&l.body.value).contains("envoy.filters.http.jwt_authn")
        })
}

#[test]
fn request_authentications_attach_like_waypoint_policies() {
    let mut m = shop();
    let rule = json!([{"issuer": "https://issuer.example",
                       "jwks": r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#}]);
    assert!(!checks_tokens(&m.build()));
    // A selector is for sidecars; another namespace's Service of the same name is not this one.
    m.apply(request_authn(
        "shop",
        "pods",
        json!({"selector": {"matchLabels": {"app": "echo"}}, "jwtRules": rule}),
    ));
    m.apply(request_authn(
        "other",
        "echo",
        json!({"targetRefs": [{"kind": "Service", "name": "echo"}], "jwtRules": rule}),
    ));
    // A ServiceEntry reference does not name the Kubernetes Service of the same name.
    m.apply(request_authn(
        "shop",
        "entry",
        json!({"targetRefs": [{"kind": "ServiceEntry", "group": "networking.istio.io", "name": "echo"}], "jwtRules": rule}),
    ));
    assert!(!checks_tokens(&m.build()));
    for spec in [
        json!({"targetRefs": [{"kind": "Service", "group": "", "name": "echo"}], "jwtRules": rule}),
        json!({"targetRef": {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}, "jwtRules": rule}),
    ] {
        m.apply(request_authn("shop", "jwt", spec));
        let s = m.build();
        assert!(checks_tokens(&s), "{:?}", s.waypoint(&key()).errors);
        m.delete(&ObjectKey::new(Kind::RequestAuthentication, "shop", "jwt"));
        assert!(!checks_tokens(&m.build()));
    }
    // From the root namespace, on the class: every waypoint.
    m.apply(request_authn(
        "istio-system",
        "mesh-jwt",
        json!({"targetRefs": [{"kind": "GatewayClass", "group": "gateway.networking.k8s.io", "name": "istio-waypoint"}], "jwtRules": rule}),
    ));
    assert!(checks_tokens(&m.build()));
}
