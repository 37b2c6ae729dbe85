//! DestinationRule, GRPCRoute and TCPRoute on the waypoint generators, and the result checked
//! by Envoy's `--mode validate`.

use std::sync::Arc;

use mesh_proto::envoy::pb::envoy::config::cluster::v3::Cluster;
use mesh_proto::envoy::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use mesh_proto::type_url;

use super::tests::{decode, envoy_or_skip, envoy_validates, inputs, main_chain, route_config};
use super::*;

const ECHO_RULE: &str = r#"
metadata: {name: echo, namespace: shop}
spec:
  host: echo.shop.svc.cluster.local
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    connectionPool:
      tcp: {maxConnections: 10, connectTimeout: 250ms}
      http: {http1MaxPendingRequests: 5, http2MaxRequests: 20, maxRetries: 2, maxRequestsPerConnection: 7, idleTimeout: 30s}
    outlierDetection: {consecutive5xxErrors: 3, interval: 5s, baseEjectionTime: 30s, maxEjectionPercent: 50}
    portLevelSettings:
    - port: {number: 9000}
      loadBalancer: {simple: RANDOM}
  subsets:
  - name: v1
    labels: {version: v1}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      loadBalancer:
        consistentHash: {httpHeaderName: x-user}
"#;

const SUBSET_VS: &str = r#"
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo]
  http:
  - match: [{headers: {x-user: {exact: beta}}}]
    route: [{destination: {host: echo, subset: v2}}]
  - route:
    - {destination: {host: echo, subset: v1}, weight: 80}
    - {destination: {host: echo, subset: v2}, weight: 20}
  - route: [{destination: {host: echo, subset: v9}}]
"#;

fn with_rule(yaml: &str) -> WaypointInputs {
    let mut inp = inputs();
    inp.services[0].routes.clear();
    inp.services[0].policies.clear();
    inp.services[0].destination_rule = Some(Arc::new(serde_yaml::from_str(yaml).expect("dr")));
    inp
}

fn cluster(res: &ProxyResources, name: &str) -> Cluster {
    let all: Vec<Cluster> = decode(res, type_url::CLUSTER);
    all.into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

const ECHO_HTTP: &str = "inbound-vip|80|http|echo.shop.svc.cluster.local";

#[test]
fn subsets_are_clusters_over_the_endpoints_whose_labels_match() {
    let res = generate_waypoint(&with_rule(ECHO_RULE), 1);
    assert!(res.errors.is_empty(), "{:?}", res.errors);
    let eds: Vec<ClusterLoadAssignment> = decode(&res, type_url::ENDPOINT);
    let ips = |name: &str| -> String {
        let cla = eds
            .iter()
            .find(|c| c.cluster_name == name)
            .unwrap_or_else(|| panic!("no eds {name}"));
        format!("{:?}", cla.endpoints[0].lb_endpoints)
    };
    let v1 = ips("inbound-vip|80|http/v1|echo.shop.svc.cluster.local");
    assert!(
        v1.contains("10.1.0.5:8080") && !v1.contains("10.1.0.6"),
        "{v1}"
    );
    let v2 = ips("inbound-vip|9000|tcp/v2|echo.shop.svc.cluster.local");
    assert!(
        v2.contains("10.1.0.6:9000") && !v2.contains("10.1.0.5"),
        "{v2}"
    );
    let all = ips(ECHO_HTTP);
    assert!(
        all.contains("10.1.0.5") && all.contains("10.1.0.6"),
        "{all}"
    );
}

#[test]
fn traffic_policy_sets_lb_limits_and_outlier_detection() {
    use mesh_proto::envoy::pb::envoy::config::cluster::v3::cluster::LbPolicy;
    let res = generate_waypoint(&with_rule(ECHO_RULE), 1);
    let c = cluster(&res, ECHO_HTTP);
    assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
    let t = &c.circuit_breakers.as_ref().expect("breakers").thresholds[0];
    let v = |x: &Option<mesh_proto::envoy::pb::google::protobuf::UInt32Value>| {
        x.as_ref().map(|v| v.value)
    };
    assert_eq!(v(&t.max_connections), Some(10));
    assert_eq!(v(&t.max_pending_requests), Some(5));
    assert_eq!(v(&t.max_requests), Some(20));
    assert_eq!(v(&t.max_retries), Some(2));
    assert_eq!(
        c.connect_timeout.as_ref().map(|d| d.nanos),
        Some(250_000_000)
    );
    let o = c.outlier_detection.as_ref().expect("outlier");
    assert_eq!(v(&o.consecutive_5xx), Some(3));
    assert_eq!(v(&o.enforcing_consecutive_5xx), Some(100));
    assert_eq!(v(&o.enforcing_success_rate), Some(0));
    assert_eq!(v(&o.max_ejection_percent), Some(50));
    assert_eq!(o.base_ejection_time.as_ref().map(|d| d.seconds), Some(30));
    let opts = format!("{:?}", c.typed_extension_protocol_options);
    assert!(opts.contains("HttpProtocolOptions"), "{opts}");
    // The port-level entry replaces the whole policy for port 9000: RANDOM, no limits.
    let tcp = cluster(&res, "inbound-vip|9000|tcp|echo.shop.svc.cluster.local");
    assert_eq!(tcp.lb_policy, LbPolicy::Random as i32);
    assert!(tcp.outlier_detection.is_none());
    let t = &tcp.circuit_breakers.as_ref().expect("breakers").thresholds[0];
    assert_eq!(v(&t.max_connections), Some(u32::MAX));
    // Subset v2's own load balancer wins over the rule's; the rest is inherited.
    let v2 = cluster(&res, "inbound-vip|80|http/v2|echo.shop.svc.cluster.local");
    assert_eq!(v2.lb_policy, LbPolicy::RingHash as i32);
    assert!(v2.outlier_detection.is_some());
    // Without a rule: Istio's defaults (least request, unlimited).
    let plain = cluster(&res, "inbound-vip|80|http|echo-v1.shop.svc.cluster.local");
    assert_eq!(plain.lb_policy, LbPolicy::LeastRequest as i32);
    assert!(plain.outlier_detection.is_none());
}

#[test]
fn virtual_service_subsets_route_to_subset_clusters_with_their_hash_policy() {
    let mut inp = with_rule(ECHO_RULE);
    inp.services[0].virtual_services = vec![Arc::new(serde_yaml::from_str(SUBSET_VS).expect("vs"))];
    let res = generate_waypoint(&inp, 1);
    let rc = route_config(&res, ECHO_HTTP);
    let routes = &rc.virtual_hosts[0].routes;
    let dump: Vec<String> = routes.iter().map(|r| format!("{:?}", r.action)).collect();
    assert!(
        dump[0].contains("inbound-vip|80|http/v2|echo.shop.svc.cluster.local")
            && dump[0].contains("x-user"),
        "the v2 route hashes on x-user: {}",
        dump[0]
    );
    assert!(
        dump[1].contains("http/v1|") && dump[1].contains("http/v2|"),
        "{}",
        dump[1]
    );
    // The undefined subset is reported and its route answers 500.
    assert!(dump[2].contains("DirectResponse"), "{}", dump[2]);
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("spec.http[2].route[0].destination.subset") && t.contains("v9")),
        "{text:#?}"
    );
}

#[test]
fn bad_destination_rule_fields_are_reported_and_defaults_kept() {
    let res = generate_waypoint(
        &with_rule(
            r#"
metadata: {name: bad, namespace: shop}
spec:
  host: echo
  trafficPolicy:
    loadBalancer: {simple: PASSTHROUGH}
    connectionPool: {tcp: {maxConnections: 0, connectTimeout: soon}}
    outlierDetection: {maxEjectionPercent: 150}
    tls: {mode: SIMPLE}
"#,
        ),
        1,
    );
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    for want in [
        "trafficPolicy.loadBalancer.simple",
        "trafficPolicy.connectionPool.tcp.maxConnections",
        "trafficPolicy.connectionPool.tcp.connectTimeout",
        "trafficPolicy.outlierDetection.maxEjectionPercent",
        "trafficPolicy.tls.mode",
    ] {
        assert!(
            text.iter()
                .any(|t| t.starts_with("DestinationRule shop/bad") && t.contains(want)),
            "{want}: {text:#?}"
        );
    }
    let c = cluster(&res, ECHO_HTTP);
    let t = &c.circuit_breakers.as_ref().expect("breakers").thresholds[0];
    assert_eq!(t.max_connections.as_ref().map(|v| v.value), Some(u32::MAX));
}

const GRPC_ROUTE: &str = r#"
metadata: {name: echo-grpc, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules:
  - matches: [{method: {service: echo.Echo, method: Say}}]
    backendRefs: [{name: echo-v2, port: 80}]
  - matches: [{method: {type: RegularExpression, service: "echo\\..*"}, headers: [{name: x-env, value: test}]}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-via, value: waypoint}]}}]
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{method: {type: RegularExpression, method: "(bad"}}]
    backendRefs: [{name: echo-v1, port: 80}]
"#;

#[test]
fn grpc_routes_match_the_method_path() {
    let mut inp = inputs();
    inp.services[0].routes.clear();
    inp.services[0].policies.clear();
    inp.services[0].grpc_routes = vec![Arc::new(
        serde_yaml::from_str(GRPC_ROUTE).expect("grpc route"),
    )];
    let res = generate_waypoint(&inp, 1);
    let rc = route_config(&res, ECHO_HTTP);
    let dump = format!("{:?}", rc.virtual_hosts[0].routes);
    assert!(dump.contains("Path(\"/echo.Echo/Say\")"), "{dump}");
    assert!(dump.contains(r#"/echo\\..*/[^/]+"#), "{dump}");
    assert!(dump.contains("x-via") && dump.contains("x-env"), "{dump}");
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 1, "{text:#?}");
    assert!(
        text[0].starts_with("GRPCRoute shop/echo-grpc: spec.rules[2].matches[0]"),
        "{text:#?}"
    );
}

#[test]
fn tcp_routes_pick_the_tcp_proxy_clusters() {
    use mesh_proto::envoy::pb::envoy::config::listener::v3::filter::ConfigType;
    use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use prost::Message;
    let mut inp = inputs();
    inp.services[0].policies.clear();
    inp.services[0].tcp_routes = vec![Arc::new(
        serde_yaml::from_str(
            r#"
metadata: {name: db, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 9000}]
  rules:
  - backendRefs: [{name: echo-v1, port: 9000, weight: 3}, {name: echo-v2, port: 9000, weight: 1}, {name: gone, port: 9000}]
"#,
        )
        .expect("tcp route"),
    )];
    let res = generate_waypoint(&inp, 1);
    let chain = main_chain(&res, "inbound-vip|9000|tcp|echo.shop.svc.cluster.local");
    let last = chain.filters.last().expect("tcp_proxy");
    let Some(ConfigType::TypedConfig(any)) = &last.config_type else {
        panic!("typed config");
    };
    let proxy = TcpProxy::decode(any.value.as_slice()).expect("tcp proxy");
    let dump = format!("{:?}", proxy.cluster_specifier);
    assert!(
        dump.contains("inbound-vip|9000|tcp|echo-v1.shop.svc.cluster.local")
            && dump.contains("weight: 3")
            && dump.contains("inbound-vip|9000|tcp|echo-v2.shop.svc.cluster.local"),
        "{dump}"
    );
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.starts_with("TCPRoute shop/db: spec.rules[0].backendRefs[2]")),
        "{text:#?}"
    );
}

#[test]
fn envoy_validates_destination_rules_and_grpc_and_tcp_routes() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    let mut inp = with_rule(ECHO_RULE);
    inp.services[0].virtual_services = vec![Arc::new(serde_yaml::from_str(SUBSET_VS).expect("vs"))];
    let mut grpc: mesh_api::GrpcRoute = serde_yaml::from_str(GRPC_ROUTE).expect("grpc");
    grpc.spec.parent_refs[0].name = "echo-v1".into();
    inp.services[1].grpc_routes = vec![Arc::new(grpc)];
    inp.services[0].tcp_routes = vec![Arc::new(
        serde_yaml::from_str(
            r#"
metadata: {name: db, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules: [{backendRefs: [{name: echo-v1, port: 9000}, {name: echo-v2, port: 9000}]}]
"#,
        )
        .expect("tcp"),
    )];
    let mut outlier: mesh_api::DestinationRule = serde_yaml::from_str(ECHO_RULE).expect("dr");
    outlier.spec.host = "echo-v2".into();
    outlier.spec.subsets.clear();
    if let Some(p) = outlier.spec.traffic_policy.as_mut() {
        p.load_balancer = Some(mesh_api::LoadBalancerSettings {
            consistent_hash: serde_yaml::from_str(
                "{maglev: {tableSize: 65537}, useSourceIp: true}",
            )
            .ok(),
            ..Default::default()
        });
        p.port_level_settings.clear();
    }
    inp.services[2].destination_rule = Some(Arc::new(outlier));
    let res = generate_waypoint(&inp, 1);
    envoy_validates(&envoy, &res);
}
