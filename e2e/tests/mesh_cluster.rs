//! The whole local mesh: istiod, and per node a cni-node agent and a ztunnel, with pods
//! created through the real CNI chain (bridge + host-local + istio-cni).
//!
//! Enrollment by namespace label, traffic crossing ztunnel with mTLS (the server side sees
//! the client's identity), unlabeled pods untouched, labeling and unlabeling a namespace of
//! running pods, agent restart without duplicate rules, ztunnel restart, and the same capture
//! with eBPF instead of nftables.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mesh_e2e::cluster::{MeshCluster, MeshPod, PodSpec, Redirection};
use mesh_e2e::probe::{echo, echo_until, Echo};
use mesh_testutil::netns::{have_root, EchoServer};
use mesh_testutil::{namespace_yaml, service_yaml, ClusterDir, Netns};

const SERVER_PORT: u16 = 8080;
const CONVERGE: Duration = Duration::from_secs(10);

fn namespaces(dir: &ClusterDir, legacy_ambient: bool) {
    let legacy: &[(&str, &str)] = if legacy_ambient {
        &[("istio.io/dataplane-mode", "ambient")]
    } else {
        &[]
    };
    dir.write(
        "namespaces.yaml",
        &format!(
            "{}---\n{}",
            namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
            namespace_yaml("legacy", legacy)
        ),
    );
}

fn setup(dir: &ClusterDir) {
    namespaces(dir, false);
    dir.write(
        "svc-server.yaml",
        &service_yaml("demo", "server", "10.96.0.10", "server"),
    );
}

fn is_ok(e: &Echo) -> bool {
    *e == Echo::Ok
}

/// The istio tables in a pod's netns (`nft list tables`).
fn istio_tables(netns: &Netns) -> Vec<String> {
    let out = netns
        .exec_ok("nft", &["list", "tables"])
        .expect("nft list tables");
    out.lines()
        .filter(|l| l.contains("istio"))
        .map(str::to_string)
        .collect()
}

/// The full ruleset of a pod (to compare before and after restarts).
fn ruleset(netns: &Netns) -> String {
    netns
        .exec_ok("nft", &["-s", "list", "ruleset"])
        .expect("nft list ruleset")
}

/// Inbound connections the server-side ztunnel reported from `principal`.
fn seen_from(cluster: &MeshCluster, node: &str, principal: &str) -> bool {
    cluster.node(node).ztunnel.saw_inbound_from(principal)
}

struct App {
    client: MeshPod,
    server: MeshPod,
    legacy: MeshPod,
    server_app: EchoServer,
}

fn deploy(c: &mut MeshCluster) -> App {
    let server = c
        .add_pod(PodSpec::new("demo", "server", "node2", "server"))
        .unwrap_or_else(|e| panic!("server pod: {e}\n{}", c.logs()));
    let client = c
        .add_pod(PodSpec::new("demo", "client", "node1", "client"))
        .unwrap_or_else(|e| panic!("client pod: {e}\n{}", c.logs()));
    let legacy = c
        .add_pod(PodSpec::new("legacy", "legacy", "node1", "default"))
        .unwrap_or_else(|e| panic!("legacy pod: {e}\n{}", c.logs()));
    let server_app = server
        .netns
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, SERVER_PORT)))
        .expect("server app");
    App {
        client,
        server,
        legacy,
        server_app,
    }
}

const CLIENT: &str = "spiffe://cluster.local/ns/demo/sa/client";
const LEGACY: &str = "spiffe://cluster.local/ns/legacy/sa/default";

#[test]
fn enrollment_follows_labels_and_survives_restarts() {
    if !have_root("enrollment_follows_labels_and_survives_restarts") {
        return;
    }
    let mut c = MeshCluster::start("mcl", &["node1", "node2"], Redirection::Nftables, setup);
    let app = deploy(&mut c);
    let target = app.server.addr(SERVER_PORT);

    // Labeled namespace: captured, mTLS, identity seen at the server side.
    assert_eq!(istio_tables(&app.client.netns).len(), 3, "client pod rules");
    client_reaches_server_over_the_mesh(&c, &app);

    // Unlabeled namespace: no rules; its plaintext reaches the server (captured there on
    // 15006, allowed without STRICT), and no identity is claimed for it.
    assert!(
        istio_tables(&app.legacy.netns).is_empty(),
        "legacy pod untouched"
    );
    assert_eq!(
        echo_until(&app.legacy.netns, target, is_ok, CONVERGE),
        Echo::Ok
    );
    assert!(!seen_from(&c, "node2", LEGACY));

    // Labeling the namespace enrolls its running pod; traffic then carries its identity.
    namespaces(c.objects(), true);
    let enrolled = wait(|| istio_tables(&app.legacy.netns).len() == 3);
    assert!(enrolled, "legacy pod enrolled after labeling\n{}", c.logs());
    let through_mesh =
        wait(|| echo(&app.legacy.netns, target) == Echo::Ok && seen_from(&c, "node2", LEGACY));
    assert!(
        through_mesh,
        "legacy pod's traffic through the mesh\n{}",
        c.logs()
    );

    // Removing the label removes the rules; traffic goes direct again.
    namespaces(c.objects(), false);
    let removed = wait(|| istio_tables(&app.legacy.netns).is_empty());
    assert!(removed, "rules removed after unlabeling\n{}", c.logs());
    assert_eq!(echo(&app.legacy.netns, target), Echo::Ok);

    // Agent crash and restart: same rules (no duplicates), no pod lost.
    let before = ruleset(&app.client.netns);
    c.node_mut("node1").agent.restart();
    c.node("node1").agent.wait_ready(Duration::from_secs(20));
    assert_eq!(
        ruleset(&app.client.netns),
        before,
        "rules unchanged by agent restart"
    );
    assert_eq!(
        echo_until(&app.client.netns, target, is_ok, CONVERGE),
        Echo::Ok
    );

    // ztunnel restart: every pod comes back from the agent's snapshot.
    c.node_mut("node1").ztunnel.restart();
    let back = echo_until(&app.client.netns, target, is_ok, CONVERGE);
    assert_eq!(
        back,
        Echo::Ok,
        "client back after ztunnel restart\n{}",
        c.logs()
    );

    // A new pod after all that is enrolled at creation; deleting it removes its rules.
    let late = c
        .add_pod(PodSpec::new("demo", "late", "node1", "client"))
        .unwrap_or_else(|e| panic!("late pod: {e}\n{}", c.logs()));
    assert_eq!(istio_tables(&late.netns).len(), 3);
    assert_eq!(echo_until(&late.netns, target, is_ok, CONVERGE), Echo::Ok);
    c.delete_pod("late").expect("delete late pod");
}

#[test]
fn ebpf_capture_carries_mesh_traffic() {
    if !have_root("ebpf_capture_carries_mesh_traffic") {
        return;
    }
    let mut c = MeshCluster::start("mce", &["node1", "node2"], Redirection::Ebpf, setup);
    let app = deploy(&mut c);
    let target = app.server.addr(SERVER_PORT);
    assert!(
        istio_tables(&app.client.netns).is_empty(),
        "eBPF mode writes no nftables rules"
    );
    client_reaches_server_over_the_mesh(&c, &app);
    assert_eq!(
        echo_until(&app.legacy.netns, target, is_ok, CONVERGE),
        Echo::Ok
    );
    assert_app_saw(&app, &app.legacy);
    assert!(
        !seen_from(&c, "node2", LEGACY),
        "unenrolled pod claims no identity"
    );
}

/// client -> server through both ztunnels: the application answers, sees the client's IP, and
/// the server-side ztunnel reports the client's identity.
fn client_reaches_server_over_the_mesh(c: &MeshCluster, app: &App) {
    let target = app.server.addr(SERVER_PORT);
    let got = echo_until(&app.client.netns, target, is_ok, CONVERGE);
    assert_eq!(
        got,
        Echo::Ok,
        "client -> server through the mesh\n{}",
        c.logs()
    );
    assert_app_saw(app, &app.client);
    assert!(
        seen_from(c, "node2", CLIENT),
        "server side saw the client's identity\n{}",
        c.logs()
    );
}

/// The server application saw `from`'s pod IP as the source of its newest connection (ztunnel
/// dials it from the original source; replies find ztunnel through the capture's marks).
fn assert_app_saw(app: &App, from: &MeshPod) {
    let peers = app.server_app.peers();
    assert_eq!(
        peers.last().map(|p| p.ip()),
        Some(std::net::IpAddr::V4(from.ip)),
        "the server application should see {}'s IP: {peers:?}",
        from.spec.name
    );
}

fn wait(mut check: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < CONVERGE {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    check()
}

/// Whether node `node`'s ztunnel reported a captured plaintext connection into `workload`.
fn plaintext_seen_by(cluster: &MeshCluster, node: &str, workload: &str) -> bool {
    cluster
        .node(node)
        .ztunnel
        .metrics()
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total"))
        .any(|l| {
            l.contains("reporter=\"destination\"")
                && l.contains(&format!("destination_workload=\"{workload}\""))
                && l.contains("connection_security_policy=\"none\"")
        })
}

/// A pod annotated `ambient.istio.io/bypass-inbound-capture: "true"`: mesh clients still reach
/// it over HBONE (with their identity), plaintext from outside the mesh reaches the
/// application directly, uncaptured (nftables and eBPF).
fn bypass_inbound_capture(mode: Redirection, hint: &str) {
    let mut c = MeshCluster::start(hint, &["node1", "node2"], mode, setup);
    let app = deploy(&mut c);
    let direct = c
        .add_pod(
            PodSpec::new("demo", "direct", "node2", "direct")
                .annotation("ambient.istio.io/bypass-inbound-capture", "true"),
        )
        .unwrap_or_else(|e| panic!("direct pod: {e}\n{}", c.logs()));
    let direct_app = direct
        .netns
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, SERVER_PORT)))
        .expect("direct app");
    let target = direct.addr(SERVER_PORT);
    // Until node1's ztunnel has the new pod from WDS, it passes the connection through as
    // to any address outside the mesh (plaintext, which a bypass pod accepts).
    assert!(
        wait(|| mesh_e2e::inspect::wds_workloads(&c.node("node1").ztunnel).contains("demo/direct")),
        "node1's ztunnel learns demo/direct\n{}",
        c.logs()
    );

    let got = echo_until(&app.client.netns, target, is_ok, CONVERGE);
    assert_eq!(got, Echo::Ok, "client -> direct over HBONE\n{}", c.logs());
    assert!(
        seen_from(&c, "node2", CLIENT),
        "HBONE into a bypass pod still carries the client's identity\n{}",
        c.logs()
    );

    let got = echo_until(&app.legacy.netns, target, is_ok, CONVERGE);
    assert_eq!(got, Echo::Ok, "legacy -> direct in plaintext\n{}", c.logs());
    assert_eq!(
        direct_app.peers().last().map(|p| p.ip()),
        Some(std::net::IpAddr::V4(app.legacy.ip))
    );
    assert!(
        !plaintext_seen_by(&c, "node2", "direct"),
        "inbound plaintext to a bypass pod must not be captured\n{}",
        c.logs()
    );
    // The same plaintext to a pod without the annotation is captured (the check can fail).
    let got = echo_until(
        &app.legacy.netns,
        app.server.addr(SERVER_PORT),
        is_ok,
        CONVERGE,
    );
    assert_eq!(got, Echo::Ok);
    assert!(
        wait(|| plaintext_seen_by(&c, "node2", "server")),
        "plaintext into an ordinary ambient pod is captured\n{}",
        c.logs()
    );
}

#[test]
fn bypass_inbound_capture_nftables() {
    if !have_root("bypass_inbound_capture_nftables") {
        return;
    }
    bypass_inbound_capture(Redirection::Nftables, "mcb");
}

#[test]
fn bypass_inbound_capture_ebpf() {
    if !have_root("bypass_inbound_capture_ebpf") {
        return;
    }
    bypass_inbound_capture(Redirection::Ebpf, "mcx");
}
