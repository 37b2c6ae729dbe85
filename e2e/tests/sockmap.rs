//! The sockmap option (`AMBIENT_SOCKMAP=true`) in the whole local mesh, with eBPF capture:
//! the client pod's leg (app -> ztunnel) and the server pod's leg (ztunnel -> app) go socket to
//! socket, and nothing else changes: bytes arrive exact both ways with half-close, the
//! Service VIP still reaches the server (ztunnel read the original destination), the server
//! application sees the client's IP and the server's ztunnel its identity, and an
//! AuthorizationPolicy still denies. Each agent's `/debug/sockmap` shows the bytes it carried.
//! When the programs cannot load, the agent says why and the mesh works without them.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use mesh_e2e::cluster::{ClusterOptions, MeshCluster, MeshNode, MeshPod, PodSpec, Redirection};
use mesh_e2e::probe::{echo_until, Echo};
use mesh_testutil::netns::{have_root, EchoServer};
use mesh_testutil::{namespace_yaml, service_yaml, ClusterDir};

const SERVER_PORT: u16 = 8080;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const CONVERGE: Duration = Duration::from_secs(10);
const CLIENT: &str = "spiffe://cluster.local/ns/demo/sa/client";
const PAYLOAD: usize = 2 << 20;

fn setup(dir: &ClusterDir) {
    dir.write(
        "namespaces.yaml",
        &namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
    );
    dir.write(
        "svc-server.yaml",
        &service_yaml("demo", "server", &VIP.to_string(), "server"),
    );
}

/// `(redirectedBytes, appSockets, proxySockets)` from the node agent's `/debug/sockmap`.
fn sockmap_stats(node: &MeshNode) -> (u64, u64, u64) {
    let (status, body) = node
        .agent
        .get("/debug/sockmap")
        .expect("the agent answers /debug/sockmap");
    assert_eq!(status, 200, "{body}\n{}", node.agent.log());
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON counters");
    let field = |name: &str| {
        json[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name} in {body}"))
    };
    (
        field("redirectedBytes"),
        field("appSockets"),
        field("proxySockets"),
    )
}

/// Reads to the end. `EAGAIN` from a blocking read means "read again" on a socket in a sock
/// hash (see docs/architecture.md, sockmap), as it does for event-loop applications.
fn read_to_end(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Two nodes with eBPF capture and `options`, a server pod (node2) running an echo server on
/// [`SERVER_PORT`] and a client pod (node1): (cluster, client, the server application).
fn start(hint: &str, options: &ClusterOptions) -> (MeshCluster, MeshPod, EchoServer) {
    let mut c =
        MeshCluster::start_with(hint, &["node1", "node2"], Redirection::Ebpf, options, setup);
    let server = c
        .add_pod(PodSpec::new("demo", "server", "node2", "server"))
        .unwrap_or_else(|e| panic!("server pod: {e}\n{}", c.logs()));
    let client = c
        .add_pod(PodSpec::new("demo", "client", "node1", "client"))
        .unwrap_or_else(|e| panic!("client pod: {e}\n{}", c.logs()));
    let app = server
        .netns
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, SERVER_PORT)))
        .expect("server app");
    (c, client, app)
}

#[test]
fn sockmap_carries_the_in_pod_legs_with_mesh_semantics() {
    if !have_root("sockmap_carries_the_in_pod_legs_with_mesh_semantics") {
        return;
    }
    let options = ClusterOptions::default().agent_env("AMBIENT_SOCKMAP", "true");
    let (c, client, app) = start("msk", &options);

    // Through the Service VIP: ztunnel must have read the original destination.
    let vip = SocketAddr::from((VIP, SERVER_PORT));
    let ok = |e: &Echo| *e == Echo::Ok;
    assert_eq!(
        echo_until(&client.netns, vip, ok, CONVERGE),
        Echo::Ok,
        "{}",
        c.logs()
    );
    assert_eq!(
        app.peers().last().map(|p| p.ip()),
        Some(std::net::IpAddr::V4(client.ip)),
        "the server application sees the client's IP"
    );
    assert!(
        c.node("node2").ztunnel.saw_inbound_from(CLIENT),
        "the server's ztunnel saw the client's identity\n{}",
        c.logs()
    );

    // Bulk both ways: the echo server returns every byte, then the client half-closes and
    // still reads the rest of the echo and the end of the stream.
    let before = [
        sockmap_stats(c.node("node1")),
        sockmap_stats(c.node("node2")),
    ];
    let mut stream = client
        .netns
        .tcp_connect(vip, Duration::from_secs(3))
        .expect("connect through the mesh");
    let data: Vec<u8> = (0..PAYLOAD).map(|i| (i % 251) as u8).collect();
    let mut writer = stream.try_clone().expect("clone");
    let sent = data.clone();
    let sender = std::thread::spawn(move || {
        writer.write_all(&sent)?;
        writer.shutdown(Shutdown::Write)
    });
    let echoed = read_to_end(&mut stream).expect("read the echo");
    sender
        .join()
        .expect("writer thread")
        .expect("send and half-close");
    assert!(
        echoed == data,
        "the echo differs: {} of {} bytes\n{}",
        echoed.len(),
        data.len(),
        c.logs()
    );
    let after = [
        sockmap_stats(c.node("node1")),
        sockmap_stats(c.node("node2")),
    ];
    for (node, (before, after)) in ["node1", "node2"].iter().zip(before.iter().zip(&after)) {
        // Each in-pod leg carries the payload once per direction.
        assert!(
            after.0 - before.0 >= 2 * PAYLOAD as u64,
            "{node}: the in-pod leg went socket to socket: {before:?} -> {after:?}"
        );
        assert!(
            after.1 > before.1 && after.2 > before.2,
            "{node}: {before:?} -> {after:?}"
        );
    }

    // Policy still applies at the server's ztunnel.
    c.objects().write(
        "deny.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-client\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: server\n  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/client\"]\n",
    );
    let denied = echo_until(
        &client.netns,
        vip,
        |e| matches!(e, Echo::Closed(_)),
        CONVERGE,
    );
    assert!(
        matches!(denied, Echo::Closed(_)),
        "denied: {denied:?}\n{}",
        c.logs()
    );
    let accepted = app.accepted();
    let again = mesh_e2e::probe::echo(&client.netns, vip);
    assert!(matches!(again, Echo::Closed(_)), "denied again: {again:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        app.accepted(),
        accepted,
        "a denied connection never reaches the application"
    );
}

#[test]
fn without_sockmap_support_the_agent_warns_and_the_mesh_works() {
    if !have_root("without_sockmap_support_the_agent_warns_and_the_mesh_works") {
        return;
    }
    // A directory that is no cgroup: attaching sock_ops fails, as on a kernel without it.
    let not_a_cgroup = tempfile::tempdir().expect("temp dir");
    let options = ClusterOptions::default()
        .agent_env("AMBIENT_SOCKMAP", "true")
        .agent_env(
            "AMBIENT_SOCKMAP_CGROUP",
            &not_a_cgroup.path().display().to_string(),
        );
    let (c, client, _app) = start("msf", &options);
    let vip = SocketAddr::from((VIP, SERVER_PORT));
    assert_eq!(
        echo_until(&client.netns, vip, |e| *e == Echo::Ok, CONVERGE),
        Echo::Ok,
        "{}",
        c.logs()
    );
    for node in ["node1", "node2"] {
        let agent = &c.node(node).agent;
        let log = agent.log();
        assert!(
            log.contains("sockmap unavailable, in-pod legs keep TCP") && log.contains("cgroup v2"),
            "{node}: the agent says why:\n{log}"
        );
        let status = agent.get("/debug/sockmap").map(|(status, _)| status);
        assert_eq!(status, Some(404), "{node}: no sockmap, no counters");
    }
}
