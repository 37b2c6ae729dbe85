//! The nftables redirector against real network namespaces (root; CI runs as root): the rules
//! it writes over netlink equal istio-cni's (`nft`-written by mesh-testutil, and the golden
//! files), the traffic they capture, idempotency, and the host probe SNAT sets.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_node::redirect::{
    HostProbeConfig, HostProbeSnat, NftablesRedirector, PodNetwork, RedirectError, Redirector,
};
use mesh_capture::PROXY_MARK;
use mesh_testutil::netns::{
    have_root, original_dst, pod_redirect_rules, Netns, Pod, RedirectOptions, TestNet,
};

const TIMEOUT: Duration = Duration::from_secs(3);

fn pod_network(pod: &Pod, dns_capture: bool) -> PodNetwork {
    PodNetwork {
        netns: pod.netns().path(),
        ips: vec![IpAddr::V4(pod.ip())],
        dns_capture,
        bypass_inbound: false,
    }
}

/// `nft list ruleset` in `netns` without counter values and comments.
fn ruleset(netns: &Netns) -> String {
    netns.nft_ruleset().expect("nft list ruleset")
}

/// Compares with `tests/golden/<name>`; `UPDATE_GOLDEN=1` rewrites it.
fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    mesh_testutil::golden(&path, actual);
}

fn net_with_pods(hint: &str, pods: u8) -> (TestNet, Vec<Pod>) {
    let mut net = TestNet::new(hint).expect("test network");
    let node = net
        .add_node("node", Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let pods = (0..pods)
        .map(|i| {
            let ip = node.pod_ip(i + 2);
            net.add_pod(&node, &format!("pod{i}"), ip).expect("pod")
        })
        .collect();
    (net, pods)
}

fn capture_rule_count(netns: &Netns) -> usize {
    let rules = netns.ip(&["rule", "show"]).expect("ip rule");
    rules
        .lines()
        .filter(|l| l.starts_with("32764:") && l.contains("fwmark 0x111/0xfff lookup 100"))
        .count()
}

fn table_100(netns: &Netns) -> String {
    netns
        .ip(&["route", "show", "table", "100"])
        .unwrap_or_default()
}

#[test]
fn rules_equal_istio_cni_and_golden() {
    if !have_root("rules_equal_istio_cni_and_golden") {
        return;
    }
    let (_net, pods) = net_with_pods("ng", 4);
    let redirector = NftablesRedirector::new();
    for (dns, ours, reference, file) in [
        (false, &pods[0], &pods[1], "inpod-default.nft"),
        (true, &pods[2], &pods[3], "inpod-dns.nft"),
    ] {
        redirector.enroll(&pod_network(ours, dns)).expect("enroll");
        pod_redirect_rules(reference, RedirectOptions { dns_capture: dns }).expect("nft rules");
        let listed = ruleset(ours.netns());
        assert_eq!(
            listed,
            ruleset(reference.netns()),
            "netlink rules differ from nft's"
        );
        golden(file, &listed);
        assert_eq!(capture_rule_count(ours.netns()), 1);
        assert!(
            table_100(ours.netns()).contains("local default dev lo"),
            "{}",
            table_100(ours.netns())
        );
        assert!(redirector
            .is_enrolled(&pod_network(ours, dns))
            .expect("is_enrolled"));
        // Enrolled with the other DNS setting is not "the complete capture".
        assert!(!redirector
            .is_enrolled(&pod_network(ours, !dns))
            .expect("is_enrolled"));
    }
}

/// Accepts one connection on `listener` within [`TIMEOUT`].
fn accept_within(listener: &TcpListener) -> Option<TcpStream> {
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => return Some(stream),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    None
}

fn listen(netns: &Netns, port: u16) -> TcpListener {
    netns
        .tcp_listen(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        .expect("listen")
}

fn connect(from: &Pod, to: SocketAddr) -> impl FnOnce() -> TcpStream + '_ {
    move || from.netns().tcp_connect(to, TIMEOUT).expect("connect")
}

/// Connects and checks that `listener` got the connection; returns its original destination.
fn lands_on(connect: impl FnOnce() -> TcpStream, listener: &TcpListener) -> SocketAddrV4 {
    let _client = connect();
    let accepted =
        accept_within(listener).expect("connection did not land on the expected listener");
    original_dst(&accepted).expect("SO_ORIGINAL_DST")
}

#[test]
fn traffic_is_captured_then_released() {
    if !have_root("traffic_is_captured_then_released") {
        return;
    }
    let (_net, pods) = net_with_pods("nt", 2);
    let (app, peer) = (&pods[0], &pods[1]);
    let redirector = NftablesRedirector::new();
    let pod = pod_network(app, false);
    redirector.enroll(&pod).expect("enroll");

    let outbound = listen(app.netns(), 15001);
    let inbound = listen(app.netns(), 15006);
    let hbone = listen(app.netns(), 15008);
    let local = app
        .netns()
        .tcp_listen("127.0.0.1:9000".parse().expect("addr"))
        .expect("listen");
    let peer_server = listen(peer.netns(), 80);

    // Outbound TCP from the app lands on 15001 with the real target as original dst.
    let dst = lands_on(connect(app, peer.addr(80)), &outbound);
    assert_eq!(SocketAddr::V4(dst), peer.addr(80));
    // ztunnel's own (marked) sockets go straight to the peer.
    let marked = app
        .netns()
        .tcp_connect_marked(peer.addr(80), PROXY_MARK, TIMEOUT)
        .expect("marked connect");
    assert!(
        accept_within(&peer_server).is_some(),
        "marked connection was captured"
    );
    drop(marked);
    // Loopback stays local.
    lands_on(
        connect(app, "127.0.0.1:9000".parse().expect("addr")),
        &local,
    );
    // Inbound to :80 lands on 15006; HBONE (15008) is not redirected.
    let dst = lands_on(connect(peer, app.addr(80)), &inbound);
    assert_eq!(SocketAddr::V4(dst), app.addr(80));
    lands_on(connect(peer, app.addr(15008)), &hbone);
    assert!(
        accept_within(&inbound).is_none(),
        "15008 traffic reached the 15006 listener"
    );

    redirector.unenroll(&pod).expect("unenroll");
    assert!(!redirector.is_enrolled(&pod).expect("is_enrolled"));
    assert_eq!(
        ruleset(app.netns()).trim(),
        "",
        "ruleset left after unenroll"
    );
    assert_eq!(capture_rule_count(app.netns()), 0);
    assert_eq!(table_100(app.netns()).trim(), "");
    // Direct again.
    let _client = app
        .netns()
        .tcp_connect(peer.addr(80), TIMEOUT)
        .expect("connect");
    assert!(
        accept_within(&peer_server).is_some(),
        "not direct after unenroll"
    );
    assert!(accept_within(&outbound).is_none());
}

#[test]
fn enroll_and_unenroll_are_idempotent() {
    if !have_root("enroll_and_unenroll_are_idempotent") {
        return;
    }
    let (_net, pods) = net_with_pods("ni", 1);
    let redirector = NftablesRedirector::new();
    let pod = pod_network(&pods[0], true);
    let started = Instant::now();
    redirector.enroll(&pod).expect("enroll");
    let enrolled = started.elapsed();
    let first = ruleset(pods[0].netns());
    redirector.enroll(&pod).expect("enroll again");
    assert_eq!(
        ruleset(pods[0].netns()),
        first,
        "re-enroll changed the ruleset"
    );
    assert_eq!(capture_rule_count(pods[0].netns()), 1);
    assert!(redirector.is_enrolled(&pod).expect("is_enrolled"));
    let started = Instant::now();
    redirector.unenroll(&pod).expect("unenroll");
    let unenrolled = started.elapsed();
    redirector.unenroll(&pod).expect("unenroll again");
    println!("enroll took {enrolled:?}, unenroll {unenrolled:?}");
    assert_eq!(ruleset(pods[0].netns()).trim(), "");

    // A netns that is gone: nothing to unenroll, not enrolled, enroll fails naming it.
    let gone = PodNetwork {
        netns: PathBuf::from("/var/run/netns/mesh-test-no-such-netns"),
        ..pod.clone()
    };
    redirector
        .unenroll(&gone)
        .expect("unenroll of a gone netns");
    assert!(!redirector.is_enrolled(&gone).expect("is_enrolled"));
    let error = redirector
        .enroll(&gone)
        .expect_err("enroll of a gone netns");
    assert!(
        error.to_string().contains("mesh-test-no-such-netns"),
        "{error}"
    );
}

#[test]
fn enroll_on_a_file_that_is_no_netns_applies_nothing() {
    if !have_root("enroll_on_a_file_that_is_no_netns_applies_nothing") {
        return;
    }
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let pod = PodNetwork {
        netns: file.path().to_owned(),
        ips: vec![Ipv4Addr::new(10, 9, 9, 9).into()],
        dns_capture: false,
        bypass_inbound: false,
    };
    let error = NftablesRedirector::new()
        .enroll(&pod)
        .expect_err("not a netns");
    assert!(matches!(error, RedirectError::NotNetns { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains(&file.path().display().to_string()),
        "{error}"
    );
    // Nothing landed in this (the test's own) namespace.
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(!tables.contains("istio-ambient-mangle"), "{tables}");
}

fn list_set(netns: &Netns) -> String {
    netns
        .exec_ok(
            "nft",
            &[
                "list",
                "set",
                "inet",
                "istio-ambient-nat",
                "istio-inpod-probes-v4",
            ],
        )
        .expect("nft list set")
}

#[test]
fn host_probe_snat_sets_follow_pods() {
    if !have_root("host_probe_snat_sets_follow_pods") {
        return;
    }
    let (net, pods) = net_with_pods("nh", 2);
    let node = net.node("node").expect("node").netns().clone();
    let config = HostProbeConfig {
        ipv6: false,
        ..HostProbeConfig::default()
    };
    let host = HostProbeSnat::in_netns(config, node.path());
    host.install().expect("install");
    host.install().expect("install again");
    let (a, b) = (IpAddr::V4(pods[0].ip()), IpAddr::V4(pods[1].ip()));
    host.add_pod_ip(a).expect("add a");
    host.add_pod_ip(a).expect("add a again");
    host.add_pod_ip(b).expect("add b");
    let set = list_set(&node);
    assert!(
        set.contains(&a.to_string()) && set.contains(&b.to_string()),
        "{set}"
    );
    host.remove_pod_ip(a).expect("remove a");
    host.remove_pod_ip(a).expect("remove a again");
    host.install().expect("install keeps the set");
    let set = list_set(&node);
    assert!(
        !set.contains(&a.to_string()) && set.contains(&b.to_string()),
        "{set}"
    );
    golden("host-probe.nft", &ruleset(&node));

    // A probe from the node (uid 0) to an enrolled pod arrives from 169.254.7.127, uncaptured.
    let redirector = NftablesRedirector::new();
    redirector
        .enroll(&pod_network(&pods[1], false))
        .expect("enroll");
    let app = listen(pods[1].netns(), 8080);
    let captured = listen(pods[1].netns(), 15006);
    let _probe = node
        .tcp_connect(pods[1].addr(8080), TIMEOUT)
        .expect("probe");
    let accepted = accept_within(&app).expect("probe did not reach the app port");
    let peer = accepted.peer_addr().expect("peer");
    assert_eq!(peer.ip(), IpAddr::V4(Ipv4Addr::new(169, 254, 7, 127)));
    assert!(accept_within(&captured).is_none());

    host.remove_all().expect("remove all");
    host.remove_all().expect("remove all again");
    assert_eq!(ruleset(&node).trim(), "");
    assert!(
        host.add_pod_ip(a).is_err(),
        "adding to a removed table must fail"
    );
}

#[test]
fn gone_netns_path_is_reported() {
    let error = HostProbeSnat::in_netns(HostProbeConfig::default(), Path::new("/nonexistent/ns"))
        .install()
        .expect_err("no netns");
    assert!(error.to_string().contains("/nonexistent/ns"), "{error}");
}

#[test]
fn ipv6_pods_get_ip6_rules_and_routing() {
    if !have_root("ipv6_pods_get_ip6_rules_and_routing") {
        return;
    }
    let (_net, pods) = net_with_pods("n6", 1);
    let netns = pods[0].netns();
    let mut pod = pod_network(&pods[0], true);
    pod.ips.push("fd00:10:1::2".parse().expect("v6"));
    let redirector = NftablesRedirector::new();
    redirector.enroll(&pod).expect("enroll");
    let listed = ruleset(netns);
    for rule in [
        "meta l4proto tcp ip6 saddr fd16:9254:7127:1337:ffff:ffff:ffff:ffff counter accept",
        "ip6 daddr != ::1 tcp dport != 15008 meta mark & 0x00000fff != 0x00000539 counter redirect to :15006",
        "ip6 daddr != ::1 tcp dport 53 meta mark & 0x00000fff != 0x00000539 counter redirect to :15053",
        "oifname \"lo\" ip6 daddr != ::1 counter accept",
        "meta l4proto tcp ip6 daddr != ::1 meta mark & 0x00000fff != 0x00000539 counter redirect to :15001",
    ] {
        assert!(listed.lines().any(|l| l.trim() == rule), "missing {rule:?} in\n{listed}");
    }
    let rules = netns.ip(&["-6", "rule", "show"]).expect("ip -6 rule");
    assert!(
        rules.contains("32764:\tfrom all fwmark 0x111/0xfff lookup 100"),
        "{rules}"
    );
    let routes = netns
        .ip(&["-6", "route", "show", "table", "100"])
        .expect("ip -6 route");
    assert!(routes.contains("local default dev lo"), "{routes}");
    assert!(redirector.is_enrolled(&pod).expect("is_enrolled"));
    redirector.unenroll(&pod).expect("unenroll");
    let rules = netns.ip(&["-6", "rule", "show"]).expect("ip -6 rule");
    assert!(!rules.contains("fwmark 0x111"), "{rules}");
    assert_eq!(
        netns
            .ip(&["-6", "route", "show", "table", "100"])
            .unwrap_or_default()
            .trim(),
        ""
    );
}
