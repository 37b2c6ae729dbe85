//! The eBPF redirector against real network namespaces (root; CI runs as root): a pod's
//! outbound and inbound TCP reach listeners on 15001 / 15006 inside it (marked and made like
//! ztunnel's) with the original destination as their local address; marked sockets, 15008 and
//! the probe source bypass; no listener fails closed; unenroll restores direct traffic;
//! enrolling twice leaves one set of filters; a failure part-way is undone.
#![cfg(feature = "ebpf")]

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use cni_node::redirect::ebpf::EbpfRedirector;
use cni_node::redirect::{PodNetwork, RedirectError, Redirector};
use mesh_capture::PROXY_MARK;
use mesh_testutil::netns::{have_root, original_dst, Netns, Pod, TestNet};
use nix::sys::socket::{self, sockopt};

const TIMEOUT: Duration = Duration::from_secs(3);
const OUTBOUND: u16 = 15001;
const INBOUND: u16 = 15006;

fn pod_network(pod: &Pod) -> PodNetwork {
    PodNetwork {
        netns: pod.netns().path(),
        ips: vec![IpAddr::V4(pod.ip())],
        dns_capture: false,
        bypass_inbound: false,
    }
}

/// A node with pods `a` (10.1.0.2) and `b` (10.1.0.3), and `probe` at 169.254.7.127.
fn net() -> (TestNet, Pod, Pod, Pod) {
    let mut net = TestNet::new("ebp").expect("test network");
    let node = net
        .add_node("node", Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let a = net.add_pod(&node, "a", node.pod_ip(2)).expect("pod a");
    let b = net.add_pod(&node, "b", node.pod_ip(3)).expect("pod b");
    let probe = net
        .add_pod(&node, "probe", Ipv4Addr::new(169, 254, 7, 127))
        .expect("probe pod");
    (net, a, b, probe)
}

/// A listener on `0.0.0.0:port` in `netns` made like ztunnel's in-pod listeners: `SO_MARK`
/// 1337, `SO_REUSEADDR` + `SO_REUSEPORT`, and `IP_TRANSPARENT` (needed on 15001, whose
/// accepted sockets answer from the original, non-local destination).
fn proxy_listener(netns: &Netns, port: u16) -> TcpListener {
    netns
        .run(|| -> std::io::Result<TcpListener> {
            let fd = socket::socket(
                socket::AddressFamily::Inet,
                socket::SockType::Stream,
                socket::SockFlag::SOCK_CLOEXEC,
                socket::SockProtocol::Tcp,
            )?;
            socket::setsockopt(&fd, sockopt::Mark, &PROXY_MARK)?;
            socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
            socket::setsockopt(&fd, sockopt::ReusePort, &true)?;
            socket::setsockopt(&fd, sockopt::IpTransparent, &true)?;
            let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            socket::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &socket::SockaddrStorage::from(addr),
            )?;
            socket::listen(&fd, socket::Backlog::new(128)?)?;
            let listener = TcpListener::from(fd);
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .expect("enter netns")
        .expect("proxy listener")
}

/// Accepts one connection within [`TIMEOUT`], or `None`.
fn accept(listener: &TcpListener) -> Option<TcpStream> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).expect("blocking");
                stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
                return Some(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Bytes flow both ways between `client` and `server`.
fn exchange(client: &mut TcpStream, server: &mut TcpStream) {
    client.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    client.write_all(b"ping").expect("client write");
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).expect("server read");
    assert_eq!(&buf, b"ping");
    server.write_all(b"pong").expect("server write");
    client.read_exact(&mut buf).expect("client read");
    assert_eq!(&buf, b"pong");
}

/// Echo round trip through `stream` (to an echo server).
fn echo(stream: &mut TcpStream) {
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    stream.write_all(b"echo").expect("write");
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).expect("echo read");
    assert_eq!(&buf, b"echo");
}

fn tc_filters(netns: &Netns, dev: &str, hook: &str) -> String {
    netns
        .exec_ok("tc", &["filter", "show", "dev", dev, hook])
        .expect("tc filter show")
}

/// How many of our filters `tc filter show` lists on `dev` `hook` (one line per filter).
fn count_filters(netns: &Netns, dev: &str, hook: &str, name: &str) -> usize {
    // `filter protocol all pref 1337 bpf chain 0 handle 0x1 mesh_capture_in direct-action ...`
    tc_filters(netns, dev, hook)
        .lines()
        .filter(|line| line.split_whitespace().any(|word| word == name))
        .count()
}

/// No fwmark rule, no route in the capture's table and `accept_local` back to 0.
fn assert_no_delivery_left(ns: &Netns) {
    let rules = ns.ip(&["rule", "show", "pref", "32763"]).expect("rule");
    assert!(rules.trim().is_empty(), "{rules}");
    let routes = ns.ip(&["route", "show", "table", "101"]).expect("route");
    assert!(routes.trim().is_empty(), "{routes}");
    assert_eq!(
        ns.sysctl_get("net.ipv4.conf.lo.accept_local")
            .expect("sysctl"),
        "0"
    );
}

fn redirector() -> EbpfRedirector {
    EbpfRedirector::new().expect("the kernel loads the capture programs")
}

#[test]
fn outbound_reaches_15001_with_the_original_destination() {
    if !have_root("outbound_reaches_15001_with_the_original_destination") {
        return;
    }
    let (_net, a, b, _) = net();
    let b_server = b.netns().echo_server(b.addr(80)).expect("echo on b");
    let redirect = redirector();
    redirect.enroll(&pod_network(&a)).expect("enroll a");
    assert!(redirect.is_enrolled(&pod_network(&a)).expect("is_enrolled"));
    let outbound = proxy_listener(a.netns(), OUTBOUND);

    let mut client = a.netns().tcp_connect(b.addr(80), TIMEOUT).expect("connect");
    let mut accepted = accept(&outbound).expect("captured on 15001");
    assert_eq!(accepted.local_addr().expect("local"), b.addr(80));
    assert_eq!(
        accepted.peer_addr().expect("peer"),
        client.local_addr().expect("client")
    );
    // No NAT: SO_ORIGINAL_DST has no answer (or, with conntrack on, the local address).
    match original_dst(&accepted) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
        Ok(dst) => assert_eq!(SocketAddr::V4(dst), b.addr(80)),
    }
    exchange(&mut client, &mut accepted);
    assert_eq!(b_server.accepted(), 0, "b saw nothing");

    // ztunnel's own (marked) connection goes out directly.
    let mut marked = a
        .netns()
        .tcp_connect_marked(b.addr(80), PROXY_MARK, TIMEOUT)
        .expect("marked connect");
    echo(&mut marked);
    assert_eq!(b_server.accepted(), 1);
    // Traffic inside the pod is not captured.
    let a_local = a.netns().echo_server(a.addr(8080)).expect("echo on a");
    let mut local = a.netns().tcp_connect(a.addr(8080), TIMEOUT).expect("local");
    echo(&mut local);
    assert_eq!(a_local.accepted(), 1);
}

#[test]
fn inbound_reaches_15006_except_hbone_and_probes() {
    if !have_root("inbound_reaches_15006_except_hbone_and_probes") {
        return;
    }
    let (_net, a, b, probe) = net();
    let app = a.netns().echo_server(a.addr(80)).expect("app on a");
    let hbone = a.netns().echo_server(a.addr(15008)).expect("15008 on a");
    let redirect = redirector();
    redirect.enroll(&pod_network(&a)).expect("enroll a");
    let inbound = proxy_listener(a.netns(), INBOUND);

    let mut client = b.netns().tcp_connect(a.addr(80), TIMEOUT).expect("connect");
    let mut accepted = accept(&inbound).expect("captured on 15006");
    assert_eq!(accepted.local_addr().expect("local"), a.addr(80));
    assert_eq!(
        accepted.peer_addr().expect("peer"),
        client.local_addr().expect("client")
    );
    exchange(&mut client, &mut accepted);
    assert_eq!(app.accepted(), 0, "the app is reached only through ztunnel");

    let mut to_hbone = b
        .netns()
        .tcp_connect(a.addr(15008), TIMEOUT)
        .expect("15008");
    echo(&mut to_hbone);
    assert_eq!(hbone.accepted(), 1, "15008 is not captured");
    let mut from_probe = probe
        .netns()
        .tcp_connect(a.addr(80), TIMEOUT)
        .expect("probe");
    echo(&mut from_probe);
    assert_eq!(app.accepted(), 1, "the probe source is not captured");
    assert!(accept(&inbound).is_none(), "nothing else reached 15006");
}

#[test]
fn without_a_listener_capture_fails_closed() {
    if !have_root("without_a_listener_capture_fails_closed") {
        return;
    }
    let (_net, a, b, _) = net();
    let b_server = b.netns().echo_server(b.addr(80)).expect("echo on b");
    let _a_app = a.netns().echo_server(a.addr(80)).expect("app on a");
    let redirect = redirector();
    redirect.enroll(&pod_network(&a)).expect("enroll a");
    let short = Duration::from_millis(700);
    // Not to b, and not to a's own listener on :80 either.
    assert!(a.netns().tcp_connect(b.addr(80), short).is_err());
    assert!(b.netns().tcp_connect(a.addr(80), short).is_err());
    assert_eq!(b_server.accepted(), 0);
}

#[test]
fn enroll_is_idempotent_and_unenroll_restores_direct_traffic() {
    if !have_root("enroll_is_idempotent_and_unenroll_restores_direct_traffic") {
        return;
    }
    let (_net, a, b, _) = net();
    let b_server = b.netns().echo_server(b.addr(80)).expect("echo on b");
    let app = a.netns().echo_server(a.addr(80)).expect("app on a");
    let (pod, ns) = (pod_network(&a), a.netns());
    let redirect = redirector();
    redirect.enroll(&pod).expect("enroll");
    redirect.enroll(&pod).expect("enroll again");
    // An agent that restarted enrolls the pod again with programs of its own, then exits: its
    // programs replace ours in the same filters, and the filters outlive it.
    redirector()
        .enroll(&pod)
        .expect("enroll from a restarted agent");
    assert!(redirect.is_enrolled(&pod).expect("is_enrolled"));
    assert_eq!(
        count_filters(ns, a.iface(), "ingress", "mesh_capture_in"),
        1
    );
    assert_eq!(
        count_filters(ns, a.iface(), "egress", "mesh_capture_out"),
        1
    );
    assert_eq!(count_filters(ns, "lo", "ingress", "mesh_capture_lo"), 1);
    let rules = ns.ip(&["rule", "show", "pref", "32763"]).expect("ip rule");
    assert_eq!(rules.lines().count(), 1, "{rules}");
    assert!(
        rules.contains("fwmark 0x111/0xfff iif lo lookup 101"),
        "{rules}"
    );
    let routes = ns.ip(&["route", "show", "table", "101"]).expect("ip route");
    assert_eq!(
        routes.trim(),
        "local default dev lo proto static scope host"
    );

    // Still captured after the re-enrollments, with the restarted agent's programs gone.
    let outbound = proxy_listener(ns, OUTBOUND);
    let _client = ns.tcp_connect(b.addr(80), TIMEOUT).expect("connect");
    assert!(accept(&outbound).is_some(), "captured after re-enroll");

    redirect.unenroll(&pod).expect("unenroll");
    redirect.unenroll(&pod).expect("unenroll again");
    assert!(!redirect.is_enrolled(&pod).expect("is_enrolled"));
    for (dev, hook) in [
        (a.iface(), "ingress"),
        (a.iface(), "egress"),
        ("lo", "ingress"),
    ] {
        let shown = ns
            .exec("tc", &["filter", "show", "dev", dev, hook])
            .expect("tc");
        assert!(String::from_utf8_lossy(&shown.stdout).trim().is_empty());
    }
    let qdiscs = ns.exec_ok("tc", &["qdisc", "show"]).expect("tc qdisc");
    assert!(!qdiscs.contains("clsact"), "{qdiscs}");
    assert_no_delivery_left(ns);

    let mut direct = ns.tcp_connect(b.addr(80), TIMEOUT).expect("direct connect");
    echo(&mut direct);
    assert_eq!(b_server.accepted(), 1);
    let mut inbound = b.netns().tcp_connect(a.addr(80), TIMEOUT).expect("inbound");
    echo(&mut inbound);
    assert_eq!(app.accepted(), 1);
    assert!(accept(&outbound).is_none());
}

#[test]
fn a_failure_part_way_through_enrollment_is_undone() {
    if !have_root("a_failure_part_way_through_enrollment_is_undone") {
        return;
    }
    let (_net, a, _, _) = net();
    let (pod, ns) = (pod_network(&a), a.netns());
    // Someone else's u32 filter holds our priority on the pod interface's egress: that
    // attach fails after lo's filter, the policy routing and the interface's ingress filter
    // are in place.
    ns.exec_ok("tc", &["qdisc", "add", "dev", a.iface(), "clsact"])
        .expect("clsact");
    ns.exec_ok(
        "tc",
        &[
            "filter",
            "add",
            "dev",
            a.iface(),
            "egress",
            "pref",
            "1337",
            "protocol",
            "all",
            "u32",
            "match",
            "u32",
            "0",
            "0",
        ],
    )
    .expect("foreign filter");
    let foreign = tc_filters(ns, a.iface(), "egress");

    let error = redirector()
        .enroll(&pod)
        .expect_err("our priority is taken");
    let text = error.to_string();
    assert!(
        text.contains(a.iface()) && text.contains("mesh_capture_out"),
        "names the interface and the program: {text}"
    );

    // Everything of ours is gone again (accept_local was set to 1 before the failure); the
    // foreign filter and its qdisc stay.
    assert_eq!(tc_filters(ns, a.iface(), "egress"), foreign);
    assert!(tc_filters(ns, a.iface(), "ingress").trim().is_empty());
    assert!(tc_filters(ns, "lo", "ingress").trim().is_empty());
    let qdiscs = ns.exec_ok("tc", &["qdisc", "show"]).expect("tc qdisc");
    assert_eq!(qdiscs.matches("clsact").count(), 1, "{qdiscs}");
    assert_no_delivery_left(ns);
}

#[test]
fn a_gone_netns_is_unenrolled_and_a_wrong_path_is_refused() {
    if !have_root("a_gone_netns_is_unenrolled_and_a_wrong_path_is_refused") {
        return;
    }
    let redirect = redirector();
    let gone = PodNetwork {
        netns: "/var/run/netns/mesh-ebpf-no-such-pod".into(),
        ips: Vec::new(),
        dns_capture: false,
        bypass_inbound: false,
    };
    redirect
        .unenroll(&gone)
        .expect("a gone netns is not an error");
    assert!(matches!(
        redirect.enroll(&gone),
        Err(RedirectError::Netns { .. })
    ));
    let not_netns = PodNetwork {
        netns: "/proc/self/status".into(),
        ..gone
    };
    assert!(matches!(
        redirect.enroll(&not_netns),
        Err(RedirectError::NotNetns { .. })
    ));
    assert_eq!(redirect.name(), "ebpf");
}
