//! `pilot-agent istio-iptables` against real network namespaces (root; CI runs as root): the
//! rules it writes (golden `nft list ruleset`), the traffic they capture and leave alone (the
//! app's uid against the proxy's uid and gid, excluded ports, loopback, the inbound
//! passthrough), the `--run-validation` check as the proxy's uid, cleanup, and bad flags.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use mesh_testutil::netns::{have_root, original_dst, Netns, Pod, TestNet};

const TIMEOUT: Duration = Duration::from_secs(3);
const PROXY: u32 = 1337;
const APP_PORT: u16 = 8080;

fn agent() -> &'static str {
    env!("CARGO_BIN_EXE_pilot-agent")
}

/// The injector's `istio-init` arguments (the tests add `-o 9000`).
const ISTIO_INIT: [&str; 18] = [
    "istio-iptables",
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
    "--log_output_level=default:info",
];

fn run_agent(netns: &Netns, args: &[&str], uid: Option<u32>) -> Output {
    netns
        .run(|| {
            let mut command = Command::new(agent());
            command.args(args).env("RUST_LOG", "info");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
            command.output()
        })
        .expect("enter netns")
        .expect("run pilot-agent")
}

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

/// A listener standing in for the proxy's `port`: reports each connection's original
/// destination.
fn proxy_listener(netns: &Netns, port: u16) -> mpsc::Receiver<SocketAddrV4> {
    let listener = netns
        .tcp_listen(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        .expect("proxy listener");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            if let Ok(dst) = original_dst(&stream) {
                let _ = tx.send(dst);
            }
        }
    });
    rx
}

/// Connects from `netns` as `uid`/`gid` (this thread only), optionally from `source`, and
/// checks one echoed byte when `echo`.
#[allow(unsafe_code)]
fn connect_as(
    netns: &Netns,
    uid: u32,
    gid: u32,
    source: Option<IpAddr>,
    to: SocketAddr,
) -> std::io::Result<TcpStream> {
    netns
        .run(|| {
            // The raw syscalls change this thread's effective ids only (glibc's wrappers
            // would change every thread's); the saved ids stay root's, so the thread takes
            // root back before it leaves the namespace (which needs CAP_SYS_ADMIN).
            let set_ids = |uid: i64, gid: i64| {
                // SAFETY: plain syscalls with integer arguments.
                let (g, u) = unsafe {
                    (
                        libc::syscall(libc::SYS_setresgid, -1i64, gid, -1i64),
                        libc::syscall(libc::SYS_setresuid, -1i64, uid, -1i64),
                    )
                };
                assert!(
                    g == 0 && u == 0,
                    "setres[ug]id: {}",
                    std::io::Error::last_os_error()
                );
            };
            let connect = || -> std::io::Result<TcpStream> {
                let socket =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                if let Some(ip) = source {
                    socket.bind(&SocketAddr::new(ip, 0).into())?;
                }
                socket.connect_timeout(&to.into(), TIMEOUT)?;
                Ok(socket.into())
            };
            set_ids(i64::from(uid), i64::from(gid));
            let result = connect();
            // Root first (uid), then the group.
            // SAFETY: as above.
            let back = unsafe { libc::syscall(libc::SYS_setresuid, -1i64, 0i64, -1i64) };
            assert_eq!(back, 0, "back to root");
            set_ids(0, 0);
            result
        })
        .expect("enter netns")
}

/// Echo servers answer with what they get: proves the connection reached a real server and
/// not a capture listener (which never answers).
fn echoes(mut stream: TcpStream) -> bool {
    stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    let _ = stream.write_all(b"x");
    let mut buf = [0u8; 1];
    matches!(stream.read(&mut buf), Ok(1))
}

struct Setup {
    _net: TestNet,
    app: Pod,
    peer: Pod,
}

fn setup(hint: &str) -> Setup {
    let mut net = TestNet::new(hint).expect("test network");
    let node = net
        .add_node("node", Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let app = net.add_pod(&node, "app", node.pod_ip(2)).expect("app pod");
    let peer = net
        .add_pod(&node, "peer", node.pod_ip(3))
        .expect("peer pod");
    Setup {
        _net: net,
        app,
        peer,
    }
}

fn expect_captured(rx: &mpsc::Receiver<SocketAddrV4>, to: SocketAddr, what: &str) {
    let got = rx
        .recv_timeout(TIMEOUT)
        .unwrap_or_else(|_| panic!("{what}: not captured"));
    assert_eq!(SocketAddr::V4(got), to, "{what}: original destination");
}

#[test]
fn istio_init_captures_the_app_and_leaves_the_proxy_alone() {
    if !have_root("istio_init_captures_the_app_and_leaves_the_proxy_alone") {
        return;
    }
    let Setup { _net, app, peer } = setup("sci");
    let netns_path = app.netns().path();
    let mut args: Vec<&str> = ISTIO_INIT.to_vec();
    args.extend(["-o", "9000"]);
    let path = netns_path.to_string_lossy().into_owned();
    // From the host with --network-namespace, as cni-node-less tooling may run it.
    let output = Command::new(agent())
        .args(&args)
        .args(["--network-namespace", &path])
        .output()
        .expect("run");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    golden("sidecar-default.nft", &ruleset(app.netns()));
    // Applying again replaces the rules: the same rule set, no duplicates.
    let again = run_agent(app.netns(), &args, None);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    golden("sidecar-default.nft", &ruleset(app.netns()));

    let outbound = proxy_listener(app.netns(), 15001);
    let inbound = proxy_listener(app.netns(), 15006);
    let _app_server = app
        .netns()
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT)))
        .expect("app");
    let _status = app
        .netns()
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 15021)))
        .expect("15021");
    let _hbone = app
        .netns()
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 15008)))
        .expect("15008");
    let _peer80 = peer.netns().echo_server(peer.addr(80)).expect("peer 80");
    let _peer9000 = peer
        .netns()
        .echo_server(peer.addr(9000))
        .expect("peer 9000");

    // The app's outbound goes to 15001 with its original destination.
    let _s = connect_as(app.netns(), 0, 0, None, peer.addr(80)).expect("app out");
    expect_captured(&outbound, peer.addr(80), "app -> peer:80");
    // The proxy's own (uid or gid 1337) goes out directly.
    assert!(echoes(
        connect_as(app.netns(), PROXY, 0, None, peer.addr(80)).expect("uid 1337")
    ));
    assert!(echoes(
        connect_as(app.netns(), 0, PROXY, None, peer.addr(80)).expect("gid 1337")
    ));
    // An excluded outbound port goes out directly.
    assert!(echoes(
        connect_as(app.netns(), 0, 0, None, peer.addr(9000)).expect("port 9000")
    ));
    // Loopback is not captured.
    let local = SocketAddr::from((Ipv4Addr::LOCALHOST, APP_PORT));
    assert!(echoes(
        connect_as(app.netns(), 0, 0, None, local).expect("loopback")
    ));

    // Inbound to an app port goes to 15006; 15008 and the excluded 15021 reach their servers.
    let _s = peer
        .netns()
        .tcp_connect(app.addr(APP_PORT), TIMEOUT)
        .expect("inbound");
    expect_captured(&inbound, app.addr(APP_PORT), "peer -> app:8080");
    assert!(echoes(
        peer.netns()
            .tcp_connect(app.addr(15008), TIMEOUT)
            .expect("15008")
    ));
    assert!(echoes(
        peer.netns()
            .tcp_connect(app.addr(15021), TIMEOUT)
            .expect("15021")
    ));

    // The proxy calling its own pod's IP goes through the inbound side, unless it comes from
    // the passthrough address 127.0.0.6 (the proxy handing an inbound connection to the app).
    let _s =
        connect_as(app.netns(), PROXY, PROXY, None, app.addr(APP_PORT)).expect("proxy to pod ip");
    expect_captured(&inbound, app.addr(APP_PORT), "proxy -> own pod ip");
    let passthrough = Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)));
    assert!(echoes(
        connect_as(app.netns(), PROXY, PROXY, passthrough, app.addr(APP_PORT))
            .expect("passthrough")
    ));
    assert!(
        outbound.try_recv().is_err() && inbound.try_recv().is_err(),
        "nothing else captured"
    );
    drop((outbound, inbound));

    // Cleanup removes the tables; the app's traffic goes out directly again.
    let cleanup = run_agent(app.netns(), &["istio-iptables", "--cleanup-only"], None);
    assert!(
        cleanup.status.success(),
        "{}",
        String::from_utf8_lossy(&cleanup.stderr)
    );
    assert!(
        !ruleset(app.netns()).contains("istio-proxy"),
        "tables removed"
    );
    assert!(echoes(
        connect_as(app.netns(), 0, 0, None, peer.addr(80)).expect("direct")
    ));
}

#[test]
fn validation_passes_only_when_capture_is_in_place() {
    if !have_root("validation_passes_only_when_capture_is_in_place") {
        return;
    }
    let Setup { _net, app, .. } = setup("scv");
    let validate = [
        "istio-iptables",
        "--log_output_level=default:info",
        "--run-validation",
        "--skip-rule-apply",
        "--probe-timeout",
        "2s",
    ];
    // No rules yet: the check fails with Istio's exit code 126 and says why.
    let failed = run_agent(app.netns(), &validate, Some(PROXY));
    assert_eq!(failed.status.code(), Some(126), "{failed:?}");
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("127.0.0.6:15002") && stderr.contains("not in place"),
        "{stderr}"
    );

    let applied = run_agent(app.netns(), &ISTIO_INIT, None);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let passed = run_agent(app.netns(), &validate, Some(PROXY));
    assert!(
        passed.status.success(),
        "{}",
        String::from_utf8_lossy(&passed.stderr)
    );
}

#[test]
fn bad_flags_are_named_and_write_nothing() {
    if !have_root("bad_flags_are_named_and_write_nothing") {
        return;
    }
    let Setup { _net, app, .. } = setup("scb");
    for (args, names) in [
        (vec!["-b", "80,http"], ["-b", "\"http\""]),
        (vec!["-i", "10.0.0.0/40"], ["-i", "10.0.0.0/40"]),
        (vec!["-x", "*"], ["-x", "*"]),
        (vec!["-m", "TPROXY"], ["TPROXY", "REDIRECT"]),
        (vec!["-u", ""], ["-u/--proxy-uid", "uid"]),
    ] {
        let mut full = vec!["istio-iptables", "-d", "15090,15021,15020"];
        full.extend(args.iter().copied());
        let output = run_agent(app.netns(), &full, None);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        for name in names {
            assert!(
                stderr.contains(name),
                "{args:?}: {stderr} should name {name}"
            );
        }
        assert!(
            !ruleset(app.netns()).contains("istio-proxy"),
            "{args:?} wrote rules"
        );
    }
}

#[test]
fn address_ranges_are_written_as_nft_writes_them() {
    if !have_root("address_ranges_are_written_as_nft_writes_them") {
        return;
    }
    let Setup { _net, app, peer } = setup("scr");
    let args = [
        "istio-iptables",
        "-i",
        "10.96.0.0/12,172.30.0.0/16,0.0.0.0/0",
        "-x",
        "10.96.0.10,192.168.0.0/17",
        "-b",
        "8080",
        "-q",
        "7000",
    ];
    let output = run_agent(app.netns(), &args, None);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    golden("sidecar-ranges.nft", &ruleset(app.netns()));
    // The pods' range (172.30.0.0/16 here) is captured; only 8080 is captured inbound.
    let outbound = proxy_listener(app.netns(), 15001);
    let _s = connect_as(app.netns(), 0, 0, None, peer.addr(80)).expect("app out");
    expect_captured(
        &outbound,
        peer.addr(80),
        "app -> peer:80 in an included range",
    );
    let _other = app
        .netns()
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 9090)))
        .expect("app 9090");
    assert!(echoes(
        peer.netns()
            .tcp_connect(app.addr(9090), TIMEOUT)
            .expect("9090")
    ));
}
