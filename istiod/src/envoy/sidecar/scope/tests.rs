use serde_json::json;

use super::*;

fn sidecar(spec: serde_json::Value) -> Sidecar {
    serde_json::from_value(json!({"metadata": {"name": "sc", "namespace": "shop"}, "spec": spec}))
        .expect("a Sidecar")
}

fn scope(spec: serde_json::Value) -> (SidecarScope, Vec<SidecarError>) {
    let mut errors = Vec::new();
    let s = SidecarScope::from_resource(&sidecar(spec), "shop/sc", "shop", false, &mut errors);
    (s, errors)
}

#[test]
fn hosts_match_as_istio_matches_them() {
    assert!(host_matches("*", "reviews.shop.svc.cluster.local"));
    assert!(host_matches(
        "reviews.shop.svc.cluster.local",
        "reviews.shop.svc.cluster.local"
    ));
    assert!(host_matches("*.example.com", "api.example.com"));
    assert!(host_matches("*.example.com", "a.b.example.com"));
    assert!(host_matches("*.example.com", "*.api.example.com"));
    assert!(!host_matches("*.example.com", "example.com"));
    assert!(!host_matches("*.example.com", "api.example.org"));
    assert!(!host_matches("api.example.com", "*.example.com"));
}

#[test]
fn the_default_imports_everything() {
    let s = SidecarScope::default_for("shop", false);
    assert!(s.imports("other", "x.other.svc.cluster.local", 80));
    assert!(s.imports_virtual_service("routing", "x.other.svc.cluster.local"));
    assert!(!s.registry_only);
    assert!(SidecarScope::default_for("shop", true).registry_only);
}

#[test]
fn a_port_listener_decides_its_port_and_the_catch_all_the_rest() {
    let (s, errors) = scope(json!({"egress": [
        {"port": {"number": 9000, "protocol": "TCP"}, "hosts": ["db/*"]},
        {"hosts": ["./*", "istio-system/*", "*/*.example.com"]},
    ]}));
    assert!(errors.is_empty(), "{errors:?}");
    let web = "web.shop.svc.cluster.local";
    let db = "pg.db.svc.cluster.local";
    assert!(s.imports("shop", web, 80), "`.` is the proxy's namespace");
    assert!(!s.imports("shop", web, 9000), "9000 is the db listener's");
    assert!(s.imports("db", db, 9000));
    assert!(!s.imports("db", db, 5432), "db is imported on 9000 only");
    assert!(s.imports("external", "api.example.com", 443));
    assert!(!s.imports("other", "x.other.svc.cluster.local", 80));
    assert!(
        s.imports_virtual_service("shop", db),
        "a `shop/*` import takes shop's VS"
    );
    assert!(!s.imports_virtual_service("routing", web));
}

#[test]
fn without_a_catch_all_other_ports_import_nothing() {
    let (s, _) = scope(json!({"egress": [{"port": {"number": 80}, "hosts": ["*/*"]}]}));
    assert!(s.imports("a", "x.a.svc.cluster.local", 80));
    assert!(!s.imports("a", "x.a.svc.cluster.local", 81));
    let (none, _) = scope(json!({"egress": [{"hosts": ["~/*"]}]}));
    assert!(!none.imports("shop", "web.shop.svc.cluster.local", 80));
}

#[test]
fn outbound_mode_is_the_sidecars_else_the_meshs() {
    let mut errors = Vec::new();
    let only_ingress = sidecar(json!({"ingress": [{"port": {"number": 80}}]}));
    for mesh in [false, true] {
        let s = SidecarScope::from_resource(&only_ingress, "shop/sc", "shop", mesh, &mut errors);
        assert_eq!(s.registry_only, mesh);
        assert!(
            s.imports("any", "x.any.svc.cluster.local", 1),
            "no egress: */*"
        );
    }
    // REGISTRY_ONLY is the API's zero value.
    assert!(scope(json!({"outboundTrafficPolicy": {}})).0.registry_only);
    let allow = scope(json!({"outboundTrafficPolicy": {"mode": "ALLOW_ANY"}})).0;
    assert!(!allow.registry_only);
}

#[test]
fn ingress_ports_and_endpoints() {
    let (s, errors) = scope(json!({"ingress": [
        {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:8080"},
        {"port": {"number": 9090, "name": "grpc-api"}, "defaultEndpoint": "0.0.0.0:9091"},
        {"port": {"number": 9100, "protocol": "TCP"}, "defaultEndpoint": "unix:///var/run/app.sock"},
        {"port": {"number": 9200, "protocol": "TCP"}},
        {"port": {"number": 9300}, "defaultEndpoint": "[::1]:9301"},
    ]}));
    assert!(errors.is_empty(), "{errors:?}");
    let got: Vec<(u16, Protocol, IngressEndpoint)> = s
        .ingress
        .iter()
        .map(|p| (p.port, p.protocol, p.endpoint.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                9080,
                Protocol::Http,
                IngressEndpoint::Loopback(Ipv4Addr::LOCALHOST.into(), 8080)
            ),
            (9090, Protocol::Grpc, IngressEndpoint::PodAddress(9091)),
            (
                9100,
                Protocol::Tcp,
                IngressEndpoint::Unix("/var/run/app.sock".into())
            ),
            (9200, Protocol::Tcp, IngressEndpoint::OriginalDestination),
            (
                9300,
                Protocol::Http,
                IngressEndpoint::Loopback(Ipv6Addr::LOCALHOST.into(), 9301)
            ),
        ]
    );
}

#[test]
fn what_cannot_be_applied_is_named_and_left_out() {
    let (s, errors) = scope(json!({
        "egress": [
            {"port": {"number": 0}, "bind": "unix:///tmp/x.sock", "hosts": ["*/*"]},
            {"port": {"number": 80}, "bind": "127.0.0.1", "hosts": ["reviews", "./*"]},
            {"hosts": ["./*"], "captureMode": "NONE"},
        ],
        "ingress": [{"port": {"number": 80}, "defaultEndpoint": "10.1.1.1:80"}],
        "outboundTrafficPolicy": {"mode": "ALLOW_ANY", "egressProxy": {"host": "p.example.com"}},
    }));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let has = |needle: &str, field: &str| {
        assert!(
            text.iter().any(|t| t.contains(needle)
                && t.contains(field)
                && t.starts_with("Sidecar shop/sc")),
            "{needle} at {field}: {text:#?}"
        )
    };
    has("unix domain socket", "egress[0].port.number");
    has("bind \"127.0.0.1\" is not supported", "egress[1]");
    has("must be of form namespace/dnsName", "egress[1].hosts[0]");
    has("captureMode NONE", "egress[2]");
    has("defaultEndpoint must be of form", "ingress[0]");
    has("egress proxy", "outboundTrafficPolicy.egressProxy");
    assert_eq!(text.len(), 6, "{text:#?}");
    // The rest applies: port 80 takes `./*`, the catch-all too; the bad ingress is gone.
    assert!(s.imports("shop", "web.shop.svc.cluster.local", 80));
    assert!(s.imports("shop", "web.shop.svc.cluster.local", 8080));
    assert!(s.ingress.is_empty());
    assert!(!s.registry_only);
}

#[test]
fn validation_accepts_what_the_model_applies() {
    let ok = sidecar(json!({"egress": [{"hosts": ["./*", "istio-system/*"]}]}));
    assert_eq!(validate_sidecar(&ok), Ok(()));
    let err = validate_sidecar(&sidecar(json!({"egress": [{"hosts": ["a/b", "./x"]}]})))
        .expect_err("short names");
    assert!(
        err.contains("egress[0]") && err.contains("\"a/b\"") && err.contains("\"./x\""),
        "{err}"
    );
}
