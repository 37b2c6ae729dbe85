//! Waypoints on the local mesh: a client pod -> its ztunnel -> the waypoint (pilot-agent and
//! the real Envoy 1.40, configured by istiod) -> the server's ztunnel -> the server, with
//! HTTPRoutes applied by the waypoint.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use mesh_e2e::cluster::{ClusterOptions, MeshCluster, MeshPod, PodSpec, Redirection};
use mesh_e2e::controller::WaypointController;
use mesh_e2e::kubelet::{gateway_programmed, Kubelet};
use mesh_e2e::waypoint::Waypoint;
use mesh_testutil::netns::have_root;
use mesh_testutil::{
    http_request, namespace_yaml, ClusterDir, HttpApp, HttpResponse, JwtIssuer, Netns,
};
use serde_json::json;

const APP_PORT: u16 = 8080;
const SERVER_VIP: &str = "10.96.0.10";
const WAYPOINT_SA: &str = "spiffe://cluster.local/ns/demo/sa/waypoint";

fn service(name: &str, vip: &str, selector: &str, labels: &str, ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: demo\n  labels: {{{labels}}}\nspec:\n  clusterIP: {vip}\n  selector: {{{selector}}}\n  ports:\n{ports}"
    )
}

const HTTP_PORT: &str = "  - name: http\n    port: 80\n    targetPort: http\n";

fn setup(dir: &ClusterDir) {
    dir.write(
        "ns.yaml",
        &namespace_yaml(
            "demo",
            &[
                ("istio.io/dataplane-mode", "ambient"),
                ("istio.io/use-waypoint", "waypoint"),
            ],
        ),
    );
    dir.write(
        "gateway.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: waypoint\n  namespace: demo\nspec:\n  gatewayClassName: istio-waypoint\n  listeners:\n  - name: mesh\n    port: 15008\n    protocol: HBONE\n",
    );
    dir.write(
        "svc-server.yaml",
        &format!(
            "{}---\n{}---\n{}",
            service("server", SERVER_VIP, "app: server", "", HTTP_PORT),
            service("server-v1", "10.96.0.11", "version: v1", "", HTTP_PORT),
            service("server-v2", "10.96.0.12", "version: v2", "", HTTP_PORT),
        ),
    );
}

struct App {
    client: MeshPod,
    other: MeshPod,
    v1: HttpApp,
    v2: HttpApp,
    kubelet: Kubelet,
    _controller: WaypointController,
    _pods: Vec<MeshPod>,
}

impl App {
    /// The waypoint the controller deployed and the kubelet runs.
    fn waypoint(&self) -> &Waypoint {
        self.kubelet.proxy("demo", "waypoint")
    }
}

/// Runs the waypoint controller and the kubelet until the Gateway `demo/waypoint` is
/// Programmed (its Deployment's pod is ready and istiod may bind traffic to it).
fn deploy_waypoint(c: &mut MeshCluster) -> (WaypointController, Kubelet) {
    let controller = WaypointController::start(c);
    let mut kubelet = Kubelet::new("node1", &[("TERMINATION_DRAIN_DURATION", "2s")]);
    kubelet.run_until(c, Duration::from_secs(60), |c| {
        gateway_programmed(c.objects().path(), "demo", "waypoint")
    });
    (controller, kubelet)
}

fn deploy(c: &mut MeshCluster) -> App {
    let mut add = |spec: PodSpec| {
        let name = spec.name.clone();
        c.add_pod(spec)
            .unwrap_or_else(|e| panic!("pod {name}: {e}"))
    };
    let server = |name: &str, version: &str| {
        PodSpec::new("demo", name, "node2", "server")
            .label("app", "server")
            .label("version", version)
    };
    let v1_pod = add(server("server-v1", "v1"));
    let v2_pod = add(server("server-v2", "v2"));
    let client = add(PodSpec::new("demo", "client", "node1", "client"));
    let other = add(PodSpec::new("demo", "other", "node1", "other"));
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT));
    let v1 = HttpApp::start(&v1_pod.netns, any, "v1").expect("v1 app");
    let v2 = HttpApp::start(&v2_pod.netns, any, "v2").expect("v2 app");
    let (controller, kubelet) = deploy_waypoint(c);
    // istiod binds the Services once the Gateway has addresses; wait until the client's
    // requests go through the waypoint's Envoy (its router adds this header).
    let through = eventually(|| {
        get(&client.netns, "/", &[])
            .is_some_and(|r| r.headers.contains_key("x-envoy-upstream-service-time"))
    });
    assert!(through, "requests reach the waypoint\n{}", c.logs());
    App {
        client,
        other,
        v1,
        v2,
        kubelet,
        _controller: controller,
        _pods: vec![v1_pod, v2_pod],
    }
}

fn get(netns: &Netns, path: &str, headers: &[(&str, &str)]) -> Option<HttpResponse> {
    request(netns, "GET", path, headers)
}

fn request(
    netns: &Netns,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<HttpResponse> {
    let vip: Ipv4Addr = SERVER_VIP.parse().expect("vip");
    http_request(
        netns,
        SocketAddr::from((vip, 80)),
        method,
        path,
        headers,
        Duration::from_secs(5),
    )
}

fn status(r: Option<HttpResponse>) -> u16 {
    r.map_or(0, |r| r.status)
}

/// The sum of Envoy's `rbac.denied` counters.
fn rbac_denied(wp: &Waypoint) -> u64 {
    wp.admin("/stats?filter=rbac\\.denied")
        .lines()
        .filter(|l| l.contains(".rbac.denied:") && !l.contains("shadow"))
        .filter_map(|l| {
            l.rsplit_once(": ")
                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// Polls `f` for up to 20 s.
fn eventually(f: impl FnMut() -> bool) -> bool {
    mesh_testutil::eventually_blocking(Duration::from_secs(20), Duration::from_millis(200), f)
}

/// The sum of `istio_requests_total` samples having every one of `labels`.
fn request_count(metrics: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{"))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Counts bodies over `n` requests.
fn tally(netns: &Netns, n: usize, headers: &[(&str, &str)]) -> (usize, usize, usize) {
    let (mut v1, mut v2, mut other) = (0, 0, 0);
    for _ in 0..n {
        match get(netns, "/", headers) {
            Some(r) if r.status == 200 && r.body == "v1" => v1 += 1,
            Some(r) if r.status == 200 && r.body == "v2" => v2 += 1,
            _ => other += 1,
        }
    }
    (v1, v2, other)
}

/// Inbound connections the server-side ztunnel reported from `principal`.
fn seen_from(c: &MeshCluster, principal: &str) -> bool {
    c.node("node2").ztunnel.saw_inbound_from(principal)
}

const SPLIT: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: split\n  namespace: demo\nspec:\n  parentRefs:\n  - group: \"\"\n    kind: Service\n    name: server\n    port: 80\n  rules:\n  - matches:\n    - path:\n        type: PathPrefix\n        value: /status\n    retry:\n      attempts: 2\n      codes: [503]\n    backendRefs:\n    - name: server-v1\n      port: 80\n  - matches:\n    - path:\n        type: PathPrefix\n        value: /timed\n    timeouts:\n      request: 1s\n    backendRefs:\n    - name: server-v1\n      port: 80\n  - matches:\n    - headers:\n      - name: x-canary\n        value: \"true\"\n    backendRefs:\n    - name: server-v2\n      port: 80\n  - backendRefs:\n    - name: server-v1\n      port: 80\n      weight: 90\n    - name: server-v2\n      port: 80\n      weight: 10\n";

#[test]
fn waypoint_routes_http_between_ztunnels() {
    if !have_root("waypoint_routes_http_between_ztunnels") {
        return;
    }
    let options = ClusterOptions::default().istiod_env("ACCESS_LOG_FILE", "/dev/stdout");
    let mut c = MeshCluster::start_with(
        "wpt",
        &["node1", "node2"],
        Redirection::Nftables,
        &options,
        setup,
    );
    let app = deploy(&mut c);
    app.waypoint().wait_ready(Duration::from_secs(30));

    // Every resource pushed to the waypoint was accepted.
    for stat in [
        "cluster_manager.cds.update_rejected",
        "listener_manager.lds.update_rejected",
    ] {
        assert_eq!(
            app.waypoint().stat(stat),
            0,
            "{stat}\n{}",
            app.waypoint().log()
        );
    }
    // istiod binds the Services once the Gateway has addresses, a moment after the pod is
    // ready (Programmed): their configuration follows.
    let server_cluster = "inbound-vip|80|http|server.demo.svc.cluster.local";
    assert!(eventually(|| app
        .waypoint()
        .admin("/config_dump")
        .contains(server_cluster)));
    let dump = app.waypoint().admin("/config_dump");
    for name in [
        "\"connect_terminate\"",
        "\"main_internal\"",
        "\"connect_originate\"",
        "inbound-vip|80|http|server.demo.svc.cluster.local",
    ] {
        assert!(dump.contains(name), "config_dump lacks {name}");
    }

    // Through the waypoint: the server side sees the waypoint's identity.
    let ok = eventually(|| get(&app.client.netns, "/", &[]).is_some_and(|r| r.status == 200));
    assert!(
        ok,
        "client -> waypoint -> server\n{}\n{}",
        app.waypoint().log(),
        c.logs()
    );
    assert!(
        seen_from(&c, WAYPOINT_SA),
        "server ztunnel saw the waypoint\n{}",
        c.logs()
    );
    let before = app.v1.hits() + app.v2.hits();
    let (v1, v2, failed) = tally(&app.client.netns, 20, &[]);
    assert_eq!(failed, 0);
    assert!(
        v1 > 0 && v2 > 0,
        "both versions serve without a route: {v1}/{v2}"
    );
    assert_eq!(app.v1.hits() + app.v2.hits(), before + 20);

    // `istioctl proxy-config` reads the waypoint's Envoy (run in its network namespace).
    let istioctl = mesh_e2e::bins::binary("istioctl");
    let pc = |what: &str| {
        app.waypoint()
            .netns()
            .exec_ok(&istioctl.display().to_string(), &["proxy-config", what])
            .unwrap_or_else(|e| panic!("istioctl proxy-config {what}: {e}"))
    };
    let clusters = pc("clusters");
    assert!(
        clusters
            .lines()
            .any(|l| l.starts_with("server.demo.svc.cluster.local")
                && l.contains(" 80 ")
                && l.contains("inbound-vip")
                && l.contains("EDS")),
        "{clusters}"
    );
    let listeners = pc("listeners");
    assert!(
        listeners.contains("15008") && listeners.contains("envoy://main_internal"),
        "{listeners}"
    );
    let endpoints = pc("endpoints");
    assert!(
        endpoints.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.first().is_some_and(|e| {
                e.starts_with("envoy://connect_originate/") && e.ends_with(":8080")
            }) && cells.get(1) == Some(&"HEALTHY")
                && cells.last() == Some(&"inbound-vip|80|http|server.demo.svc.cluster.local")
        }),
        "{endpoints}"
    );
    let secrets = pc("secret");
    assert!(
        secrets
            .lines()
            .any(|l| l.starts_with("default") && l.contains("Cert Chain") && l.contains("true")),
        "{secrets}"
    );
    assert!(pc("routes").contains("server.demo.svc.cluster.local"));

    // Istio's request metrics on 15020, from Envoy's access log stream, and a log line each.
    let counted = eventually(|| {
        request_count(
            &app.waypoint().metrics(),
            &[
                "reporter=\"waypoint\"",
                "source_principal=\"spiffe://cluster.local/ns/demo/sa/client\"",
                "source_workload_namespace=\"demo\"",
                "destination_service=\"server.demo.svc.cluster.local\"",
                "destination_workload=\"server-v1\"",
                "destination_principal=\"spiffe://cluster.local/ns/demo/sa/server\"",
                "response_code=\"200\"",
            ],
        ) >= v1 as u64
    });
    assert!(
        counted,
        "istio_requests_total\n{}",
        app.waypoint().metrics()
    );
    let metrics = app.waypoint().metrics();
    assert!(metrics.contains("# TYPE istio_requests_total counter"));
    assert!(metrics.contains("istio_request_duration_milliseconds_bucket{"));
    assert!(metrics.contains("istio_response_bytes_sum{"));
    assert!(
        app.waypoint()
            .log()
            .contains("\"GET / HTTP/1.1\" 200 - via_upstream"),
        "an access log line per request\n{}",
        app.waypoint().log()
    );

    // An HTTPRoute: 90/10 split, and the header match pins v2.
    c.objects().write("route.yaml", SPLIT);
    // Before the route, the Service balances over v1 and v2 alike: five v2 answers in a row
    // happen by chance once in 32 tries, twenty once in a million.
    let applied = eventually(|| {
        (0..20).all(|_| {
            get(&app.client.netns, "/", &[("x-canary", "true")]).is_some_and(|r| r.body == "v2")
        })
    });
    assert!(applied, "route served\n{}", app.waypoint().log());
    let (_, canary_v2, canary_failed) = tally(&app.client.netns, 50, &[("x-canary", "true")]);
    assert_eq!(
        (canary_v2, canary_failed),
        (50, 0),
        "header match\n{}\n--- Envoy's xDS updates\n{}",
        app.waypoint().log(),
        app.waypoint()
            .admin("/stats?filter=update_(success|rejected|attempt)")
    );
    let (v1, v2, failed) = tally(&app.client.netns, 200, &[]);
    assert_eq!(failed, 0);
    assert!(
        (6..=34).contains(&v2),
        "90/10 split over 200: v1 {v1}, v2 {v2}"
    );

    // A VirtualService on server-v1 (no HTTPRoute there): abort half the requests with 418.
    c.objects().write("vs-fault.yaml", FAULT_VS);
    let v1_vip = SocketAddr::from(([10, 96, 0, 11], 80));
    let code = || {
        http_request(
            &app.client.netns,
            v1_vip,
            "GET",
            "/",
            &[],
            Duration::from_secs(5),
        )
        .map_or(0, |r| r.status)
    };
    assert!(
        eventually(|| code() == 418),
        "fault served\n{}",
        app.waypoint().log()
    );
    let (mut aborted, mut ok) = (0, 0);
    for _ in 0..400 {
        match code() {
            418 => aborted += 1,
            200 => ok += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        (168..=232).contains(&aborted),
        "50% abort over 400 (42%-58%): {aborted} aborted, {ok} ok"
    );
    assert_eq!(
        app.waypoint().stat("listener_manager.lds.update_rejected"),
        0
    );
}

/// A RequestAuthentication on the Service makes the waypoint verify tokens (a bad one is
/// answered 401, none passes); an ALLOW policy on `requestPrincipals` and a claim then
/// requires alice's token with the `admins` group.
fn checks_tokens_then_requires_one(c: &MeshCluster, app: &App) {
    let client = &app.client.netns;
    let issuer = JwtIssuer::new("https://issuer.example/tenant").expect("issuer");
    let impostor = JwtIssuer::new("https://issuer.example/tenant").expect("another key");
    c.objects().write(
        "authn.yaml",
        &format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata:\n  name: jwt\n  namespace: demo\nspec:\n  targetRefs:\n  - kind: Service\n    group: \"\"\n    name: server\n  jwtRules:\n  - issuer: {}\n    jwks: '{}'\n",
            issuer.issuer(),
            issuer.jwks()
        ),
    );
    let token = |i: &JwtIssuer, sub: &str, claims: serde_json::Value| {
        format!("Bearer {}", i.token(sub, claims).expect("token"))
    };
    let alice = token(&issuer, "alice", json!({"groups": ["admins", "dev"]}));
    let alice_dev = token(&issuer, "alice", json!({"groups": ["dev"]}));
    let bob = token(&issuer, "bob", json!({"groups": ["admins"]}));
    let forged = token(&impostor, "alice", json!({"groups": ["admins"]}));
    let expired = format!(
        "Bearer {}",
        issuer
            .sign(&json!({"iss": issuer.issuer(), "sub": "alice", "exp": 1_000_000_000}))
            .expect("token")
    );
    let with = |auth: &str| get(client, "/", &[("authorization", auth)]);
    assert!(
        eventually(|| status(with("Bearer not-a-jwt")) == 401),
        "RequestAuthentication applied\n{}",
        app.waypoint().log()
    );
    for (auth, want) in [
        (alice.as_str(), 200),
        (forged.as_str(), 401),
        (expired.as_str(), 401),
    ] {
        let r = with(auth).expect("answer");
        assert_eq!(r.status, want, "{auth}: {}", r.body);
    }
    let r = with(&forged).expect("answer");
    assert!(r.body.contains("Jwt"), "Envoy says why: {}", r.body);
    assert_eq!(status(get(client, "/", &[])), 200, "no token passes");

    c.objects().write("allow-jwt.yaml", ALLOW_ALICE_ADMINS);
    assert!(
        eventually(|| status(get(client, "/", &[])) == 403),
        "ALLOW on requestPrincipals applied\n{}",
        app.waypoint().log()
    );
    for (who, auth, want) in [
        ("alice in admins", alice.as_str(), 200),
        ("alice not in admins", alice_dev.as_str(), 403),
        ("bob", bob.as_str(), 403),
        ("a forged alice", forged.as_str(), 401),
    ] {
        assert_eq!(status(with(auth)), want, "{who}");
    }
    assert_eq!(
        app.waypoint().stat("listener_manager.lds.update_rejected"),
        0
    );
    c.objects().remove("allow-jwt.yaml");
    c.objects().remove("authn.yaml");
    assert!(
        eventually(|| status(with(&forged)) == 200),
        "tokens no longer checked"
    );
}

const ALLOW_ALICE_ADMINS: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow-alice\n  namespace: demo\nspec:\n  targetRefs:\n  - kind: Service\n    group: \"\"\n    name: server\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        requestPrincipals: [\"https://issuer.example/tenant/alice\"]\n    when:\n    - key: request.auth.claims[groups]\n      values: [admins]\n";

const FAULT_VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: server-v1-fault\n  namespace: demo\nspec:\n  hosts: [server-v1]\n  http:\n  - fault:\n      abort:\n        httpStatus: 418\n        percentage: {value: 50}\n    route:\n    - destination: {host: server-v1}\n";

const DENY_ADMIN: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-admin\n  namespace: demo\nspec:\n  targetRefs:\n  - kind: Service\n    group: \"\"\n    name: server\n  action: DENY\n  rules:\n  - to:\n    - operation:\n        methods: [GET]\n        paths: [\"/admin*\"]\n";

const ALLOW_CLIENT: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow-client\n  namespace: demo\nspec:\n  targetRefs:\n  - kind: Gateway\n    group: gateway.networking.k8s.io\n    name: waypoint\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/client\"]\n";

#[test]
fn waypoint_enforces_routes_policies_retries_and_timeouts() {
    if !have_root("waypoint_enforces_routes_policies_retries_and_timeouts") {
        return;
    }
    let mut c = MeshCluster::start("wpp", &["node1", "node2"], Redirection::Nftables, |d| {
        setup(d);
        d.write("route.yaml", SPLIT);
    });
    let app = deploy(&mut c);
    app.waypoint().wait_ready(Duration::from_secs(30));
    let client = &app.client.netns;
    assert!(
        eventually(|| status(get(client, "/", &[])) == 200),
        "path\n{}",
        app.waypoint().log()
    );

    // Retries: attempts 2 on 503 -> the server sees 3 requests for one.
    let before = app.v1.hits();
    assert_eq!(status(get(client, "/status/503", &[])), 503);
    assert_eq!(app.v1.hits() - before, 3, "1 try + 2 retries");

    // Timeout: 1 s against a 3 s backend -> 504 after about a second.
    let slow = get(client, "/timed/delay/3000", &[]).expect("answer");
    assert_eq!(slow.status, 504);
    assert!(
        (Duration::from_millis(950)..Duration::from_millis(1600)).contains(&slow.elapsed),
        "504 after {:?}",
        slow.elapsed
    );

    // DENY GET /admin* on the Service: 403 for that request only.
    c.objects().write("deny.yaml", DENY_ADMIN);
    assert!(
        eventually(|| status(get(client, "/admin/x", &[])) == 403),
        "DENY applied\n{}",
        app.waypoint().log()
    );
    let denied = rbac_denied(app.waypoint());
    let r = get(client, "/admin/users", &[]).expect("answer");
    assert_eq!((r.status, r.body.as_str()), (403, "RBAC: access denied"));
    assert_eq!(
        rbac_denied(app.waypoint()),
        denied + 1,
        "exactly one more denial"
    );
    assert_eq!(status(request(client, "POST", "/admin/users", &[])), 200);
    assert_eq!(status(get(client, "/other", &[])), 200);

    // ALLOW by principal on the Gateway: the client's identity passes, another is refused.
    c.objects().write("allow.yaml", ALLOW_CLIENT);
    assert!(
        eventually(|| status(get(&app.other.netns, "/", &[])) == 403),
        "ALLOW applied\n{}",
        app.waypoint().log()
    );
    for _ in 0..10 {
        assert_eq!(status(get(client, "/", &[])), 200);
    }
    assert_eq!(
        app.waypoint().stat("listener_manager.lds.update_rejected"),
        0
    );

    // Removing both policies opens the path again.
    c.objects().remove("deny.yaml");
    c.objects().remove("allow.yaml");
    assert!(eventually(|| status(get(
        &app.other.netns,
        "/admin/x",
        &[]
    )) == 200));

    checks_tokens_then_requires_one(&c, &app);

    // SIGTERM drains: a request in flight (1.5 s) completes, then the agent exits cleanly.
    let netns = client.clone();
    let in_flight = std::thread::spawn(move || get(&netns, "/delay/1500", &[]));
    std::thread::sleep(Duration::from_millis(300));
    let mut app = app;
    let mut waypoint = app.kubelet.take_proxy("demo", "waypoint");
    assert!(
        waypoint.stop(Duration::from_secs(15)),
        "agent exits cleanly\n{}",
        waypoint.log()
    );
    let r = in_flight.join().expect("request thread");
    assert_eq!(
        status(r),
        200,
        "in-flight request survived the drain\n{}",
        waypoint.log()
    );
}

#[test]
fn waypoint_is_not_ready_before_its_first_configuration() {
    if !have_root("waypoint_is_not_ready_before_its_first_configuration") {
        return;
    }
    let mut c = MeshCluster::start("wpr", &["node1"], Redirection::Nftables, setup);
    let pod = c
        .add_pod(
            PodSpec::new("demo", "waypoint-0", "node1", "waypoint")
                .label("gateway.networking.k8s.io/gateway-name", "waypoint")
                .label("istio.io/dataplane-mode", "none"),
        )
        .expect("waypoint pod");
    // xDS pointed at a port nobody serves: the certificate comes, the configuration never.
    let ca = format!("{}:15012", c.istiod.ip());
    let wp = Waypoint::start(
        &pod,
        &c.istiod,
        &[
            (
                "PROXY_CONFIG",
                "{\"discoveryAddress\":\"172.30.0.1:15999\"}",
            ),
            ("CA_ADDR", &ca),
        ],
    );
    let answered = eventually(|| wp.agent_readiness().is_some());
    assert!(answered, "the agent's readiness answers\n{}", wp.log());
    std::thread::sleep(Duration::from_secs(2));
    let (code, body) = wp.agent_readiness().expect("readiness");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("waiting for the first configuration"),
        "{body}"
    );
    // Envoy has not started its listeners either: 15021 (the kubelet's probe) is not 200.
    assert!(wp.readiness().is_none_or(|(code, _)| code != 200));
    drop(wp);
    // The same pod with the right address becomes ready.
    let wp = Waypoint::start(&pod, &c.istiod, &[]);
    wp.wait_ready(Duration::from_secs(30));
}

const TCP_SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: db\n  namespace: demo\nspec:\n  clusterIP: 10.96.0.30\n  selector: {app: db}\n  ports:\n  - name: tcp-db\n    port: 5432\n    targetPort: 5432\n";

/// A TCPRoute sending `db`'s connections to `db-v2` only.
const DB_TCP_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata:\n  name: db\n  namespace: demo\nspec:\n  parentRefs:\n  - {group: \"\", kind: Service, name: db, port: 5432}\n  rules:\n  - backendRefs:\n    - {name: db-v2, port: 5432}\n";

/// Subsets of `server` by version, and a VirtualService choosing one by header.
const SUBSETS: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: server\n  namespace: demo\nspec:\n  host: server\n  trafficPolicy:\n    connectionPool:\n      http: {http1MaxPendingRequests: 100}\n    outlierDetection: {consecutive5xxErrors: 5, interval: 10s}\n  subsets:\n  - name: v1\n    labels: {version: v1}\n  - name: v2\n    labels: {version: v2}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: server\n  namespace: demo\nspec:\n  hosts: [server]\n  http:\n  - match:\n    - headers:\n        x-version: {exact: v2}\n    route:\n    - destination: {host: server, subset: v2}\n  - route:\n    - destination: {host: server, subset: v1}\n";

#[test]
fn waypoint_carries_tcp_byte_exact_follows_tcp_routes_and_subsets() {
    if !have_root("waypoint_carries_tcp_byte_exact_follows_tcp_routes_and_subsets") {
        return;
    }
    let db_v2 = "apiVersion: v1\nkind: Service\nmetadata:\n  name: db-v2\n  namespace: demo\nspec:\n  clusterIP: 10.96.0.31\n  selector: {app: db-v2}\n  ports:\n  - name: tcp-db\n    port: 5432\n    targetPort: 5432\n";
    let mut c = MeshCluster::start("wpc", &["node1", "node2"], Redirection::Nftables, |d| {
        setup(d);
        d.write("svc-db.yaml", &format!("{TCP_SERVICE}---\n{db_v2}"));
    });
    let db = c
        .add_pod(PodSpec::new("demo", "db", "node2", "db").label("app", "db"))
        .expect("db pod");
    let echo = db
        .netns
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 5432)))
        .expect("echo");
    let db2 = c
        .add_pod(PodSpec::new("demo", "db-v2", "node2", "db").label("app", "db-v2"))
        .expect("db-v2 pod");
    let echo2 = db2
        .netns
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 5432)))
        .expect("echo v2");
    let app = deploy(&mut c);
    app.waypoint().wait_ready(Duration::from_secs(30));
    let target = SocketAddr::from(([10, 96, 0, 30], 5432));
    let payload: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let echoed = || {
        mesh_e2e::probe::echo_bytes(&app.client.netns, target, &payload).as_deref()
            == Some(payload.as_slice())
    };
    assert!(
        eventually(echoed),
        "1 MiB echoed through the waypoint\n{}",
        app.waypoint().log()
    );
    assert!(
        app.waypoint()
            .admin("/stats?filter=tcp")
            .contains("inbound-vip|5432|tcp|db.demo.svc.cluster.local"),
        "the TCP chain carried it"
    );
    assert!(echo2.peers().is_empty(), "db-v2 is not a backend of db yet");

    // A TCPRoute on db's port: its connections go to db-v2, still byte-exact.
    c.objects().write("tcproute.yaml", DB_TCP_ROUTE);
    let moved = eventually(|| {
        let before = echo.peers().len();
        echoed() && !echo2.peers().is_empty() && echo.peers().len() == before
    });
    assert!(
        moved,
        "db's connections reach db-v2\n{}",
        app.waypoint().log()
    );

    // DestinationRule subsets picked by a VirtualService header match.
    let (v1, v2, other) = tally(&app.client.netns, 20, &[]);
    assert!(
        v1 > 0 && v2 > 0 && other == 0,
        "both versions before: {v1}/{v2}/{other}"
    );
    c.objects().write("subsets.yaml", SUBSETS);
    let routed = eventually(|| {
        tally(&app.client.netns, 10, &[]) == (10, 0, 0)
            && tally(&app.client.netns, 10, &[("x-version", "v2")]) == (0, 10, 0)
    });
    assert!(
        routed,
        "subset v1 by default, v2 by header\n{}",
        app.waypoint().log()
    );
    let clusters = app.waypoint().admin("/clusters");
    assert!(
        clusters.contains("inbound-vip|80|http/v2|server.demo.svc.cluster.local"),
        "the subset clusters are Envoy's"
    );
}

const DENY_ALL: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-all\n  namespace: demo\nspec:\n  targetRefs:\n  - kind: Service\n    group: \"\"\n    name: server\n  action: DENY\n  rules:\n  - {}\n";

/// A DENY-everything policy on the waypoint tells whether a request went through it (403) or
/// around it (200).
#[test]
fn waypoint_controller_deploys_binds_and_removes_waypoints() {
    if !have_root("waypoint_controller_deploys_binds_and_removes_waypoints") {
        return;
    }
    let mut c = MeshCluster::start("wpk", &["node1", "node2"], Redirection::Nftables, |d| {
        setup(d);
        d.write("deny-all.yaml", DENY_ALL);
    });
    let v1_pod = c
        .add_pod(PodSpec::new("demo", "server-v1", "node2", "server").label("app", "server"))
        .expect("server pod");
    let _v1 = HttpApp::start(
        &v1_pod.netns,
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT)),
        "v1",
    )
    .expect("app");
    let client = c
        .add_pod(PodSpec::new("demo", "client", "node1", "client"))
        .expect("client pod");

    // The Gateway exists but nothing deployed it: it has no addresses, traffic bypasses it.
    assert!(
        eventually(|| status(get(&client.netns, "/", &[])) == 200),
        "direct while the waypoint is not ready\n{}",
        c.logs()
    );

    // The controller makes its objects; the kubelet runs the pod; once ready the Gateway
    // is Programmed with addresses and istiod binds the Service to it.
    let (mut controller, mut kubelet) = deploy_waypoint(&mut c);
    let dir = c.objects().path().to_path_buf();
    let (objects, _) = mesh_source::load_directory(&dir);
    let made: Vec<String> = objects
        .iter()
        .filter(|(_, o)| {
            o.kind() != mesh_api::Kind::Pod
                && o.metadata()
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.get("gateway.istio.io/managed").is_some())
        })
        .map(|(_, o)| o.key().to_string())
        .collect();
    assert_eq!(
        made,
        [
            "Deployment/demo/waypoint",
            "Service/demo/waypoint",
            "ServiceAccount/demo/waypoint"
        ],
        "{}",
        controller.log()
    );
    let pod = kubelet
        .pod_name("demo", "waypoint")
        .expect("a waypoint pod");
    assert!(pod.starts_with("waypoint-"), "{pod}");
    assert!(
        eventually(|| status(get(&client.netns, "/", &[])) == 403),
        "through the waypoint once Programmed\n{}\n{}",
        kubelet.proxy("demo", "waypoint").log(),
        c.logs()
    );
    let denied = get(&client.netns, "/", &[]).expect("answer");
    assert_eq!(
        denied.body, "RBAC: access denied",
        "the waypoint's Envoy answered"
    );

    // `istio.io/use-waypoint: none` on the Service opts it out.
    c.objects().write(
        "svc-server.yaml",
        &service(
            "server",
            SERVER_VIP,
            "app: server",
            "istio.io/use-waypoint: none",
            HTTP_PORT,
        ),
    );
    assert!(
        eventually(|| status(get(&client.netns, "/", &[])) == 200),
        "use-waypoint none bypasses the waypoint"
    );
    c.objects().write(
        "svc-server.yaml",
        &service("server", SERVER_VIP, "app: server", "", HTTP_PORT),
    );
    assert!(eventually(|| status(get(&client.netns, "/", &[])) == 403));

    // `waypoint-for: workload` refuses Service traffic: the Service goes direct.
    c.objects().write(
        "gateway.yaml",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: waypoint\n  namespace: demo\n  labels:\n    istio.io/waypoint-for: workload\nspec:\n  gatewayClassName: istio-waypoint\n  listeners:\n  - name: mesh\n    port: 15008\n    protocol: HBONE\n",
    );
    assert!(
        eventually(|| status(get(&client.netns, "/", &[])) == 200),
        "waypoint-for workload: Services bypass it"
    );

    // Deleting the Gateway deletes what was made for it; the kubelet stops the pod.
    c.objects().remove("gateway.yaml");
    kubelet.run_until(&mut c, Duration::from_secs(30), |c| {
        let (objects, _) = mesh_source::load_directory(c.objects().path());
        !objects.iter().any(|(_, o)| {
            o.metadata()
                .labels
                .as_ref()
                .is_some_and(|l| l.get("gateway.istio.io/managed").is_some())
        })
    });
    assert!(kubelet.pod_name("demo", "waypoint").is_none());
    assert!(eventually(|| status(get(&client.netns, "/", &[])) == 200));
    controller.stop();
}

/// The serial numbers of the leaf certificates Envoy holds (`/certs` on the admin port).
fn envoy_serials(wp: &Waypoint) -> Vec<String> {
    let certs: serde_json::Value = serde_json::from_str(&wp.admin("/certs")).unwrap_or_default();
    let mut serials: Vec<String> = certs["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            c["cert_chain"][0]["serial_number"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    serials.sort();
    serials.dedup();
    serials
}

#[test]
fn waypoint_rotates_its_certificate_and_survives_an_envoy_crash() {
    if !have_root("waypoint_rotates_its_certificate_and_survives_an_envoy_crash") {
        return;
    }
    let mut c = MeshCluster::start("wpt2", &["node1", "node2"], Redirection::Nftables, setup);
    let v1_pod = c
        .add_pod(PodSpec::new("demo", "server-v1", "node2", "server").label("app", "server"))
        .expect("server pod");
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT));
    let _v1 = HttpApp::start(&v1_pod.netns, any, "v1").expect("app");
    let client = c
        .add_pod(PodSpec::new("demo", "client", "node1", "client"))
        .expect("client pod");
    // A 6 s certificate: the agent renews it at half life, every ~3 s.
    let _controller = WaypointController::start(&c);
    let mut kubelet = Kubelet::new("node1", &[("SECRET_TTL", "6s")]);
    kubelet.run_until(&mut c, Duration::from_secs(60), |c| {
        gateway_programmed(c.objects().path(), "demo", "waypoint")
    });
    let wp = kubelet.proxy("demo", "waypoint");
    assert!(eventually(|| status(get(&client.netns, "/", &[])) == 200));
    let first = envoy_serials(wp);
    assert!(!first.is_empty(), "Envoy holds a certificate");
    // 10 requests a second for 10 s, over at least two rotations.
    let start = Instant::now();
    let (mut sent, mut failed) = (0, Vec::new());
    let mut seen = first.clone();
    while start.elapsed() < Duration::from_secs(10) {
        sent += 1;
        let response = get(&client.netns, "/", &[]);
        if status(response.clone()) != 200 {
            failed.push((start.elapsed(), response));
        }
        for s in envoy_serials(wp) {
            if !seen.contains(&s) {
                seen.push(s);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        failed.is_empty(),
        "{} of {sent} requests failed (after, response): {failed:?}\n--- waypoint\n{}\n{}",
        failed.len(),
        wp.log(),
        c.logs()
    );
    assert!(
        seen.len() >= first.len() + 2,
        "the certificate rotated at least twice: {seen:?}\n{}",
        wp.log()
    );
    // A TLS context of the first certificate may live on while a connection made with it
    // does; the secret Envoy hands to new handshakes is a renewed one.
    let now = envoy_serials(wp);
    assert!(
        now.iter().any(|s| !first.contains(s)),
        "Envoy serves a renewed certificate now: first {first:?}, now {now:?}"
    );

    // Envoy crashes: the agent starts it again with the same bootstrap, and it is served again.
    let agent = wp.pid().expect("agent running");
    let envoy = *mesh_e2e::procfs::children(agent)
        .first()
        .expect("Envoy runs under pilot-agent");
    let killed = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(envoy).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(killed.is_ok(), "kill Envoy {envoy}");
    let restarted = eventually(|| {
        mesh_e2e::procfs::children(agent)
            .first()
            .is_some_and(|p| *p != envoy)
            && wp.readiness().is_some_and(|(code, _)| code == 200)
    });
    assert!(restarted, "Envoy restarted and ready\n{}", wp.log());
    assert!(
        eventually(|| status(get(&client.netns, "/", &[])) == 200),
        "served after the restart\n{}",
        wp.log()
    );
    assert_eq!(wp.pid(), Some(agent), "the agent itself kept running");
}
