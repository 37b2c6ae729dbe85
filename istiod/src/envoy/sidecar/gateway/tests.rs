//! Gateway proxies: servers and bound VirtualServices become listeners, routes and virtual
//! hosts with Istio's names; what is not supported is reported; real Envoy accepts the result.

use mesh_api::IstioGateway;
use mesh_proto::envoy::pb::envoy::config::route::v3::{route, route_action, RouteConfiguration};

use super::super::super::tests::{decode, envoy_or_skip, envoy_validates};
use super::super::tests::{inline_routes, listener, outbound_inputs};
use super::super::{generate_gateway, generate_outbound};
use super::*;
use crate::envoy::ProxyResources;
use mesh_proto::envoy::pb::envoy::config::listener::v3::Listener;
use prost::Message;

const GATEWAY: &str = r#"
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*"]
  - port: {number: 81, name: http-redirect, protocol: HTTP}
    hosts: ["shop/*.example.com"]
    tls: {httpsRedirect: true}
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: ["*"]
    tls: {mode: SIMPLE, credentialName: cert}
  - port: {number: 9000, name: tcp, protocol: TCP}
    hosts: ["*"]
  - port: {number: 82, name: http-empty, protocol: HTTP}
    hosts: ["nothing.example.org"]
"#;

/// A VirtualService for the life of the test binary (the inputs borrow their VirtualServices).
fn vs(yaml: &str) -> &'static VirtualService {
    Box::leak(Box::new(serde_yaml::from_str(yaml).expect("vs")))
}

/// The sidecar tests' services as the gateway's namespace sees them, made once.
fn shared_outbound() -> &'static WaypointInputs {
    static OUTBOUND: std::sync::OnceLock<WaypointInputs> = std::sync::OnceLock::new();
    OUTBOUND.get_or_init(outbound_inputs)
}

fn gateway_inputs() -> GatewayInputs<'static> {
    let gw: IstioGateway = serde_yaml::from_str(GATEWAY).expect("gateway");
    let servers = (gw.spec.servers.iter().enumerate())
        .map(|(index, server)| BoundServer {
            gateway: "istio-system/ingress".into(),
            index,
            server: server.clone(),
            listen_port: match server.port.as_ref().map_or(0, |p| p.number) {
                80 => 8080,
                n => u16::try_from(n).expect("port"),
            },
        })
        .collect();
    let tls = tls_files();
    let (cert, key) = tls.server_pem();
    let credential = Credential {
        cert_chain: cert.as_bytes().to_vec(),
        key: key.as_bytes().to_vec(),
        ca: Some(tls.ca_pem().as_bytes().to_vec()),
    };
    GatewayInputs {
        outbound: shared_outbound(),
        servers,
        credentials: BTreeMap::from([("cert".to_string(), Ok(credential))]),
        virtual_services: vec![
            vs("metadata: {name: echo-gw, namespace: shop}\nspec:\n  hosts: [echo.example.com]\n  gateways: [istio-system/ingress]\n  http:\n  - match: [{uri: {prefix: /v2}}]\n    route: [{destination: {host: echo, subset: v1, port: {number: 80}}}]\n  - route: [{destination: {host: echo.shop.svc.cluster.local, port: {number: 80}}}]\n"),
            // Bare `ingress` is shop's own (there is none): not bound.
            vs("metadata: {name: elsewhere, namespace: shop}\nspec:\n  hosts: [other.example.com]\n  gateways: [ingress]\n  http:\n  - route: [{destination: {host: echo}}]\n"),
            // Newer, for the same host: merged behind the older one.
            vs("metadata: {name: echo-dup, namespace: shop}\nspec:\n  hosts: [echo.example.com]\n  gateways: [istio-system/ingress, mesh]\n  http:\n  - route: [{destination: {host: echo-v2, port: {number: 80}}}]\n"),
        ],
    }
}

/// A CA and a server certificate for `echo.example.com`, made once per test binary.
fn tls_files() -> &'static mesh_testutil::TlsFiles {
    static FILES: std::sync::OnceLock<(tempfile::TempDir, mesh_testutil::TlsFiles)> =
        std::sync::OnceLock::new();
    let (_, files) = FILES.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tls dir");
        let files = mesh_testutil::TlsFiles::generate(dir.path(), "gateway-ca", "echo.example.com");
        (dir, files)
    });
    files
}

/// The TLS context of a listener's first filter chain.
fn tls_context(
    l: &Listener,
) -> mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext {
    use mesh_proto::envoy::pb::envoy::config::core::v3::transport_socket::ConfigType;
    let socket = l.filter_chains[0].transport_socket.clone().expect("tls");
    let Some(ConfigType::TypedConfig(any)) = socket.config_type else {
        panic!("typed config");
    };
    Message::decode(any.value.as_slice()).expect("context")
}

fn gateway() -> ProxyResources {
    let inputs = gateway_inputs();
    let outbound = generate_outbound(inputs.outbound, 1);
    generate_gateway(&outbound, &inputs, 2)
}

#[test]
fn servers_become_listeners_and_bound_virtual_services_their_hosts() {
    let res = gateway();
    let mut listeners: Vec<&String> = res.by_type[type_url::LISTENER].keys().collect();
    listeners.sort();
    assert_eq!(
        listeners,
        [
            "0.0.0.0_443",
            "0.0.0.0_8080",
            "0.0.0.0_81",
            "0.0.0.0_82",
            names::CONNECT_ORIGINATE
        ],
        "a listener per port of an HTTP server (80 at its target port), the HBONE one, none of a sidecar's"
    );
    let routes: Vec<RouteConfiguration> = decode(&res, type_url::ROUTE);
    let rc = |name: &str| {
        (routes.iter().find(|r| r.name == name)).unwrap_or_else(|| panic!("route {name}"))
    };
    let http = rc("http.8080");
    assert!(http.ignore_port_in_host_matching);
    let hosts: Vec<(&str, Vec<String>)> = (http.virtual_hosts.iter())
        .map(|v| (v.name.as_str(), v.domains.clone()))
        .collect();
    assert_eq!(
        hosts,
        [("echo.example.com:80", vec!["echo.example.com".to_string()])]
    );
    let clusters: Vec<String> = (http.virtual_hosts[0].routes.iter())
        .filter_map(|r| match &r.action {
            Some(route::Action::Route(a)) => match &a.cluster_specifier {
                Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    // echo-dup's routes merge behind echo-gw's, the match-everything ones last.
    assert_eq!(
        clusters,
        [
            "outbound|80|v1|echo.shop.svc.cluster.local",
            "outbound|80||echo.shop.svc.cluster.local",
            "outbound|80||echo-v2.shop.svc.cluster.local"
        ]
    );
    // `shop/*.example.com` takes shop's VirtualService and redirects to HTTPS.
    let redirect = &rc("http.81").virtual_hosts;
    assert_eq!(redirect[0].name, "echo.example.com:81");
    assert_eq!(redirect[0].require_tls, TlsRequirementType::All as i32);
    // A port whose hosts no VirtualService names: 404 for everything.
    let empty = &rc("http.82").virtual_hosts;
    assert_eq!(
        (
            empty[0].name.as_str(),
            empty[0].domains.clone(),
            empty[0].routes.len()
        ),
        ("blackhole:82", vec!["*".to_string()], 0)
    );
    // Clusters and endpoints as the namespace's sidecars have them.
    assert!(res.by_type[type_url::CLUSTER].contains_key("outbound|80||echo.shop.svc.cluster.local"));
    assert!(
        res.by_type[type_url::ENDPOINT].contains_key("outbound|80||echo.shop.svc.cluster.local")
    );
    // HTTPS on 443: TLS with the credential by SDS over ADS, its own routes.
    let https = listener(&res, "0.0.0.0_443");
    assert_eq!(
        https.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    assert_eq!(https.filter_chains.len(), 1);
    let ctx = tls_context(&https);
    let common = ctx.common_tls_context.expect("common");
    assert_eq!(
        common.tls_certificate_sds_secret_configs[0].name,
        "kubernetes://cert"
    );
    assert!(common.validation_context_type.is_none() && ctx.require_client_certificate.is_none());
    assert_eq!(
        rc("https.443.https.ingress.istio-system").virtual_hosts[0].name,
        "echo.example.com:443"
    );
    let secrets = &res.by_type[type_url::SECRET];
    assert!(secrets.contains_key("kubernetes://cert"));
    assert!(
        !secrets.contains_key("kubernetes://cert-cacert"),
        "SIMPLE needs no CA"
    );
    let errors: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with("Gateway istio-system/ingress: spec.servers[3].port.protocol: \"TCP\" servers are not supported"),
        "{errors:#?}"
    );
}

#[test]
fn mutual_tls_needs_the_credentials_ca_and_a_missing_credential_leaves_the_server_out() {
    let mut inputs = gateway_inputs();
    let tls = inputs.servers[2].server.tls.as_mut().expect("tls");
    tls.mode = Some("MUTUAL".into());
    let outbound = generate_outbound(inputs.outbound, 1);
    let res = generate_gateway(&outbound, &inputs, 2);
    let secrets = &res.by_type[type_url::SECRET];
    assert!(secrets.contains_key("kubernetes://cert-cacert"));
    let https = listener(&res, "0.0.0.0_443");
    let ctx = tls_context(&https);
    assert_eq!(ctx.require_client_certificate.map(|b| b.value), Some(true));
    assert!(ctx
        .common_tls_context
        .expect("common")
        .validation_context_type
        .is_some());
    // Without the Secret: reported, and no listener rather than one Envoy would keep warming.
    inputs.credentials.clear();
    let res = generate_gateway(&outbound, &inputs, 3);
    assert!(!res.by_type[type_url::LISTENER].contains_key("0.0.0.0_443"));
    let errors: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("spec.servers[2].tls.credentialName")
                && e.contains("no Secret cert")),
        "{errors:#?}"
    );
}

#[test]
fn matches_name_their_port_and_gateway_and_overlapping_tls_hosts_are_refused() {
    let mut inputs = gateway_inputs();
    // A match only for the mesh, one only for port 81: on 80 neither applies.
    inputs.virtual_services = vec![vs(
        "metadata: {name: scoped, namespace: shop}\nspec:\n  hosts: [echo.example.com]\n  gateways: [istio-system/ingress, mesh]\n  http:\n  - match: [{gateways: [mesh], uri: {prefix: /mesh}}]\n    route: [{destination: {host: echo-v2, port: {number: 80}}}]\n  - match: [{port: 81, uri: {prefix: /81}}]\n    route: [{destination: {host: echo-v2, port: {number: 80}}}]\n  - route: [{destination: {host: echo, port: {number: 80}}}]\n",
    )];
    // A second TLS server on 443 for a host the first (`*`) also takes, and a third naming
    // one host of a fourth.
    let mut second = inputs.servers[2].clone();
    second.index = 9;
    second.server.hosts = vec!["*".into()];
    let mut named = inputs.servers[2].clone();
    named.index = 10;
    named.listen_port = 444;
    named.server.hosts = vec!["a.example.com".into(), "b.example.com".into()];
    if let Some(p) = named.server.port.as_mut() {
        p.name = "https-a".into();
    }
    let mut overlapping = named.clone();
    overlapping.index = 11;
    overlapping.server.hosts = vec!["b.example.com".into()];
    if let Some(p) = overlapping.server.port.as_mut() {
        p.name = "https-b".into();
    }
    inputs.servers.extend([second, named, overlapping]);
    let outbound = generate_outbound(inputs.outbound, 1);
    let res = generate_gateway(&outbound, &inputs, 2);
    let routes: Vec<RouteConfiguration> = decode(&res, type_url::ROUTE);
    let on_80 = (routes.iter().find(|r| r.name == "http.8080")).expect("http.8080");
    let names: Vec<&str> = (on_80.virtual_hosts[0].routes.iter())
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["shop/scoped.2.0"], "only the unscoped route on 80");
    let on_81 = (routes.iter().find(|r| r.name == "http.81")).expect("http.81");
    assert_eq!(
        on_81.virtual_hosts[0].routes.len(),
        2,
        "the port-81 match applies on 81"
    );
    let errors: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    for index in [9, 11] {
        let needle = format!("spec.servers[{index}].hosts: another TLS server on port");
        assert!(
            errors.iter().any(|e| e.contains(&needle)),
            "{needle}\n{errors:#?}"
        );
    }
    let on_444 = listener(&res, "0.0.0.0_444");
    assert_eq!(on_444.filter_chains.len(), 1);
}

#[test]
fn gateway_names_and_hosts_resolve_as_istio_resolves_them() {
    let v = |gateways: &str| {
        vs(&format!(
            "metadata: {{name: v, namespace: shop}}\nspec:\n  gateways: {gateways}\n"
        ))
    };
    for (gateways, bound) in [
        ("[istio-system/ingress]", true),
        ("[ingress]", false),
        ("[./ingress]", false),
        ("[ingress.istio-system.svc.cluster.local]", true),
        ("[mesh]", false),
    ] {
        assert_eq!(
            binds(v(gateways), "shop", "istio-system/ingress"),
            bound,
            "{gateways}"
        );
    }
    assert!(binds(v("[./gw]"), "shop", "shop/gw"));
    assert_eq!(
        server_host("shop/a.example.com", "shop", "istio-system/gw"),
        Some("a.example.com")
    );
    assert_eq!(
        server_host("shop/a.example.com", "other", "istio-system/gw"),
        None
    );
    assert_eq!(
        server_host("./a", "istio-system", "istio-system/gw"),
        Some("a")
    );
    assert_eq!(server_host("*/a", "x", "istio-system/gw"), Some("a"));
    assert_eq!(intersect("*", "a.example.com"), Some("a.example.com"));
    assert_eq!(
        intersect("*.example.com", "a.example.com"),
        Some("a.example.com")
    );
    assert_eq!(
        intersect("a.example.com", "*.example.com"),
        Some("a.example.com")
    );
    assert_eq!(intersect("a.example.com", "b.example.com"), None);
    assert_eq!(
        qualify("echo", "shop", "cluster.local"),
        "echo.shop.svc.cluster.local"
    );
}

#[test]
fn envoy_validates_the_generated_gateway_config() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    envoy_validates(&envoy, &inline_routes(&gateway()));
}
