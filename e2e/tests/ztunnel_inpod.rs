//! ztunnel end to end, in network namespaces: two nodes, each with a real ztunnel process
//! connected to a real istiod; pods handed to ztunnel over ZDS (the fake node agent sends
//! their real netns fds) with the in-pod nftables capture rules istio-cni writes.
//!
//! client (node1) -> its ztunnel (15001) -> HBONE mTLS -> server's ztunnel (15008 in the
//! server pod) -> server. The server side must see the client's SPIFFE identity; policies,
//! STRICT mTLS and an istiod restart are checked on the same cluster.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mesh_e2e::probe::{echo, echo_on, echo_until, Echo};
use mesh_e2e::{Istiod, Ztunnel};
use mesh_testutil::netns::{have_root, pod_redirect_rules, EchoServer, RedirectOptions};
use mesh_testutil::{
    namespace_yaml, pod_yaml, service_yaml, workload_info, ClusterDir, FakeZds, PodSpec,
    SnapshotItem, TestNet,
};

const SERVER_PORT: u16 = 8080;
const SERVER_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const CONVERGE: Duration = Duration::from_secs(10);

struct Cluster {
    net: TestNet,
    istiod: Istiod,
    ztunnels: Vec<Ztunnel>,
    _zds: Vec<FakeZds>,
    server: EchoServer,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn pod(&self, name: &str) -> &mesh_testutil::netns::Pod {
        self.net.pod(name).expect("pod exists")
    }

    fn server_addr(&self) -> SocketAddr {
        self.pod("server").addr(SERVER_PORT)
    }

    fn ztunnel(&self, node: &str) -> &Ztunnel {
        self.ztunnels
            .iter()
            .find(|z| z.node() == node)
            .expect("ztunnel of node")
    }

    fn logs(&self) -> String {
        let mut out = format!("--- istiod\n{}", self.istiod.log());
        for z in &self.ztunnels {
            out.push_str(&format!("--- ztunnel {}\n{}", z.node(), z.log()));
        }
        out
    }
}

impl Drop for Cluster {
    /// Failed tests (and `MESH_E2E_LOGS=1`) print every process's log.
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("MESH_E2E_LOGS").is_some() {
            eprintln!("{}", self.logs());
        }
    }
}

/// (pod, node, namespace, service account, enrolled)
const PODS: &[(&str, &str, &str, &str, bool)] = &[
    ("client", "node1", "demo", "client", true),
    ("other", "node1", "demo", "other", true),
    ("legacy", "node1", "legacy", "default", false),
    ("server", "node2", "demo", "server", true),
];

async fn cluster(hint: &str) -> Cluster {
    let mut net = TestNet::new(hint).expect("test network");
    let node1 = net
        .add_node("node1", Ipv4Addr::new(172, 30, 0, 1))
        .expect("node1");
    let node2 = net
        .add_node("node2", Ipv4Addr::new(172, 30, 0, 2))
        .expect("node2");
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster_dir = ClusterDir::new();
    cluster_dir.write(
        "namespaces.yaml",
        &format!(
            "{}---\n{}",
            namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
            namespace_yaml("legacy", &[])
        ),
    );
    let mut zds_pods: Vec<(String, SnapshotItem)> = Vec::new();
    for (i, (name, node_name, ns, sa, enrolled)) in PODS.iter().enumerate() {
        let node = if *node_name == "node1" {
            &node1
        } else {
            &node2
        };
        let ip = node.pod_ip(10 + i as u8);
        let pod = net.add_pod(node, name, ip).expect("pod");
        let labels: &[(&str, &str)] = if *name == "server" {
            &[("app", "server")]
        } else {
            &[("app", name)]
        };
        cluster_dir.write(
            &format!("pod-{name}.yaml"),
            &pod_yaml(&PodSpec {
                namespace: ns,
                name,
                ip: &ip.to_string(),
                node: node_name,
                service_account: sa,
                labels,
            }),
        );
        if *enrolled {
            pod_redirect_rules(&pod, RedirectOptions::default()).expect("capture rules");
            let item = SnapshotItem::add(
                &format!("uid-{name}"),
                workload_info(name, ns, sa),
                pod.netns().open_fd().expect("netns fd"),
            )
            .expect("snapshot item");
            zds_pods.push((node_name.to_string(), item));
        }
    }
    cluster_dir.write(
        "svc-server.yaml",
        &service_yaml("demo", "server", &SERVER_VIP.to_string(), "server"),
    );
    let server = net
        .pod("server")
        .expect("server")
        .netns()
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, SERVER_PORT)))
        .expect("server app");

    let istiod = Istiod::start(node1.netns(), node1.ip(), cluster_dir, &["node1", "node2"]);
    let mut zds = Vec::new();
    let mut ztunnels = Vec::new();
    for node in [&node1, &node2] {
        let path = dir.path().join(format!("zds-{}.sock", node.name()));
        let snapshot = zds_pods
            .iter()
            .filter(|(n, _)| n == node.name())
            .map(|(_, item)| item.clone())
            .collect();
        zds.push(FakeZds::start(&path, snapshot).expect("fake node agent"));
        ztunnels.push(Ztunnel::start(
            node.netns(),
            node.name(),
            node.ip(),
            &istiod,
            &path,
            &[],
        ));
    }
    for z in &ztunnels {
        z.wait_ready(Duration::from_secs(30));
    }
    Cluster {
        net,
        istiod,
        ztunnels,
        _zds: zds,
        server,
        _dir: dir,
    }
}

fn is_ok(e: &Echo) -> bool {
    *e == Echo::Ok
}

fn is_denied(e: &Echo) -> bool {
    matches!(e, Echo::Closed(_))
}

fn metric_lines<'a>(metrics: &'a str, name: &str) -> Vec<&'a str> {
    metrics.lines().filter(|l| l.starts_with(name)).collect()
}

const CLIENT_PRINCIPAL: &str = "spiffe://cluster.local/ns/demo/sa/client";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_traffic_carries_identity_and_obeys_policy() {
    if !have_root("mesh_traffic_carries_identity_and_obeys_policy") {
        return;
    }
    let c = cluster("zti").await;
    let client = c.pod("client").netns().clone();
    let other = c.pod("other").netns().clone();
    let server = c.server_addr();

    // Pod IP and service VIP both go through the mesh.
    let got = echo_until(&client, server, is_ok, CONVERGE);
    assert_eq!(got, Echo::Ok, "client -> server pod IP\n{}", c.logs());
    let vip = SocketAddr::from((SERVER_VIP, 80));
    assert_eq!(
        echo(&client, vip),
        Echo::Ok,
        "client -> service VIP\n{}",
        c.logs()
    );
    // The server application saw the client pod's IP (ENABLE_ORIG_SRC, on by default), not
    // the server pod's own address.
    let client_ip = std::net::IpAddr::V4(c.pod("client").ip());
    let peers = c.server.peers();
    assert!(
        !peers.is_empty() && peers.iter().all(|p| p.ip() == client_ip),
        "the application should see {client_ip} as the source: {peers:?}"
    );

    // The server side saw the client's SPIFFE identity over mTLS.
    let metrics = c.ztunnel("node2").metrics();
    let opened = metric_lines(&metrics, "istio_tcp_connections_opened_total");
    assert!(
        opened.iter().any(|l| l.contains("reporter=\"destination\"")
            && l.contains(&format!("source_principal=\"{CLIENT_PRINCIPAL}\""))
            && l.contains("connection_security_policy=\"mutual_tls\"")),
        "server-side metrics lack the client identity:\n{}",
        opened.join("\n")
    );
    let inbound = c.ztunnel("node2").access_log();
    assert!(
        inbound
            .iter()
            .any(|l| l.to_string().contains(CLIENT_PRINCIPAL)),
        "server-side access log lacks the client identity: {inbound:?}"
    );

    // DENY the client: it is refused, `other` is not.
    c.istiod.cluster.write(
        "deny-client.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-client\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: server\n  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/client\"]\n",
    );
    let got = echo_until(&client, server, is_denied, CONVERGE);
    assert!(
        is_denied(&got),
        "DENY policy not enforced: {got:?}\n{}",
        c.logs()
    );
    assert_eq!(echo(&other, server), Echo::Ok, "other is not denied");
    c.istiod.cluster.remove("deny-client.yaml");
    let got = echo_until(&client, server, is_ok, CONVERGE);
    assert_eq!(
        got,
        Echo::Ok,
        "allowed again after the DENY policy is removed"
    );

    // ALLOW only `other`: the client is refused.
    c.istiod.cluster.write(
        "allow-other.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow-other\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: server\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/other\"]\n",
    );
    let got = echo_until(&client, server, is_denied, CONVERGE);
    assert!(
        is_denied(&got),
        "ALLOW for another principal still let the client in: {got:?}"
    );
    assert_eq!(
        echo(&other, server),
        Echo::Ok,
        "the allowed principal gets through"
    );
    c.istiod.cluster.remove("allow-other.yaml");
    assert_eq!(echo_until(&client, server, is_ok, CONVERGE), Echo::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mtls_refuses_plaintext_and_istiod_restart_keeps_connections() {
    if !have_root("strict_mtls_refuses_plaintext_and_istiod_restart_keeps_connections") {
        return;
    }
    let mut c = cluster("zts").await;
    let client = c.pod("client").netns().clone();
    let legacy = c.pod("legacy").netns().clone();
    let server = c.server_addr();

    // A pod outside the mesh reaches the server in plaintext (captured on 15006) while no
    // PeerAuthentication asks for mTLS.
    assert_eq!(
        echo_until(&legacy, server, is_ok, CONVERGE),
        Echo::Ok,
        "plaintext allowed without STRICT\n{}",
        c.logs()
    );
    // Captured plaintext is dialed from the legacy pod's IP too.
    let legacy_ip = std::net::IpAddr::V4(c.pod("legacy").ip());
    assert_eq!(
        c.server.peers().last().map(|p| p.ip()),
        Some(legacy_ip),
        "the application should see the plaintext client's IP"
    );
    c.istiod.cluster.write(
        "strict.yaml",
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: default\n  namespace: demo\nspec:\n  mtls:\n    mode: STRICT\n",
    );
    let got = echo_until(&legacy, server, is_denied, CONVERGE);
    assert!(
        is_denied(&got),
        "STRICT did not refuse plaintext: {got:?}\n{}",
        c.logs()
    );
    assert_eq!(
        echo(&client, server),
        Echo::Ok,
        "mTLS still passes under STRICT"
    );

    // istiod goes away and comes back: an established connection keeps working throughout,
    // and new connections to known workloads succeed while istiod is down.
    let established = client
        .tcp_connect(server, Duration::from_secs(3))
        .expect("connect");
    assert_eq!(echo_on(&established), Echo::Ok);
    c.istiod.stop();
    assert_eq!(
        echo_on(&established),
        Echo::Ok,
        "established connection while istiod is down"
    );
    assert_eq!(
        echo(&client, server),
        Echo::Ok,
        "new connection while istiod is down"
    );
    c.istiod.restart();
    assert_eq!(
        echo_on(&established),
        Echo::Ok,
        "established connection after istiod restart"
    );
    assert_eq!(
        echo(&client, server),
        Echo::Ok,
        "new connection after istiod restart"
    );
    for z in &c.ztunnels {
        z.wait_ready(Duration::from_secs(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_drains_on_sigterm_and_a_new_one_takes_the_pods_back() {
    if !have_root("ztunnel_drains_on_sigterm_and_a_new_one_takes_the_pods_back") {
        return;
    }
    let mut c = cluster("ztd").await;
    let client = c.pod("client").netns().clone();
    let server = c.server_addr();
    assert_eq!(echo_until(&client, server, is_ok, CONVERGE), Echo::Ok);

    // An open connection through node1's ztunnel; SIGTERM starts the drain. The process
    // exits once the connection is closed at the termination deadline (5 s by default).
    let established = client
        .tcp_connect(server, Duration::from_secs(3))
        .expect("connect");
    assert_eq!(echo_on(&established), Echo::Ok);
    let started = std::time::Instant::now();
    let index = c
        .ztunnels
        .iter()
        .position(|z| z.node() == "node1")
        .expect("node1 ztunnel");
    let clean = c.ztunnels[index].stop(Duration::from_secs(15));
    let took = started.elapsed();
    assert!(clean, "ztunnel exits cleanly after SIGTERM\n{}", c.logs());
    assert!(
        took < Duration::from_secs(8),
        "drain bounded by the termination deadline, took {took:?}"
    );
    assert!(
        matches!(echo_on(&established), Echo::Closed(_)),
        "connections are closed once ztunnel is gone"
    );
    // With the capture rules in place and no ztunnel, new connections fail fast.
    assert!(!matches!(echo(&client, server), Echo::Ok));

    // A new ztunnel gets the pods from the node agent's snapshot and traffic flows again.
    let restarted = std::time::Instant::now();
    c.ztunnels[index].restart();
    let got = echo_until(&client, server, is_ok, CONVERGE);
    assert_eq!(got, Echo::Ok, "traffic after ztunnel restart\n{}", c.logs());
    let back = restarted.elapsed();
    eprintln!("traffic through the new ztunnel {back:?} after it was started");
    assert!(
        back < Duration::from_secs(5),
        "pods back within 5 s, took {back:?}"
    );
}
