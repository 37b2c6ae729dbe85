//! Sidecars on the local mesh: pods of a namespace without ambient, injected by the real
//! injector, one captured by its `istio-init` step and one by cni-node at CNI ADD, each running
//! its `istio-proxy` container (`pilot-agent proxy sidecar`, the real Envoy 1.40, configured by
//! istiod), calling
//! each other over Istio mutual TLS, calling ambient pods and called by them over HBONE, with
//! PeerAuthentication and AuthorizationPolicy enforced at the receiving sidecar, a Sidecar
//! resource scoping what the calling one reaches, and an ingress gateway routing into both.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mesh_charts::{charts_dir, Helm, Rendered};
use mesh_e2e::cluster::{MeshCluster, MeshPod, PodSpec, Redirection};
use mesh_e2e::injection;
use mesh_e2e::waypoint::Waypoint;
use mesh_testutil::netns::have_root;
use mesh_testutil::{
    http_request, https_request, namespace_yaml, ClusterDir, HttpApp, HttpResponse, JwtIssuer,
    Netns, TlsFiles,
};

const APP_PORT: u16 = 8080;
const SERVER_VIP: &str = "10.96.0.30";
const AMBIENT_VIP: &str = "10.96.0.31";
const SECURE_VIP: &str = "10.96.0.32";
const SECURE_PORT: u16 = 8443;
const SECURE_NAME: &str = "secure.example.com";
const APP_METRICS_PORT: u16 = 9100;
const APP_METRIC: &str = "app_orders_total 7";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/legacy/sa/client";
const AMBIENT_CLIENT_ID: &str = "spiffe://cluster.local/ns/demo/sa/amb-client";
const INGRESS_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/ingress";
/// Where the ingress gateway's pod listens for its Gateway's port 80 (the targetPort its
/// Service is given).
const INGRESS_PORT: u16 = 8081;
/// Where it listens for the Gateway's port 443.
const INGRESS_TLS_PORT: u16 = 8444;

fn service(ns: &str, name: &str, vip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  clusterIP: {vip}\n  selector: {{app: {name}}}\n  ports:\n  - name: http\n    port: 80\n    targetPort: {APP_PORT}\n"
    )
}

/// The gateway chart rendered by the real Helm engine as `helm install ingress gateway -n
/// istio-system` with a ClusterIP Service whose port 80 goes to the pod's 8081.
fn gateway_chart() -> Rendered {
    let values = serde_json::json!({"service": {"type": "ClusterIP", "ports": [
        {"name": "http2", "port": 80, "protocol": "TCP", "targetPort": INGRESS_PORT},
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": INGRESS_TLS_PORT},
    ]}});
    Helm::default()
        .render(
            &charts_dir().join("gateway"),
            "ingress",
            "istio-system",
            &values,
        )
        .expect("the gateway chart renders")
}

/// An ingress gateway as Istio users install one: the chart's Service, a Gateway selecting its
/// pods (`istio: ingress`) on port 80 for every host and on 443 with TLS from the Secret
/// `ingress-cert` (a certificate of `tls` for server.example.com), and VirtualServices bound to
/// it by host: one to the sidecar server, one to the ambient service.
fn ingress_objects(dir: &ClusterDir, chart: &Rendered, tls: &TlsFiles) {
    let service = chart
        .get("Service", "ingress")
        .expect("the chart's Service");
    dir.write("ingress-svc.yaml", &service.value.to_string());
    let (cert, key) = tls.server_pem();
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "ingress-cert", "namespace": "istio-system"},
        "stringData": {"tls.crt": cert, "tls.key": key},
    });
    dir.write("ingress-cert.yaml", &secret.to_string());
    dir.write(
        "ingress.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: ingress\n  namespace: istio-system\nspec:\n  selector: {istio: ingress}\n  servers:\n  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: [\"*\"]\n  - port: {number: 443, name: https, protocol: HTTPS}\n    hosts: [\"*\"]\n    tls: {mode: SIMPLE, credentialName: ingress-cert}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: server-ingress\n  namespace: legacy\nspec:\n  hosts: [server.example.com]\n  gateways: [istio-system/ingress]\n  http:\n  - route: [{destination: {host: server, port: {number: 80}}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: amb-ingress\n  namespace: demo\nspec:\n  hosts: [amb.example.com]\n  gateways: [istio-system/ingress]\n  http:\n  - route: [{destination: {host: amb}}]\n",
    );
}

/// The gateway chart's Deployment as one of its pods, through the real injector (its
/// `gateway` template).
fn ingress_pod(chart: &Rendered) -> PodSpec {
    let deployment = chart
        .get("Deployment", "ingress")
        .expect("the chart's Deployment");
    let template = &deployment.value["spec"]["template"];
    let spec = PodSpec::new("istio-system", "ingress-7c9d-x1", "node1", "ingress");
    injection::injected_from_template(spec, template, &injection::ambient_values(false))
}

fn setup(dir: &ClusterDir) {
    dir.write(
        "ns.yaml",
        &namespace_yaml("legacy", &[("istio-injection", "enabled")]),
    );
    dir.write(
        "ns-demo.yaml",
        &namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
    );
    dir.write("svc-server.yaml", &service("legacy", "server", SERVER_VIP));
    dir.write("svc-amb.yaml", &service("demo", "amb", AMBIENT_VIP));
    // The outsider's HTTPS port, which callers reach in plain HTTP on 80: their sidecar
    // originates the TLS (DestinationRule SIMPLE / MUTUAL).
    dir.write(
        "svc-secure.yaml",
        &format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: secure\n  namespace: legacy\nspec:\n  clusterIP: {SECURE_VIP}\n  selector: {{app: outsider}}\n  ports:\n  - name: http\n    port: 80\n    targetPort: {SECURE_PORT}\n"),
    );
}

/// A pod of `legacy` through the real injector, with the ambient profile's proxy metadata
/// (`ISTIO_META_ENABLE_HBONE`: the injector adds the tunnel label, its sidecar takes HBONE);
/// with `cni`, cni-node writes its capture at CNI ADD (`istio-validation`), otherwise its
/// `istio-init` step does.
fn injected(name: &str, node: &str, cni: bool) -> PodSpec {
    let values = injection::ambient_values(cni);
    let spec = PodSpec::new("legacy", name, node, name)
        .annotation("prometheus.io/scrape", "true")
        .annotation("prometheus.io/port", &APP_METRICS_PORT.to_string())
        .annotation("prometheus.io/path", "/metrics");
    injection::injected(spec, &values)
}

fn get(netns: &Netns, addr: SocketAddr) -> Option<HttpResponse> {
    get_with(netns, addr, &[])
}

fn get_with(netns: &Netns, addr: SocketAddr, headers: &[(&str, &str)]) -> Option<HttpResponse> {
    http_request(netns, addr, "GET", "/", headers, Duration::from_secs(5))
}

/// A RequestAuthentication selecting the server makes its sidecar verify tokens; an ALLOW on
/// `requestPrincipals` then requires one: none is refused (403), a forged one too (401), a
/// valid one passes.
fn requires_a_token(m: &Mesh) {
    let issuer = JwtIssuer::new("https://issuer.example/legacy").expect("issuer");
    let impostor = JwtIssuer::new("https://issuer.example/legacy").expect("another key");
    m.cluster.objects().write(
        "authn.yaml",
        &format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata:\n  name: jwt\n  namespace: legacy\nspec:\n  selector: {{matchLabels: {{app: server}}}}\n  jwtRules:\n  - issuer: {}\n    jwks: '{}'\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: require-jwt\n  namespace: legacy\nspec:\n  selector: {{matchLabels: {{app: server}}}}\n  action: ALLOW\n  rules:\n  - from: [{{source: {{requestPrincipals: ['*']}}}}]\n",
            issuer.issuer(),
            issuer.jwks()
        ),
    );
    let bearer = |i: &JwtIssuer| {
        format!(
            "Bearer {}",
            i.token("alice", serde_json::json!({})).expect("token")
        )
    };
    let (good, forged) = (bearer(&issuer), bearer(&impostor));
    let status = |auth: Option<&str>| {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        get_with(&m.client.netns, vip(), &headers).map_or(0, |r| r.status)
    };
    // Connections accepted before the change keep their filter chain until Envoy has drained
    // it: wait for that too.
    let draining = || {
        m.server_proxy
            .stat("listener_manager.total_filter_chains_draining")
    };
    assert!(
        eventually(|| status(None) == 403 && draining() == 0),
        "a token is required\n{}",
        m.logs()
    );
    assert_eq!(status(Some(&forged)), 401, "a forged token is refused");
    assert_eq!(status(Some(&good)), 200, "a valid token passes");
    m.cluster.objects().remove("authn.yaml");
    assert!(
        eventually(|| status(None) == 200 && draining() == 0),
        "no token needed again"
    );
}

/// A Sidecar resource selecting the client: its own namespace only, REGISTRY_ONLY. The server
/// (in `legacy`) still answers; the ambient service (`demo`, not imported) gets 502 from the
/// client's sidecar (`block_all`), and a pod address that is no service is not passed
/// through. A VirtualService it imports brings its destination (the ambient service) along.
/// Removing it restores both.
fn sidecar_resource_scopes_the_client(m: &Mesh) {
    m.cluster.objects().write(
        "sidecar.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: client\n  namespace: legacy\nspec:\n  workloadSelector: {labels: {app: client}}\n  egress:\n  - hosts: [./*]\n  outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n",
    );
    let status = |addr| get(&m.client.netns, addr).map_or(0, |r| r.status);
    let scoped = eventually(|| {
        status(ambient_vip()) == 502 && get(&m.client.netns, m.outsider.addr(APP_PORT)).is_none()
    });
    assert!(
        scoped,
        "the client's sidecar blocks what its Sidecar does not import\n{}",
        m.logs()
    );
    assert_eq!(
        status(vip()),
        200,
        "its own namespace's service still answers"
    );
    let clusters = m.client_proxy.admin("/clusters?format=json");
    assert!(
        clusters.contains("outbound|80||server.legacy.svc.cluster.local")
            && !clusters.contains("outbound|80||amb.demo.svc.cluster.local"),
        "only legacy's service is configured"
    );
    // A VirtualService of legacy's (imported by `./*`) that sends some requests to the
    // ambient service brings that service into the scope with it.
    m.cluster.objects().write(
        "vs.yaml",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: server\n  namespace: legacy\nspec:\n  hosts: [server]\n  http:\n  - match: [{headers: {x-via: {exact: ambient}}}]\n    route: [{destination: {host: amb.demo.svc.cluster.local}}]\n  - route: [{destination: {host: server}}]\n",
    );
    let via_ambient = || {
        get_with(&m.client.netns, vip(), &[("x-via", "ambient")])
            .is_some_and(|r| r.status == 200 && r.body == "amb")
    };
    assert!(
        eventually(via_ambient),
        "the VirtualService's destination is reachable through it\n{}",
        m.logs()
    );
    assert!(
        (m.client_proxy.admin("/clusters?format=json"))
            .contains("outbound|80||amb.demo.svc.cluster.local"),
        "the ambient service is configured now"
    );
    m.cluster.objects().remove("vs.yaml");
    m.cluster.objects().remove("sidecar.yaml");
    let restored = eventually(|| {
        status(ambient_vip()) == 200
            && get(&m.client.netns, m.outsider.addr(APP_PORT)).is_some_and(|r| r.status == 200)
    });
    assert!(
        restored,
        "every service once the Sidecar is gone\n{}",
        m.logs()
    );
}

/// The client calls `secure` (the outsider's HTTPS server, which requires a client certificate
/// of its CA) in plain HTTP: without a DestinationRule its sidecar sends plain text, which the
/// server refuses; `SIMPLE` with the CA verifies the server but presents no certificate, still
/// refused; `MUTUAL` with the client certificate gets through.
fn destination_rule_originates_tls(m: &Mesh) {
    let secure = SocketAddr::from((SECURE_VIP.parse::<Ipv4Addr>().expect("vip"), 80));
    let status = || get(&m.client.netns, secure).map_or(0, |r| r.status);
    // Envoy's answer when the upstream breaks the exchange: 502 (not HTTP) or 503 (reset).
    let refused = || matches!(status(), 502 | 503);
    assert!(
        eventually(|| refused() && m.secure_app.tls_failures() > 0),
        "plain text to a TLS server fails: {:?}\n{}",
        get(&m.client.netns, secure),
        m.logs()
    );
    let dr = |tls: &str| {
        m.cluster.objects().write(
            "dr-secure.yaml",
            &format!("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: secure\n  namespace: legacy\nspec:\n  host: secure.legacy.svc.cluster.local\n  trafficPolicy:\n    tls: {tls}\n"),
        );
    };
    let ca = m.tls.ca.display().to_string();
    // The client sidecar's TLS counters for `secure`, read between the steps so each one
    // checks that its own settings are in force.
    let ssl = |what: &str| {
        let name = format!("cluster.outbound|80||secure.legacy.svc.cluster.local.ssl.{what}");
        let stats = m.client_proxy.admin("/stats?filter=secure\\.legacy");
        (stats.lines())
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut seen = Vec::new();
    let (failed_before, errors_before) = (m.secure_app.tls_failures(), ssl("connection_error"));
    dr(&format!(
        "{{mode: SIMPLE, caCertificates: {ca}, sni: {SECURE_NAME}}}"
    ));
    let simple_refused = eventually(|| {
        let st = status();
        seen.push(st);
        matches!(st, 502 | 503)
            && ssl("connection_error") > errors_before
            && m.secure_app.tls_failures() > failed_before
    });
    assert!(
        simple_refused,
        "SIMPLE: TLS without a client certificate, which the server refuses; statuses {seen:?}\n{}",
        m.logs()
    );
    dr(&format!(
        "{{mode: MUTUAL, caCertificates: {ca}, sni: {SECURE_NAME}, clientCertificate: {}, privateKey: {}}}",
        m.tls.client_cert.display(),
        m.tls.client_key.display()
    ));
    let through = eventually(|| {
        get(&m.client.netns, secure).is_some_and(|r| r.status == 200 && r.body == "secure")
    });
    assert!(
        through && ssl("handshake") > 0,
        "MUTUAL: TLS originated by the client's sidecar\n{}",
        m.logs()
    );
    // The server's name is checked: another SAN is refused.
    dr(&format!(
        "{{mode: MUTUAL, caCertificates: {ca}, sni: {SECURE_NAME}, subjectAltNames: [other.example.com], clientCertificate: {}, privateKey: {}}}",
        m.tls.client_cert.display(),
        m.tls.client_key.display()
    ));
    assert!(
        eventually(|| status() == 503 && ssl("fail_verify_san") > 0),
        "a SAN mismatch is refused\n{}",
        m.logs()
    );
    m.cluster.objects().remove("dr-secure.yaml");
}

/// From outside the mesh through the ingress gateway (the gateway chart's pod, injected with
/// the gateway template: `pilot-agent proxy router`): by host to
/// the sidecar server (Istio mutual TLS with the gateway's identity, accepted under the
/// namespace's STRICT) and to the ambient service (HBONE to its ztunnel); a host no
/// VirtualService names gets 404 from the gateway.
fn ingress_gateway_routes_into_the_mesh(m: &Mesh) {
    let gateway = m.ingress.addr(INGRESS_PORT);
    let call = |host: &str| get_with(&m.outsider.netns, gateway, &[("host", host)]);
    let answered = |host: &str, body: &str| {
        eventually(|| call(host).is_some_and(|r| r.status == 200 && r.body == body))
    };
    assert!(
        answered("server.example.com", "server"),
        "ingress -> sidecar server: {:?}\n--- ingress\n{}\n{}",
        call("server.example.com").map(|r| r.status),
        m.ingress_proxy.log(),
        m.logs()
    );
    let xfcc = m.xfcc();
    assert!(
        xfcc.contains(&format!("URI={INGRESS_ID}")),
        "the server sidecar saw the gateway's certificate: {xfcc:?}"
    );
    assert!(
        answered("amb.example.com:80", "amb"),
        "ingress -> ambient service\n--- ingress\n{}",
        m.ingress_proxy.log()
    );
    assert!(
        m.cluster.node("node2").ztunnel.saw_inbound_from(INGRESS_ID),
        "the ambient pod's ztunnel saw the gateway's identity"
    );
    assert_eq!(call("unknown.example.com").map(|r| r.status), Some(404));
    // HTTPS: the gateway presents the Secret's certificate (verified against its CA) and
    // routes by host as on 80.
    let tls_gateway = m.ingress.addr(INGRESS_TLS_PORT);
    let https = || {
        https_request(
            &m.outsider.netns,
            tls_gateway,
            "server.example.com",
            m.ingress_tls.client_config(false),
            &[("host", "server.example.com")],
            Duration::from_secs(5),
        )
    };
    assert!(
        eventually(|| https().is_some_and(|r| r.status == 200 && r.body == "server")),
        "HTTPS through the gateway: {:?}\n--- ingress\n{}",
        https().map(|r| r.status),
        m.ingress_proxy.log()
    );
    assert!(m.ingress_proxy.stat("listener.0.0.0.0_8444.ssl.handshake") > 0);
    nothing_rejected(&m.ingress_proxy);
}

fn vip() -> SocketAddr {
    SocketAddr::from((SERVER_VIP.parse::<Ipv4Addr>().expect("vip"), 80))
}

fn ambient_vip() -> SocketAddr {
    SocketAddr::from((AMBIENT_VIP.parse::<Ipv4Addr>().expect("vip"), 80))
}

/// Polls `f` for up to 20 s.
fn eventually(f: impl FnMut() -> bool) -> bool {
    mesh_testutil::eventually_blocking(Duration::from_secs(20), Duration::from_millis(200), f)
}

/// Every xDS update the proxy got was accepted.
fn nothing_rejected(proxy: &Waypoint) {
    let stats = proxy.admin("/stats?filter=update_rejected");
    for line in stats.lines() {
        assert!(
            line.ends_with(": 0"),
            "rejected xDS update: {line}\n{}",
            proxy.log()
        );
    }
    assert!(proxy.stat("listener_manager.lds.update_success") > 0);
    assert!(proxy.stat("cluster_manager.cds.update_success") > 0);
}

struct Mesh {
    cluster: MeshCluster,
    client: MeshPod,
    server: MeshPod,
    outsider: MeshPod,
    amb_client: MeshPod,
    app: HttpApp,
    _apps: Vec<HttpApp>,
    client_proxy: Waypoint,
    server_proxy: Waypoint,
    ingress: MeshPod,
    ingress_proxy: Waypoint,
    ingress_tls: TlsFiles,
    secure_app: HttpApp,
    tls: TlsFiles,
    _tls_dir: tempfile::TempDir,
}

fn deploy() -> Mesh {
    let chart = gateway_chart();
    let tls_dir = tempfile::tempdir().expect("tls dir");
    let ingress_tls = TlsFiles::generate(
        &tls_dir.path().join("ingress"),
        "ingress-ca",
        "server.example.com",
    );
    let mut cluster = MeshCluster::start(
        "sidecar",
        &["node1", "node2"],
        Redirection::Nftables,
        |dir| {
            setup(dir);
            ingress_objects(dir, &chart, &ingress_tls);
        },
    );
    let mut add = |spec: PodSpec| {
        let name = spec.name.clone();
        cluster
            .add_pod(spec)
            .unwrap_or_else(|e| panic!("pod {name}: {e}"))
    };
    let client = add(injected("client", "node1", false));
    let server = add(injected("server", "node2", true));
    let outsider = add(PodSpec::new("legacy", "outsider", "node1", "outsider"));
    let amb = add(PodSpec::new("demo", "amb", "node2", "amb"));
    let amb_client = add(PodSpec::new("demo", "amb-client", "node1", "amb-client"));
    let ingress = add(ingress_pod(&chart));
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT));
    let app = HttpApp::start(&server.netns, any, "server").expect("server app");
    let outsider_app = HttpApp::start(&outsider.netns, any, "outsider").expect("outsider app");
    let tls = TlsFiles::generate(tls_dir.path(), "outsider-ca", SECURE_NAME);
    let secure_addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, SECURE_PORT));
    let secure_app = HttpApp::start_tls(
        &outsider.netns,
        secure_addr,
        "secure",
        tls.server_config(true),
    )
    .expect("https app");
    let amb_app = HttpApp::start(&amb.netns, any, "amb").expect("ambient app");
    // The server's own metrics, which its sidecar merges into the status port's.
    let metrics_addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_METRICS_PORT));
    let app_metrics = HttpApp::start(&server.netns, metrics_addr, APP_METRIC).expect("metrics app");
    let server_proxy = injection::start_sidecar(&server, &cluster.istiod, &[]);
    let client_proxy = injection::start_sidecar(&client, &cluster.istiod, &[]);
    let ingress_proxy = injection::start_sidecar(&ingress, &cluster.istiod, &[]);
    server_proxy.wait_ready(Duration::from_secs(30));
    client_proxy.wait_ready(Duration::from_secs(30));
    ingress_proxy.wait_ready(Duration::from_secs(30));
    Mesh {
        cluster,
        client,
        server,
        outsider,
        amb_client,
        app,
        _apps: vec![outsider_app, amb_app, app_metrics],
        client_proxy,
        server_proxy,
        ingress,
        ingress_proxy,
        ingress_tls,
        secure_app,
        tls,
        _tls_dir: tls_dir,
    }
}

impl Mesh {
    /// The `x-forwarded-client-cert` the server app last received (empty without one).
    fn xfcc(&self) -> String {
        (self.app.last_headers())
            .get("x-forwarded-client-cert")
            .cloned()
            .unwrap_or_default()
    }

    fn logs(&self) -> String {
        format!(
            "--- client sidecar\n{}\n--- server sidecar\n{}\n{}",
            self.client_proxy.log(),
            self.server_proxy.log(),
            self.cluster.logs()
        )
    }
}

#[test]
fn sidecars_call_each_other_over_istio_mutual_tls_and_enforce_policy() {
    if !have_root("sidecars_call_each_other_over_istio_mutual_tls_and_enforce_policy") {
        return;
    }
    let m = deploy();

    // Client sidecar -> server sidecar: through both Envoys, with the client's identity.
    let through = eventually(|| {
        get(&m.client.netns, vip()).is_some_and(|r| {
            r.status == 200
                && r.body == "server"
                && r.headers.contains_key("x-envoy-upstream-service-time")
        })
    });
    assert!(
        through,
        "client -> server through the sidecars\n{}",
        m.logs()
    );
    let xfcc = m.xfcc();
    assert!(
        xfcc.contains(&format!("URI={CLIENT_ID}")),
        "the server sidecar saw the client's certificate: {xfcc:?}"
    );

    // Sidecar -> ambient pod: HBONE from the sidecar, with its own identity, to the pod's
    // ztunnel.
    let to_ambient = eventually(|| {
        get(&m.client.netns, ambient_vip()).is_some_and(|r| r.status == 200 && r.body == "amb")
    });
    assert!(to_ambient, "sidecar -> ambient\n{}", m.logs());
    assert!(
        m.cluster.node("node2").ztunnel.saw_inbound_from(CLIENT_ID),
        "the ambient pod's ztunnel saw the sidecar's identity\n{}",
        m.logs()
    );

    // Ambient pod -> sidecar: the client's ztunnel tunnels to the sidecar's 15008, which
    // checks the tunnel's identity and hands the stream to the app.
    let from_ambient = eventually(|| {
        get(&m.amb_client.netns, vip()).is_some_and(|r| r.status == 200 && r.body == "server")
    });
    assert!(from_ambient, "ambient -> sidecar\n{}", m.logs());
    let xfcc = m.xfcc();
    assert!(
        xfcc.contains(&format!("URI={AMBIENT_CLIENT_ID}")),
        "the server sidecar saw the ambient client's identity: {xfcc:?}\n{}",
        m.logs()
    );
    assert!(
        m.server_proxy
            .stat("http.connect_terminate.downstream_rq_total")
            > 0,
        "through the sidecar's connect_terminate"
    );

    // A destination that is no service passes through the client's sidecar untouched.
    let direct = get(&m.client.netns, m.outsider.addr(APP_PORT));
    assert_eq!(direct.map(|r| r.body), Some("outsider".to_string()));

    // PERMISSIVE (no PeerAuthentication): a pod without a sidecar reaches the server in plain
    // text, and no identity is claimed for it.
    let plain = get(&m.outsider.netns, m.server.addr(APP_PORT)).expect("plain text answered");
    assert_eq!((plain.status, plain.body.as_str()), (200, "server"));
    assert!(!m.app.last_headers().contains_key("x-forwarded-client-cert"));

    // STRICT: plain text is refused, Istio mutual TLS still works.
    m.cluster.objects().write(
        "pa.yaml",
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: default\n  namespace: legacy\nspec:\n  mtls: {mode: STRICT}\n",
    );
    let refused = eventually(|| get(&m.outsider.netns, m.server.addr(APP_PORT)).is_none());
    assert!(refused, "STRICT refuses plain text\n{}", m.logs());
    let ok = get(&m.client.netns, vip()).map(|r| r.status);
    assert_eq!(ok, Some(200), "STRICT accepts the client's sidecar");
    let ok = get(&m.amb_client.netns, vip()).map(|r| r.status);
    assert_eq!(ok, Some(200), "STRICT accepts HBONE from an ambient pod");

    // AuthorizationPolicy DENY by principal, at the server's sidecar.
    m.cluster.objects().write(
        "deny.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-client\n  namespace: legacy\nspec:\n  selector: {matchLabels: {app: server}}\n  action: DENY\n  rules:\n  - from: [{source: {principals: [cluster.local/ns/legacy/sa/client]}}]\n",
    );
    let denied = eventually(|| get(&m.client.netns, vip()).is_some_and(|r| r.status == 403));
    assert!(denied, "the DENY policy answers 403\n{}", m.logs());
    m.cluster.objects().remove("deny.yaml");
    let allowed = eventually(|| get(&m.client.netns, vip()).is_some_and(|r| r.status == 200));
    assert!(
        allowed,
        "allowed again once the policy is gone\n{}",
        m.logs()
    );

    requires_a_token(&m);
    sidecar_resource_scopes_the_client(&m);
    destination_rule_originates_tls(&m);
    ingress_gateway_routes_into_the_mesh(&m);

    // Request metrics from both sidecars, each reporting its own side.
    let counted = |proxy: &Waypoint, want: &[&str]| {
        proxy
            .metrics()
            .lines()
            .any(|l| l.starts_with("istio_requests_total{") && want.iter().all(|w| l.contains(w)))
    };
    let expected: [(&str, &Waypoint, &[&str]); 3] = [
        (
            "client sidecar, reporter=source",
            &m.client_proxy,
            &[
                "reporter=\"source\"",
                "source_workload=\"client\"",
                "destination_workload=\"server\"",
                "destination_service=\"server.legacy.svc.cluster.local\"",
                "response_code=\"200\"",
            ],
        ),
        (
            "server sidecar, reporter=destination",
            &m.server_proxy,
            &[
                "reporter=\"destination\"",
                "source_principal=\"spiffe://cluster.local/ns/legacy/sa/client\"",
                "destination_workload=\"server\"",
                "connection_security_policy=\"mutual_tls\"",
            ],
        ),
        (
            "server sidecar, the ambient client's requests",
            &m.server_proxy,
            &[
                "reporter=\"destination\"",
                "source_principal=\"spiffe://cluster.local/ns/demo/sa/amb-client\"",
            ],
        ),
    ];
    for (what, proxy, labels) in expected {
        assert!(
            eventually(|| counted(proxy, labels)),
            "{what}\n{}",
            proxy.metrics()
        );
    }

    // The status port merges the agent's, Envoy's and the app's own metrics.
    let merged = m.server_proxy.metrics();
    assert!(merged.contains(APP_METRIC), "app metrics merged:\n{merged}");
    assert!(
        merged.contains("envoy_cluster_manager_cds_update_success"),
        "Envoy's"
    );

    nothing_rejected(&m.client_proxy);
    nothing_rejected(&m.server_proxy);
}
