use serde_json::json;

use super::*;

fn dump() -> EnvoyDump {
    let value = json!({"configs": [
        {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
         "static_clusters": [{"cluster": {"name": "sds-grpc", "type": "STATIC"}}],
         "dynamic_active_clusters": [
            {"cluster": {"name": "inbound-vip|80|http|echo.shop.svc.cluster.local", "type": "EDS"}},
            {"cluster": {"name": "connect_originate", "type": "ORIGINAL_DST"}},
            {"cluster": {"name": "outbound|80|v1|echo.shop.svc.cluster.local", "type": "EDS",
              "metadata": {"filter_metadata": {"istio": {"config":
                "/apis/networking.istio.io/v1/namespaces/shop/destination-rule/echo"}}}}},
         ]},
        {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
         "dynamic_listeners": [
            {"name": "connect_terminate", "active_state": {"listener": {
                "name": "connect_terminate",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15008}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {"route_config": {"name": "local_route",
                        "virtual_hosts": [{"name": "connect", "domains": ["*"],
                            "routes": [{"name": "connect", "match": {"connect_matcher": {}}}]}]}}}]}]}}},
            {"name": "main_internal", "active_state": {"listener": {
                "name": "main_internal", "internal_listener": {},
                "filter_chains": [
                    {"name": "inbound-vip|80|http|echo.shop.svc.cluster.local",
                     "filters": [{"name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {"route_config": {"name": "inbound-vip|80|http|echo.shop.svc.cluster.local",
                            "virtual_hosts": [{"name": "echo.shop.svc.cluster.local:80", "domains": ["*"],
                                "routes": [{"name": "shop/split.0.0", "match": {"prefix": "/api"}},
                                           {"name": "default", "match": {"prefix": "/"}}]}]}}}]},
                    {"name": "inbound-vip|5432|tcp|db.shop.svc.cluster.local",
                     "filters": [{"name": "envoy.filters.network.tcp_proxy",
                        "typed_config": {"cluster": "inbound-vip|5432|tcp|db.shop.svc.cluster.local"}}]}]}}},
         ]},
        {"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
         "dynamic_endpoint_configs": [{"endpoint_config": {
            "cluster_name": "inbound-vip|80|http|echo.shop.svc.cluster.local",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"envoy_internal_address": {
                "server_listener_name": "connect_originate", "endpoint_id": "10.1.0.5:8080"}}},
                "health_status": "HEALTHY"}]}]}}]},
        {"@type": "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
         "dynamic_active_secrets": [{"name": "default", "secret": {"name": "default",
            "tls_certificate": {"certificate_chain": {"inline_bytes": "bm90IGEgY2VydA=="}}}}],
         "dynamic_warming_secrets": [{"name": "ROOTCA"}]},
    ]});
    EnvoyDump::parse(value.to_string().as_bytes()).expect("dump")
}

fn short(section: Section) -> String {
    render(&dump(), section, Output::Short).expect("render")
}

#[test]
fn clusters_split_istio_names() {
    assert_eq!(
        short(Section::Clusters),
        "SERVICE FQDN                PORT SUBSET DIRECTION   TYPE         DESTINATION RULE\n\
         connect_originate           -    -      -           ORIGINAL_DST -\n\
         echo.shop.svc.cluster.local 80   http   inbound-vip EDS          -\n\
         echo.shop.svc.cluster.local 80   v1     outbound    EDS          echo.shop\n\
         sds-grpc                    -    -      -           STATIC       -\n"
    );
}

#[test]
fn listeners_show_a_row_per_chain() {
    let t = short(Section::Listeners);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 4, "{t}");
    assert!(
        lines[1].starts_with("0.0.0.0") && lines[1].contains("15008"),
        "{t}"
    );
    assert!(lines[1].ends_with("Inline Route: local_route"), "{t}");
    assert!(lines[2].starts_with("envoy://main_internal"), "{t}");
    assert!(
        lines[3].ends_with("Cluster: inbound-vip|5432|tcp|db.shop.svc.cluster.local"),
        "{t}"
    );
}

#[test]
fn routes_include_inline_route_configurations() {
    let t = short(Section::Routes);
    assert!(t.starts_with("NAME"), "{t}");
    assert!(t.contains("connect") && t.contains("CONNECT"), "{t}");
    let api = t
        .lines()
        .find(|l| l.contains("/api*"))
        .expect("the /api route");
    assert!(api.ends_with("shop/split.0.0"), "{api}");
}

#[test]
fn endpoints_and_secrets() {
    let t = short(Section::Endpoints);
    assert!(
        t.contains("envoy://connect_originate/10.1.0.5:8080 HEALTHY OK"),
        "{t}"
    );
    let t = short(Section::Secrets);
    assert!(t.contains("default"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.starts_with("default") && l.contains("false")),
        "an unparsable certificate is not valid: {t}"
    );
    assert!(
        t.lines()
            .any(|l| l.starts_with("ROOTCA") && l.contains("WARMING")),
        "{t}"
    );
}

#[test]
fn raw_sections_and_bad_input() {
    let j = render(&dump(), Section::Clusters, Output::Json).expect("json");
    assert!(j.contains("\"dynamic_active_clusters\""), "{j}");
    let err = EnvoyDump::parse(b"{\"not\": 1}").expect_err("no configs");
    assert_eq!(err.reason(), "not_a_dump");
    assert!(EnvoyDump::parse(b"garbage").is_err());
}
