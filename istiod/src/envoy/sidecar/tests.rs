//! The sidecar generators: Istio's names and shapes, the PeerAuthentication modes, principals
//! from the connection, and `envoy --mode validate` on the whole configuration.

use std::collections::BTreeMap;
use std::sync::Arc;

use mesh_proto::envoy::pb::envoy::config::cluster::v3::Cluster;
use mesh_proto::envoy::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use mesh_proto::envoy::pb::envoy::config::listener::v3::{filter::ConfigType, Listener};
use mesh_proto::envoy::pb::envoy::config::route::v3::RouteConfiguration;
use mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use mesh_proto::type_url;
use mesh_xds::Resource;
use prost::Message;

use super::super::tests::{
    decode, endpoint, envoy_or_skip, envoy_validates, inputs, policy, service,
};
use super::super::{Flavor, Protocol, ProxyResources, WaypointInputs, WaypointKey};
use super::*;

const DR_SUBSETS: &str = r#"
metadata: {name: echo, namespace: shop}
spec:
  host: echo
  subsets:
  - {name: v1, labels: {version: v1}}
"#;

const ALLOW_FRONTEND: &str = r#"
metadata: {name: allow-frontend, namespace: shop}
spec:
  selector: {matchLabels: {app: echo}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/shop/sa/frontend"]}}]
"#;

/// The waypoint test services as the sidecars of `shop` see them.
pub(super) fn outbound_inputs() -> WaypointInputs {
    let mut inp = inputs();
    inp.flavor = Flavor::Sidecar {
        send_hbone: true,
        registry_only: false,
    };
    inp.key = WaypointKey {
        namespace: "shop".into(),
        name: String::new(),
    };
    for s in &mut inp.services {
        s.policies.clear();
        s.request_authns.clear();
    }
    inp.services[0].destination_rule =
        Some(Arc::new(serde_yaml::from_str(DR_SUBSETS).expect("dr")));
    let mut db = service("db", "10.96.0.20", vec![endpoint("10.1.0.9", "v3")]);
    db.ports.retain(|p| p.protocol == Protocol::Tcp);
    inp.services.push(db);
    // A waypoint's Service: HBONE on 15008 and its status port, both the sidecar's own ports.
    let mut waypoint = service("waypoint", "10.96.0.50", vec![]);
    for (p, name) in waypoint.ports.iter_mut().zip(["mesh", "status-port"]) {
        p.port = if name == "mesh" { 15008 } else { 15021 };
        p.name = Some(name.into());
        p.protocol = Protocol::Http;
    }
    inp.services.push(waypoint);
    inp
}

fn sidecar_inputs(mode: PeerMode, port_modes: &[(u16, PeerMode)]) -> SidecarInputs {
    SidecarInputs {
        key: SidecarKey {
            namespace: "shop".into(),
            name: "echo-v1-abc".into(),
        },
        trust_domain: "cluster.local".into(),
        ports: vec![
            InboundPort {
                port: 8080,
                protocol: Protocol::Http,
                service: Some("echo.shop.svc.cluster.local".into()),
                endpoint: InboundEndpoint::OriginalDestination,
            },
            InboundPort {
                port: 9000,
                protocol: Protocol::Tcp,
                service: Some("echo.shop.svc.cluster.local".into()),
                endpoint: InboundEndpoint::OriginalDestination,
            },
        ],
        mode,
        port_modes: port_modes.iter().copied().collect::<BTreeMap<_, _>>(),
        port_modes_from: (!port_modes.is_empty()).then(|| "shop/echo".to_string()),
        hbone: true,
        access_log_file: String::new(),
        policies: vec![policy(ALLOW_FRONTEND)],
        request_authns: Vec::new(),
    }
}

fn generate(mode: PeerMode, port_modes: &[(u16, PeerMode)]) -> ProxyResources {
    let out = generate_outbound(&outbound_inputs(), 1);
    generate_sidecar(&out, &sidecar_inputs(mode, port_modes), 2)
}

pub(super) fn listener(res: &ProxyResources, name: &str) -> Listener {
    let all: Vec<Listener> = decode(res, type_url::LISTENER);
    all.into_iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

fn hcm_of(l: &Listener, chain: usize) -> HttpConnectionManager {
    let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[chain].filters[0].config_type else {
        panic!("no typed config");
    };
    Message::decode(any.value.as_slice()).expect("hcm")
}

/// `(chain name, port, transport protocol, ALPN, terminates TLS)` of every chain.
fn chains(l: &Listener) -> Vec<(String, Option<u32>, String, usize, bool)> {
    l.filter_chains
        .iter()
        .map(|c| {
            let m = c.filter_chain_match.clone().unwrap_or_default();
            (
                c.name.clone(),
                m.destination_port.map(|p| p.value),
                m.transport_protocol,
                m.application_protocols.len(),
                c.transport_socket.is_some(),
            )
        })
        .collect()
}

#[test]
fn outbound_side_has_istios_names() {
    let res = generate(PeerMode::Permissive, &[]);
    let listeners: Vec<&String> = res.get(type_url::LISTENER).expect("lds").keys().collect();
    assert_eq!(
        listeners,
        [
            "0.0.0.0_80",
            "10.96.0.10_9000",
            "10.96.0.11_9000",
            "10.96.0.12_9000",
            "10.96.0.20_9000",
            // The waypoint's 15008 and 15021 are the proxy's own ports: TCP on the address.
            "10.96.0.50_15008",
            "10.96.0.50_15021",
            "connect_originate",
            "connect_terminate",
            "main_internal",
            "virtualInbound",
            "virtualOutbound",
        ]
    );
    let clusters = res.get(type_url::CLUSTER).expect("cds");
    for name in [
        "PassthroughCluster",
        "BlackHoleCluster",
        "InboundPassthroughCluster",
        "outbound|80||echo.shop.svc.cluster.local",
        "outbound|80|v1|echo.shop.svc.cluster.local",
        "outbound|9000||db.shop.svc.cluster.local",
        "inbound|8080||",
        "inbound|9000||",
    ] {
        assert!(clusters.contains_key(name), "missing cluster {name}");
    }
    let vo = listener(&res, "virtualOutbound");
    assert_eq!(vo.use_original_dst.map(|b| b.value), Some(true));
    assert_eq!(
        chains(&vo),
        [
            (
                "virtualOutbound-blackhole".into(),
                Some(15001),
                String::new(),
                0,
                false
            ),
            (
                "virtualOutbound-catchall-tcp".into(),
                None,
                String::new(),
                0,
                false
            ),
        ]
    );
    let http = listener(&res, "0.0.0.0_80");
    assert_eq!(http.bind_to_port.map(|b| b.value), Some(false));
    match hcm_of(&http, 0).route_specifier {
        Some(RouteSpecifier::Rds(r)) => assert_eq!(r.route_config_name, "80"),
        other => panic!("not RDS: {other:?}"),
    }
    let routes: Vec<RouteConfiguration> = decode(&res, type_url::ROUTE);
    let rc = routes.iter().find(|r| r.name == "80").expect("route 80");
    let hosts: Vec<&str> = rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        hosts,
        [
            "echo.shop.svc.cluster.local:80",
            "echo-v1.shop.svc.cluster.local:80",
            "echo-v2.shop.svc.cluster.local:80",
            "allow_any",
        ]
    );
    let echo = &rc.virtual_hosts[0];
    for d in [
        "echo",
        "echo:80",
        "echo.shop",
        "echo.shop.svc",
        "10.96.0.10:80",
    ] {
        assert!(
            echo.domains.iter().any(|x| x == d),
            "{d} in {:?}",
            echo.domains
        );
    }
    // The HTTPRoute's split targets the outbound clusters.
    let text = format!("{echo:?}");
    assert!(
        text.contains("outbound|80||echo-v1.shop.svc.cluster.local"),
        "{text}"
    );
}

#[test]
fn endpoints_with_a_sidecar_get_istio_mutual_tls() {
    let res = generate(PeerMode::Permissive, &[]);
    let clusters: Vec<Cluster> = decode(&res, type_url::CLUSTER);
    let echo = clusters
        .iter()
        .find(|c| c.name == "outbound|80||echo.shop.svc.cluster.local")
        .expect("echo");
    let names: Vec<&str> = echo
        .transport_socket_matches
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(names, ["hbone", "tlsMode-istio", "tlsMode-disabled"]);
    use mesh_proto::envoy::pb::envoy::config::core::v3::transport_socket::ConfigType as TsConfig;
    use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let Some(TsConfig::TypedConfig(any)) = echo.transport_socket_matches[1]
        .transport_socket
        .as_ref()
        .and_then(|t| t.config_type.clone())
    else {
        panic!("no TLS context");
    };
    let tls = UpstreamTlsContext::decode(any.value.as_slice()).expect("tls context");
    assert_eq!(tls.sni, "outbound_.80_._.echo.shop.svc.cluster.local");
    let common = tls.common_tls_context.expect("common");
    assert_eq!(common.alpn_protocols, ["istio-peer-exchange", "istio"]);
    let sans = format!("{:?}", common.validation_context_type);
    assert!(
        sans.contains("spiffe://cluster.local/ns/shop/sa/echo"),
        "{sans}"
    );
    let eds: Vec<ClusterLoadAssignment> = decode(&res, type_url::ENDPOINT);
    let cla = eds
        .iter()
        .find(|c| c.cluster_name == "outbound|80||echo.shop.svc.cluster.local")
        .expect("eds");
    let eps: Vec<String> = cla.endpoints[0]
        .lb_endpoints
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    // v1 has a sidecar (which also takes HBONE: mutual TLS wins), v2 has neither; both are
    // reached at their pod address.
    assert!(
        eps[0].contains("10.1.0.5") && eps[0].contains("\"istio\""),
        "{}",
        eps[0]
    );
    assert!(
        eps[1].contains("10.1.0.6") && eps[1].contains("\"disabled\""),
        "{}",
        eps[1]
    );
    // db's pod is in ambient: HBONE through connect_originate, to its address.
    let db = eds
        .iter()
        .find(|c| c.cluster_name == "outbound|9000||db.shop.svc.cluster.local")
        .expect("db eds");
    let ep = format!("{:?}", db.endpoints[0].lb_endpoints[0]);
    assert!(
        ep.contains("connect_originate")
            && ep.contains("10.1.0.9:9000")
            && ep.contains("\"tunnel\""),
        "{ep}"
    );
}

#[test]
fn inbound_chains_follow_the_peer_authentication_mode() {
    let strict = listener(&generate(PeerMode::Strict, &[]), "virtualInbound");
    assert_eq!(
        chains(&strict),
        [
            (
                "virtualInbound-blackhole".into(),
                Some(15006),
                String::new(),
                0,
                false
            ),
            (
                "0.0.0.0_8080-mtls".into(),
                Some(8080),
                "tls".into(),
                0,
                true
            ),
            (
                "0.0.0.0_8080-refused".into(),
                Some(8080),
                String::new(),
                0,
                false
            ),
            (
                "0.0.0.0_9000-mtls".into(),
                Some(9000),
                "tls".into(),
                0,
                true
            ),
            (
                "0.0.0.0_9000-refused".into(),
                Some(9000),
                String::new(),
                0,
                false
            ),
            ("virtualInbound-mtls".into(), None, "tls".into(), 0, true),
            (
                "virtualInbound-refused".into(),
                None,
                String::new(),
                0,
                false
            ),
        ]
    );
    let permissive = listener(&generate(PeerMode::Permissive, &[]), "virtualInbound");
    let c = chains(&permissive);
    assert_eq!(
        c[1],
        (
            "0.0.0.0_8080-mtls".into(),
            Some(8080),
            "tls".into(),
            5,
            true
        )
    );
    assert_eq!(
        c[2],
        ("0.0.0.0_8080".into(), Some(8080), String::new(), 0, false)
    );
    // Port-level DISABLE on a STRICT workload; a port it does not serve is reported.
    let res = generate(
        PeerMode::Strict,
        &[(9000, PeerMode::Disable), (7777, PeerMode::Strict)],
    );
    let mixed = chains(&listener(&res, "virtualInbound"));
    assert!(mixed.contains(&("0.0.0.0_9000".into(), Some(9000), String::new(), 0, false)));
    assert!(mixed.contains(&(
        "0.0.0.0_8080-refused".into(),
        Some(8080),
        String::new(),
        0,
        false
    )));
    let errors: Vec<String> = res.errors.iter().map(|e| e.to_string()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("port 7777") && e.contains("shop/echo")),
        "{errors:?}"
    );
}

#[test]
fn inbound_http_carries_the_client_identity_and_checks_principals_on_the_connection() {
    let res = generate(PeerMode::Permissive, &[]);
    let inbound = listener(&res, "virtualInbound");
    let hcm = hcm_of(&inbound, 1);
    assert_eq!(
        hcm.forward_client_cert_details,
        mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::ForwardClientCertDetails::AppendForward as i32
    );
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["envoy.filters.http.rbac.allow", "envoy.filters.http.router"]
    );
    let rbac = format!("{:?}", hcm.http_filters[0]);
    let bytes = hcm.http_filters[0].encode_to_vec();
    assert!(
        String::from_utf8_lossy(&bytes).contains("spiffe://cluster.local/ns/shop/sa/frontend"),
        "{rbac}"
    );
    assert!(
        !String::from_utf8_lossy(&bytes).contains("io.istio.peer_principal"),
        "principals come from the connection's certificate"
    );
    // Plain-text chains do not trust a forwarded identity.
    let plain = hcm_of(&inbound, 2);
    assert_eq!(
        plain.forward_client_cert_details,
        mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::ForwardClientCertDetails::Sanitize as i32
    );
}

#[test]
fn the_outbound_side_is_shared_and_stable() {
    let out = generate_outbound(&outbound_inputs(), 1);
    let again = generate_outbound(&outbound_inputs(), 5);
    assert!(out.same_content(&again));
    let a = generate_sidecar(&out, &sidecar_inputs(PeerMode::Strict, &[]), 2);
    let b = generate_sidecar(&out, &sidecar_inputs(PeerMode::Permissive, &[]), 2);
    assert!(!a.same_content(&b));
    let cds_a = a.get(type_url::CLUSTER).expect("cds");
    let cds_out = out.get(type_url::CLUSTER).expect("cds");
    for (name, r) in cds_out {
        assert!(
            Arc::ptr_eq(r, &cds_a[name]),
            "{name} is shared, not re-encoded"
        );
    }
}

/// Listeners with RDS get their route configuration inline, as `--mode validate` has no ADS.
pub(super) fn inline_routes(res: &ProxyResources) -> ProxyResources {
    let routes: Vec<RouteConfiguration> = decode(res, type_url::ROUTE);
    let mut out = res.clone();
    let lds = out.by_type.get_mut(type_url::LISTENER).expect("lds");
    for (name, r) in lds.clone() {
        let mut l = Listener::decode(r.body.value.as_slice()).expect("listener");
        for chain in &mut l.filter_chains {
            for f in &mut chain.filters {
                let Some(ConfigType::TypedConfig(any)) = &mut f.config_type else {
                    continue;
                };
                if !any.type_url.ends_with(".HttpConnectionManager") {
                    continue;
                }
                let mut hcm = HttpConnectionManager::decode(any.value.as_slice()).expect("hcm");
                if let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier {
                    let rc = routes
                        .iter()
                        .find(|r| r.name == rds.route_config_name)
                        .expect("route of rds")
                        .clone();
                    hcm.route_specifier = Some(RouteSpecifier::RouteConfig(rc));
                    any.value = hcm.encode_to_vec();
                }
            }
        }
        let body = l.encode_to_vec();
        lds.insert(
            name.clone(),
            Arc::new(Resource::from_encoded(
                type_url::LISTENER,
                name,
                Vec::new(),
                body,
            )),
        );
    }
    out
}

#[test]
fn envoy_validates_the_generated_sidecar_config() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    for mode in [PeerMode::Strict, PeerMode::Permissive, PeerMode::Disable] {
        let res = generate(mode, &[(9000, PeerMode::Disable)]);
        envoy_validates(&envoy, &inline_routes(&res));
    }
}

/// `REGISTRY_ONLY` and a Sidecar's ingress endpoints, as Istio writes them.
fn registry_only_with_ingress_endpoints() -> ProxyResources {
    let mut inp = outbound_inputs();
    inp.flavor = Flavor::Sidecar {
        send_hbone: true,
        registry_only: true,
    };
    let out = generate_outbound(&inp, 1);
    let mut side = sidecar_inputs(PeerMode::Permissive, &[]);
    side.ports[0].endpoint = InboundEndpoint::Socket("127.0.0.1:8081".parse().expect("addr"));
    side.ports[1].endpoint = InboundEndpoint::Unix("/var/run/echo.sock".into());
    generate_sidecar(&out, &side, 2)
}

#[test]
fn registry_only_blocks_unknown_destinations_and_ingress_endpoints_are_static() {
    use mesh_proto::envoy::pb::envoy::config::cluster::v3::cluster::{
        ClusterDiscoveryType, DiscoveryType,
    };
    use mesh_proto::envoy::pb::envoy::config::core::v3::address;
    use mesh_proto::envoy::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    use mesh_proto::envoy::pb::envoy::config::route::v3::route::Action;
    use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        tcp_proxy, TcpProxy,
    };
    let res = registry_only_with_ingress_endpoints();
    let vo = listener(&res, "virtualOutbound");
    let catch_all = vo.filter_chains.last().expect("catch-all chain");
    let Some(ConfigType::TypedConfig(any)) = &catch_all.filters[0].config_type else {
        panic!("typed tcp_proxy");
    };
    let tcp = TcpProxy::decode(any.value.as_slice()).expect("tcp_proxy");
    assert_eq!(
        tcp.cluster_specifier,
        Some(tcp_proxy::ClusterSpecifier::Cluster(
            "BlackHoleCluster".into()
        ))
    );
    let routes: Vec<RouteConfiguration> = decode(&res, type_url::ROUTE);
    assert!(!routes.is_empty());
    for rc in &routes {
        let last = rc.virtual_hosts.last().expect("virtual hosts");
        assert_eq!(
            (last.name.as_str(), last.domains.as_slice()),
            ("block_all", &["*".to_string()][..])
        );
        let Some(Action::DirectResponse(d)) = &last.routes[0].action else {
            panic!("{}: block_all answers itself", rc.name);
        };
        assert_eq!(d.status, 502);
    }
    let clusters: Vec<Cluster> = decode(&res, type_url::CLUSTER);
    let address_of = |name: &str| {
        let c = clusters.iter().find(|c| c.name == name).expect(name);
        assert_eq!(
            c.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            "{name}"
        );
        let la = c.load_assignment.clone().expect("endpoints");
        let Some(HostIdentifier::Endpoint(e)) =
            la.endpoints[0].lb_endpoints[0].host_identifier.clone()
        else {
            panic!("{name}: an endpoint");
        };
        (
            e.address.and_then(|a| a.address),
            c.upstream_bind_config.is_some(),
        )
    };
    match address_of("inbound|8080||") {
        (Some(address::Address::SocketAddress(sa)), true) => {
            assert_eq!(sa.address, "127.0.0.1");
        }
        other => panic!("8080: {other:?}"),
    }
    match address_of("inbound|9000||") {
        (Some(address::Address::Pipe(p)), false) => assert_eq!(p.path, "/var/run/echo.sock"),
        other => panic!("9000: {other:?}"),
    }
}

#[test]
fn envoy_validates_registry_only_and_ingress_endpoints() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    envoy_validates(
        &envoy,
        &inline_routes(&registry_only_with_ingress_endpoints()),
    );
}

/// `shop`'s sidecars with a DestinationRule on db whose policy is `tls` (YAML).
fn with_db_tls(tls: &str) -> ProxyResources {
    let mut inp = outbound_inputs();
    let dr = format!(
        "metadata: {{name: db, namespace: shop}}\nspec:\n  host: db\n  trafficPolicy:\n    tls: {tls}\n"
    );
    let db = inp
        .services
        .iter_mut()
        .find(|s| s.name == "db")
        .expect("db");
    db.destination_rule = Some(Arc::new(serde_yaml::from_str(&dr).expect("dr")));
    generate_outbound(&inp, 1)
}

/// db's cluster and its TLS context, printed.
fn db_tls(res: &ProxyResources) -> (Cluster, String) {
    use mesh_proto::envoy::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
    use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let clusters: Vec<Cluster> = decode(res, type_url::CLUSTER);
    let c = (clusters.into_iter())
        .find(|c| c.name == "outbound|9000||db.shop.svc.cluster.local")
        .expect("db cluster");
    let Some(SocketConfig::TypedConfig(any)) = c
        .transport_socket
        .as_ref()
        .and_then(|t| t.config_type.clone())
    else {
        panic!("db has one transport socket: {c:?}");
    };
    let ctx = UpstreamTlsContext::decode(any.value.as_slice()).expect("tls context");
    (c, format!("{ctx:?}"))
}

#[test]
fn destination_rule_simple_and_mutual_originate_tls_with_the_files() {
    let (c, tls) = db_tls(&with_db_tls(
        "{mode: SIMPLE, caCertificates: /etc/certs/ca.pem, sni: db.example.com, subjectAltNames: [db.example.com]}",
    ));
    assert!(
        c.transport_socket_matches.is_empty(),
        "no auto mutual TLS or HBONE"
    );
    for want in [
        "sni: \"db.example.com\"",
        "/etc/certs/ca.pem",
        "Exact(\"db.example.com\")",
    ] {
        assert!(tls.contains(want), "{want} in {tls}");
    }
    assert!(
        tls.contains("tls_certificates: []"),
        "SIMPLE has no client certificate: {tls}"
    );
    let res = with_db_tls(
        "{mode: MUTUAL, clientCertificate: /etc/certs/cert.pem, privateKey: /etc/certs/key.pem}",
    );
    let (_, tls) = db_tls(&res);
    for want in [
        "/etc/certs/cert.pem",
        "/etc/certs/key.pem",
        super::super::tls::SYSTEM_CA_BUNDLE,
        "sni: \"db.shop.svc.cluster.local\"",
    ] {
        assert!(tls.contains(want), "{want} in {tls}");
    }
    assert!(res.errors.is_empty(), "{:?}", res.errors);
    let (_, tls) = db_tls(&with_db_tls("{mode: SIMPLE, insecureSkipVerify: true}"));
    assert!(tls.contains("validation_context_type: None"), "{tls}");
    // MUTUAL without a certificate, or from a Secret: named, TLS still originated.
    let res = with_db_tls("{mode: MUTUAL, credentialName: db-client}");
    let errors: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("credentialName") && e.contains("shop/db")),
        "{errors:?}"
    );
    let res = with_db_tls("{mode: MUTUAL}");
    let errors: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("MUTUAL needs clientCertificate")),
        "{errors:?}"
    );
}

#[test]
fn envoy_validates_tls_origination_with_real_files() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let files = mesh_testutil::TlsFiles::generate(dir.path(), "test-ca", "db.example.com");
    let res = with_db_tls(&format!(
        "{{mode: MUTUAL, caCertificates: {}, clientCertificate: {}, privateKey: {}, sni: db.example.com}}",
        files.ca.display(),
        files.client_cert.display(),
        files.client_key.display()
    ));
    envoy_validates(&envoy, &inline_routes(&res));
}
