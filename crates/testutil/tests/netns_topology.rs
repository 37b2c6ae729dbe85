//! Real network namespaces, veths, routes and nftables: needs root. Without root the tests say
//! so and return, unless `CI` is set, where they panic.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_capture::{HBONE_PORT, INBOUND_CAPTURE_PORT, OUTBOUND_CAPTURE_PORT, PROXY_MARK};
use mesh_testutil::netns::{
    have_root, original_dst, pod_redirect_rules, remove_redirect_rules, Node, Pod, RedirectOptions,
    STATE_DIR,
};
use mesh_testutil::TestNet;

const TIMEOUT: Duration = Duration::from_secs(5);
const LEAK_HELPER_ENV: &str = "MESH_TESTNET_LEAK_HELPER";

/// `TestNet::new` removes stale topologies too: the leak test holds this exclusively so that the
/// other tests of this binary cannot clean its leaked topology first.
static NEW_TOPOLOGY: std::sync::RwLock<()> = std::sync::RwLock::new(());

struct TwoByTwo {
    net: TestNet,
    node_a: Node,
    a1: Pod,
    a2: Pod,
    b1: Pod,
    b2: Pod,
}

fn two_by_two(hint: &str) -> TwoByTwo {
    let mut net = {
        let _no_leak_test_running = NEW_TOPOLOGY.read().unwrap_or_else(|e| e.into_inner());
        TestNet::new(hint).expect("topology")
    };
    let node_a = net
        .add_node("node-a", Ipv4Addr::new(172, 30, 0, 11))
        .expect("node a");
    let node_b = net
        .add_node("node-b", Ipv4Addr::new(172, 30, 0, 12))
        .expect("node b");
    let a1 = net
        .add_pod(&node_a, "a1", node_a.pod_ip(2))
        .expect("pod a1");
    let a2 = net
        .add_pod(&node_a, "a2", node_a.pod_ip(3))
        .expect("pod a2");
    let b1 = net
        .add_pod(&node_b, "b1", node_b.pod_ip(2))
        .expect("pod b1");
    let b2 = net
        .add_pod(&node_b, "b2", node_b.pod_ip(3))
        .expect("pod b2");
    TwoByTwo {
        net,
        node_a,
        a1,
        a2,
        b1,
        b2,
    }
}

fn accept_within(listener: &TcpListener, timeout: Duration) -> Option<TcpStream> {
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).expect("blocking");
                return Some(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn assert_echo(mut stream: TcpStream, message: &[u8]) {
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    stream.write_all(message).expect("write");
    let mut back = vec![0u8; message.len()];
    stream.read_exact(&mut back).expect("echo reply");
    assert_eq!(back, message);
}

/// The host's interfaces (`ip -o link` lines) whose name contains `prefix`.
fn host_links(prefix: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains(prefix))
        .map(str::to_owned)
        .collect()
}

/// The `ip netns list` entries whose name contains `prefix`.
fn host_netns(prefix: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains(prefix))
        .map(str::to_owned)
        .collect()
}

/// Everything of `prefix` visible from the host: interfaces and namespaces.
fn host_leftovers(prefix: &str) -> Vec<String> {
    let mut all = host_links(prefix);
    all.extend(host_netns(prefix));
    all
}

/// Running (not exited, not a zombie) process?
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(')')
                .next()
                .map(|rest| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

#[test]
fn pods_reach_each_other_across_and_within_nodes() {
    if !have_root("pods_reach_each_other_across_and_within_nodes") {
        return;
    }
    let started = Instant::now();
    let t = two_by_two("mt");
    let built = started.elapsed();
    eprintln!(
        "2 nodes + 4 pods built in {built:?} (prefix {})",
        t.net.prefix()
    );
    assert!(built < Duration::from_secs(2), "building took {built:?}");
    assert!(t.net.prefix().len() <= 10);
    assert_eq!(
        host_links(t.net.prefix()),
        Vec::<String>::new(),
        "host links untouched"
    );
    assert_eq!(
        host_netns(t.net.prefix()).len(),
        7,
        "underlay, 2 nodes, 4 pods"
    );

    // Node forwarding on, lo up everywhere.
    assert_eq!(
        t.node_a.netns().sysctl_get("net.ipv4.ip_forward").unwrap(),
        "1"
    );
    for netns in t.net.namespaces() {
        let lo = netns.ip(&["-o", "link", "show", "lo"]).expect("lo");
        assert!(lo.contains("UP"), "lo down in {}: {lo}", netns.name());
    }

    // Across nodes, with the pod IPs preserved end to end (no NAT).
    let listener =
        t.b1.netns()
            .tcp_listen(t.b1.addr(8080))
            .expect("listen in b1");
    let client =
        t.a1.netns()
            .tcp_connect(t.b1.addr(8080), TIMEOUT)
            .expect("a1 -> b1");
    let server = accept_within(&listener, TIMEOUT).expect("b1 accepts a1");
    assert_eq!(server.peer_addr().unwrap().ip(), IpAddr::V4(t.a1.ip()));
    assert_eq!(client.peer_addr().unwrap(), t.b1.addr(8080));

    // Echo both ways, same node and across nodes.
    let echo_a2 = t.a2.netns().echo_server(t.a2.addr(80)).expect("echo in a2");
    let echo_b2 = t.b2.netns().echo_server(t.b2.addr(80)).expect("echo in b2");
    assert_echo(
        t.a1.netns()
            .tcp_connect(t.a2.addr(80), TIMEOUT)
            .expect("a1 -> a2"),
        b"same node",
    );
    assert_echo(
        t.a1.netns()
            .tcp_connect(t.b2.addr(80), TIMEOUT)
            .expect("a1 -> b2"),
        b"cross node",
    );
    assert_echo(
        t.b1.netns()
            .tcp_connect(t.a2.addr(80), TIMEOUT)
            .expect("b1 -> a2"),
        b"back again",
    );
    assert_eq!((echo_a2.accepted(), echo_b2.accepted()), (2, 1));

    // Nothing listening: refused, not a hang.
    let refused =
        t.a1.netns()
            .tcp_connect(t.b1.addr(9), TIMEOUT)
            .expect_err("nothing on :9");
    assert!(refused.to_string().contains("refused"), "{refused}");
}

#[test]
fn late_nodes_and_pods_outside_the_node_cidr_are_routed() {
    if !have_root("late_nodes_and_pods_outside_the_node_cidr_are_routed") {
        return;
    }
    let mut t = two_by_two("mr");
    // Outside node A's 10.1.0.0/24: /32 routes on the other nodes.
    let stray = t
        .net
        .add_pod(&t.node_a, "stray", Ipv4Addr::new(10, 99, 0, 5))
        .expect("pod outside the CIDR");
    let node_c = t
        .net
        .add_node("node-c", Ipv4Addr::new(172, 30, 0, 13))
        .expect("a node added after the pods");
    assert_eq!(node_c.pod_cidr(), (Ipv4Addr::new(10, 3, 0, 0), 24));
    let c1 = t
        .net
        .add_pod(&node_c, "c1", node_c.pod_ip(2))
        .expect("pod c1");

    let echo = stray
        .netns()
        .echo_server(stray.addr(80))
        .expect("echo in stray");
    for from in [&t.b1, &c1, &t.a1] {
        let stream = from.netns().tcp_connect(stray.addr(80), TIMEOUT);
        assert_echo(stream.expect("reach the stray pod"), from.name().as_bytes());
    }
    let echo_c1 = c1.netns().echo_server(c1.addr(80)).expect("echo in c1");
    assert_echo(
        t.b2.netns()
            .tcp_connect(c1.addr(80), TIMEOUT)
            .expect("b2 -> c1"),
        b"late",
    );
    assert_eq!((echo.accepted(), echo_c1.accepted()), (3, 1));

    // Bad input is refused before anything is created.
    let before = t.net.namespaces().len();
    let dup = t
        .net
        .add_pod(&node_c, "a1", node_c.pod_ip(9))
        .expect_err("duplicate name");
    assert_eq!(dup.reason(), "invalid_name");
    let taken = t
        .net
        .add_pod(&node_c, "c2", c1.ip())
        .expect_err("duplicate IP");
    assert_eq!(taken.reason(), "invalid_address");
    let gateway = t
        .net
        .add_pod(&node_c, "c3", node_c.gateway())
        .expect_err("gateway IP");
    assert_eq!(gateway.reason(), "invalid_address");
    let off = t
        .net
        .add_node("node-d", Ipv4Addr::new(192, 168, 1, 1))
        .expect_err("off underlay");
    assert_eq!(off.reason(), "invalid_address");
    assert_eq!(t.net.namespaces().len(), before);
}

#[test]
fn outbound_capture_lands_on_15001_and_marked_sockets_bypass_it() {
    if !have_root("outbound_capture_lands_on_15001_and_marked_sockets_bypass_it") {
        return;
    }
    let t = two_by_two("mo");
    pod_redirect_rules(&t.a1, RedirectOptions::default()).expect("redirect rules");
    let rules = t.a1.netns().ip(&["rule", "show"]).expect("ip rule");
    assert!(rules.contains("fwmark 0x111/0xfff lookup 100"), "{rules}");
    let table =
        t.a1.netns()
            .ip(&["route", "show", "table", "100"])
            .expect("table 100");
    assert!(table.contains("local default dev lo"), "{table}");

    let outbound =
        t.a1.netns()
            .tcp_listen(SocketAddr::from(([0, 0, 0, 0], OUTBOUND_CAPTURE_PORT)))
            .expect("15001");
    let echo = t.b1.netns().echo_server(t.b1.addr(80)).expect("echo in b1");

    // Unmarked: captured, and SO_ORIGINAL_DST names the real target.
    let client =
        t.a1.netns()
            .tcp_connect(t.b1.addr(80), TIMEOUT)
            .expect("captured connect");
    let captured = accept_within(&outbound, TIMEOUT).expect("connection lands on 15001");
    assert_eq!(
        SocketAddr::V4(original_dst(&captured).expect("SO_ORIGINAL_DST")),
        t.b1.addr(80)
    );
    drop((client, captured));
    assert_eq!(
        echo.accepted(),
        0,
        "the captured connection must not reach b1"
    );

    // Marked like ztunnel's sockets: straight to b1.
    let marked =
        t.a1.netns()
            .tcp_connect_marked(t.b1.addr(80), PROXY_MARK, TIMEOUT)
            .expect("marked");
    assert_echo(marked, b"ztunnel");
    assert_eq!(echo.accepted(), 1);
    assert!(
        accept_within(&outbound, Duration::from_millis(100)).is_none(),
        "marked was captured"
    );

    // Loopback is not captured.
    let local =
        t.a1.netns()
            .echo_server(SocketAddr::from(([127, 0, 0, 1], 7000)))
            .expect("lo echo");
    assert_echo(
        t.a1.netns()
            .tcp_connect(local.addr(), TIMEOUT)
            .expect("loopback"),
        b"lo",
    );

    // Removal restores direct traffic and leaves nothing behind; it is idempotent.
    remove_redirect_rules(&t.a1).expect("remove");
    remove_redirect_rules(&t.a1).expect("remove again");
    assert_echo(
        t.a1.netns()
            .tcp_connect(t.b1.addr(80), TIMEOUT)
            .expect("direct"),
        b"free",
    );
    assert_eq!(echo.accepted(), 2);
    let tables =
        t.a1.netns()
            .exec_ok("nft", &["list", "tables"])
            .expect("nft list");
    assert!(!tables.contains("istio-ambient"), "{tables}");
    assert!(!t
        .a1
        .netns()
        .ip(&["rule", "show"])
        .unwrap()
        .contains("0x111"));
    // Re-installing twice does not duplicate the routing rule.
    pod_redirect_rules(&t.a1, RedirectOptions { dns_capture: true }).expect("install");
    pod_redirect_rules(&t.a1, RedirectOptions { dns_capture: true }).expect("reinstall");
    let rules = t.a1.netns().ip(&["rule", "show", "pref", "32764"]).unwrap();
    assert_eq!(rules.lines().count(), 1, "{rules}");
}

#[test]
fn inbound_capture_lands_on_15006_but_hbone_15008_is_not_redirected() {
    if !have_root("inbound_capture_lands_on_15006_but_hbone_15008_is_not_redirected") {
        return;
    }
    let t = two_by_two("mi");
    pod_redirect_rules(&t.a1, RedirectOptions::default()).expect("redirect rules");
    let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
    let inbound =
        t.a1.netns()
            .tcp_listen(any(INBOUND_CAPTURE_PORT))
            .expect("15006");
    let hbone = t.a1.netns().tcp_listen(any(HBONE_PORT)).expect("15008");

    for (from, what) in [(&t.b1, "other node"), (&t.a2, "same node")] {
        let _client = from
            .netns()
            .tcp_connect(t.a1.addr(80), TIMEOUT)
            .expect("connect to :80");
        let captured =
            accept_within(&inbound, TIMEOUT).unwrap_or_else(|| panic!("{what}: no 15006"));
        assert_eq!(
            SocketAddr::V4(original_dst(&captured).unwrap()),
            t.a1.addr(80),
            "{what}"
        );
        assert_eq!(
            captured.peer_addr().unwrap().ip(),
            IpAddr::V4(from.ip()),
            "{what}: source kept"
        );
    }

    let _client =
        t.b1.netns()
            .tcp_connect(t.a1.addr(HBONE_PORT), TIMEOUT)
            .expect("to :15008");
    let direct = accept_within(&hbone, TIMEOUT).expect("lands on 15008 itself");
    assert_eq!(direct.local_addr().unwrap(), t.a1.addr(HBONE_PORT));
    assert!(
        accept_within(&inbound, Duration::from_millis(100)).is_none(),
        "15008 was redirected"
    );
}

#[test]
fn drop_removes_namespaces_links_and_processes_even_on_panic() {
    if !have_root("drop_removes_namespaces_links_and_processes_even_on_panic") {
        return;
    }
    let t = two_by_two("md");
    let prefix = t.net.prefix().to_owned();
    pod_redirect_rules(&t.b2, RedirectOptions::default()).expect("rules");
    let mut sleep = Command::new("sleep");
    sleep
        .arg("1000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let leaked = t.b1.netns().spawn(&mut sleep).expect("spawn");
    let leaked_pid = leaked.id();
    std::mem::forget(leaked); // a guard that never drops: the TestNet must still kill it
    let mut kept = t.a1.netns().spawn(&mut sleep).expect("spawn");
    assert_eq!(t.b1.netns().pids(), vec![leaked_pid as i32]);
    assert_eq!(host_netns(&prefix).len(), 7);
    assert!(std::path::Path::new(STATE_DIR).join(&prefix).exists());

    drop(t);
    assert_eq!(host_leftovers(&prefix), Vec::<String>::new());
    assert!(
        !running(leaked_pid),
        "process in a pod survived the topology"
    );
    assert!(
        kept.try_wait().expect("wait").is_some(),
        "guarded process survived"
    );
    assert!(!std::path::Path::new(STATE_DIR).join(&prefix).exists());

    // Unwinding from a panic drops the topology too.
    let mut prefix = String::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let t = two_by_two("mp");
        prefix = t.net.prefix().to_owned();
        panic!("test failure inside a topology");
    }));
    assert!(result.is_err());
    assert!(!prefix.is_empty());
    assert_eq!(host_leftovers(&prefix), Vec::<String>::new());
}

/// Not a test of its own: `cleanup_stale_removes_a_leaked_topology` runs this in a child
/// process (with `MESH_TESTNET_LEAK_HELPER=1`) that builds a topology and exits without
/// dropping it, like a killed test run.
#[test]
fn leak_helper() {
    if std::env::var_os(LEAK_HELPER_ENV).is_none() {
        return;
    }
    let t = two_by_two("ml");
    let mut sleep = Command::new("sleep");
    sleep
        .arg("1000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = t.a2.netns().spawn(&mut sleep).expect("spawn");
    println!("LEAKED prefix={} pid={}", t.net.prefix(), child.id());
    std::process::exit(0);
}

#[test]
fn cleanup_stale_removes_a_leaked_topology() {
    if !have_root("cleanup_stale_removes_a_leaked_topology") {
        return;
    }
    let live = two_by_two("mv");
    let exclusive = NEW_TOPOLOGY.write().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().expect("test binary");
    let output = Command::new(exe)
        .args(["--exact", "leak_helper", "--nocapture", "--test-threads=1"])
        .env(LEAK_HELPER_ENV, "1")
        .stderr(Stdio::inherit())
        .output()
        .expect("run the leak helper");
    assert!(output.status.success(), "leak helper failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| Some(l.split_once("LEAKED ")?.1))
        .expect("helper output");
    let (prefix, pid) = line.split_once(' ').expect("prefix and pid");
    let prefix = prefix.strip_prefix("prefix=").expect("prefix").to_owned();
    let pid: u32 = pid
        .strip_prefix("pid=")
        .expect("pid")
        .parse()
        .expect("pid number");
    assert_eq!(
        host_netns(&prefix).len(),
        7,
        "the helper's topology is there"
    );
    assert!(running(pid));

    let state_file = std::path::Path::new(STATE_DIR).join(&prefix);
    assert!(state_file.exists());
    let removed = TestNet::cleanup_stale().expect("cleanup");
    drop(exclusive);
    // Another process on this machine may have run cleanup_stale first: the state file goes
    // only after a complete teardown either way.
    assert!(
        removed.contains(&prefix) || !state_file.exists(),
        "{removed:?} lacks {prefix}"
    );
    assert!(!state_file.exists());
    assert_eq!(host_leftovers(&prefix), Vec::<String>::new());
    let deadline = Instant::now() + TIMEOUT;
    while running(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!running(pid), "the leaked process survived");

    // A live topology is never stale.
    assert!(!removed.contains(&live.net.prefix().to_owned()));
    let echo = live.b2.netns().echo_server(live.b2.addr(80)).expect("echo");
    assert_echo(
        live.a1
            .netns()
            .tcp_connect(echo.addr(), TIMEOUT)
            .expect("still works"),
        b"alive",
    );
}
