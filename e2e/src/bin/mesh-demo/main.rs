//! The local ambient mesh demo: istiod, two nodes each with cni-node and ztunnel, and a sample
//! application in two namespaces, in network namespaces on this machine. It sends traffic and
//! shows what went through the mesh, a policy refusing and then allowing a connection, and
//! metrics; then a waypoint (L7): an HTTPRoute split, an L7 policy, request statistics; then
//! sidecars in `legacy` calling each other and the ambient pods (and called by them).
//! `--keep` leaves everything up until Ctrl-C.

mod sidecar;
mod waypoint;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_e2e::cluster::{ClusterOptions, MeshCluster, MeshPod, PodSpec, Redirection};
use mesh_testutil::{namespace_yaml, service_yaml, ClusterDir, Netns};

const APP_PORT: u16 = 8080;
const SERVICE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

fn step(text: &str) {
    println!("\n\x1b[1;34m==> {text}\x1b[0m");
}

fn main() -> ExitCode {
    let keep = std::env::args().any(|a| a == "--keep");
    let ebpf = std::env::args().any(|a| a == "--ebpf");
    if let Err(problem) = precheck() {
        eprintln!("mesh-demo: {problem}");
        return ExitCode::from(1);
    }
    match run(keep, ebpf) {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("mesh-demo: {problem}");
            ExitCode::FAILURE
        }
    }
}

/// One clear sentence for each missing prerequisite.
fn precheck() -> Result<(), String> {
    if effective_uid() != Some(0) {
        return Err("run the demo as root (it creates network namespaces and nftables rules), e.g. sudo ./scripts/demo.sh".into());
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        return Err("this kernel has no network namespaces; the demo needs CONFIG_NET_NS".into());
    }
    let nft = std::process::Command::new("nft").arg("--version").output();
    if !nft.is_ok_and(|o| o.status.success()) {
        return Err(
            "nftables is missing: run ./scripts/install-deps.sh (apt-get install nftables)".into(),
        );
    }
    if !std::path::Path::new("/usr/lib/cni/bridge").exists() {
        return Err(
            "the CNI reference plugins are missing: apt-get install containernetworking-plugins"
                .into(),
        );
    }
    Ok(())
}

/// The effective uid (`Uid:` real, effective, ... in `/proc/self/status`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn setup(dir: &ClusterDir) {
    dir.write(
        "namespaces.yaml",
        &format!(
            "{}---\n{}",
            namespace_yaml("demo", &[("istio.io/dataplane-mode", "ambient")]),
            namespace_yaml("legacy", &[("istio-injection", "enabled")])
        ),
    );
    dir.write(
        "svc-server.yaml",
        &service_yaml("demo", "server", &SERVICE_VIP.to_string(), "server"),
    );
}

fn run(keep: bool, ebpf: bool) -> Result<(), String> {
    let mode = if ebpf {
        Redirection::Ebpf
    } else {
        Redirection::Nftables
    };
    step("starting istiod, and on node1 and node2 a cni-node agent and a ztunnel");
    let started = Instant::now();
    // As Istio's demo profile: waypoints log every request to stdout.
    let options = ClusterOptions::default().istiod_env("ACCESS_LOG_FILE", "/dev/stdout");
    let mut c = MeshCluster::start_with("demo", &["node1", "node2"], mode, &options, setup);
    println!(
        "ready in {:.1} s (capture: {mode:?}); cluster objects in {}",
        started.elapsed().as_secs_f64(),
        c.objects().path().display()
    );

    step("creating pods through the CNI chain (bridge + host-local + istio-cni), as the kubelet does");
    let pods = [
        PodSpec::new("demo", "server-v1", "node1", "server")
            .label("app", "server")
            .label("version", "v1"),
        PodSpec::new("demo", "server-v2", "node2", "server")
            .label("app", "server")
            .label("version", "v2"),
        PodSpec::new("demo", "client", "node1", "client"),
        PodSpec::new("legacy", "legacy-client", "node2", "default"),
    ];
    let mut made = Vec::new();
    for spec in pods {
        let pod = c.add_pod(spec).map_err(|e| e.to_string())?;
        let enrolled = !pod
            .netns
            .exec_ok("nft", &["list", "tables"])
            .unwrap_or_default()
            .is_empty()
            || ebpf && pod.spec.namespace == "demo";
        println!(
            "  {:<7} {:<14} {:<6} {:<10} {}",
            pod.spec.namespace,
            pod.spec.name,
            pod.spec.node,
            pod.ip,
            if enrolled {
                "enrolled in ambient (traffic captured by ztunnel)"
            } else {
                "not in the mesh"
            }
        );
        made.push(pod);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for pod in made.iter().filter(|p| p.spec.name.starts_with("server")) {
        serve_hello(&pod.netns, &pod.spec.name, stop.clone())?;
    }
    let client = &made[2];
    let legacy = &made[3];
    let vip = SocketAddr::from((SERVICE_VIP, 80));

    step("demo/client calls the service server.demo (VIP 10.96.0.10:80) six times");
    wait_for_mesh(client, vip)?;
    for _ in 0..6 {
        println!("  client -> server.demo: {}", hello(&client.netns, vip)?);
    }
    step("what the server-side ztunnels saw (access log: one line per connection)");
    show_access(&c, "inbound", 4);

    step("legacy/legacy-client (no sidecar: created before injection was enabled; not in the mesh) calls server-v2 directly: plaintext");
    let v2 = made[1].addr(APP_PORT);
    println!(
        "  legacy-client -> server-v2: {}",
        hello(&legacy.netns, v2)?
    );
    show_access(&c, "inbound", 1);

    step("AuthorizationPolicy: DENY demo/client at the servers");
    c.objects().write(
        "deny-client.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-client\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: server\n  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/demo/sa/client\"]\n",
    );
    let refused = until(|| hello(&client.netns, vip).is_err());
    println!(
        "  client -> server.demo: {}",
        if refused {
            "refused (connection closed by the mesh)".to_string()
        } else {
            "still allowed?!".to_string()
        }
    );
    show_access(&c, "inbound", 1);
    step("removing the policy");
    c.objects().remove("deny-client.yaml");
    until(|| hello(&client.netns, vip).is_ok());
    println!("  client -> server.demo: {}", hello(&client.netns, vip)?);

    step("metrics (ztunnel on node2, port 15020): istio_tcp_connections_opened_total");
    let metrics = c.node("node2").ztunnel.metrics();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total"))
        .take(4)
    {
        println!("  {}", shorten_metric(line));
    }

    let servers: Vec<&MeshPod> = made
        .iter()
        .filter(|p| p.spec.name.starts_with("server"))
        .collect();
    let l7 = waypoint::run(&mut c, client, &servers)?;
    let client = c.pod("client").clone();
    let sidecars = sidecar::run(&mut c, &client)?;

    if keep {
        explore(&c);
        l7.explore();
        sidecars.explore();
        wait_for_ctrl_c();
    }
    step("tearing down (processes, namespaces, rules)");
    stop.store(true, Ordering::Relaxed);
    drop(sidecars);
    drop(l7);
    drop(c);
    println!("done");
    Ok(())
}

/// A tiny app: answers each connection with its name, then echoes.
fn serve_hello(netns: &Netns, name: &str, stop: Arc<AtomicBool>) -> Result<(), String> {
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT));
    let listener: TcpListener = netns.tcp_listen(addr).map_err(|e| e.to_string())?;
    let name = name.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(mut conn) = conn else { continue };
            let name = name.clone();
            std::thread::spawn(move || {
                let _ = writeln!(conn, "hello from {name}");
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(())
}

fn hello(netns: &Netns, addr: SocketAddr) -> Result<String, String> {
    let stream: TcpStream = netns
        .tcp_connect(addr, Duration::from_secs(3))
        .map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.is_empty() {
        return Err("connection closed without an answer".into());
    }
    Ok(line.trim().to_string())
}

fn wait_for_mesh(client: &MeshPod, addr: SocketAddr) -> Result<(), String> {
    if until(|| hello(&client.netns, addr).is_ok()) {
        Ok(())
    } else {
        Err(format!(
            "the client could not reach {addr} through the mesh"
        ))
    }
}

fn until(mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The last `n` access-log lines of `direction` across the ztunnels, in a readable form.
fn show_access(c: &MeshCluster, direction: &str, n: usize) {
    std::thread::sleep(Duration::from_millis(200));
    let mut lines: Vec<(String, String)> = Vec::new();
    for node in &c.nodes {
        for l in node.ztunnel.access_log() {
            if l["direction"] != direction {
                continue;
            }
            let field = |k: &str| l[k].as_str().unwrap_or("").to_string();
            let ts = field("timestamp");
            let identity = match field("src.identity") {
                id if id.is_empty() => "no identity (plaintext)".to_string(),
                id => format!("mTLS, peer {id}"),
            };
            let outcome = match field("error") {
                e if e.is_empty() => format!("ok, {} bytes", l["bytes_recv"]),
                e => format!("REFUSED: {e}"),
            };
            lines.push((
                ts,
                format!(
                    "  [{} ztunnel] {} -> {} ({}): {identity}; {outcome}",
                    node.node.name(),
                    field("src.addr"),
                    field("dst.workload"),
                    field("dst.addr"),
                ),
            ));
        }
    }
    lines.sort();
    for (_, line) in lines.iter().rev().take(n).rev() {
        println!("{line}");
    }
}

fn shorten_metric(line: &str) -> String {
    let keep = [
        "reporter",
        "source_principal",
        "destination_workload",
        "connection_security_policy",
    ];
    let Some((labels, value)) = line
        .strip_prefix("istio_tcp_connections_opened_total{")
        .and_then(|rest| rest.split_once("} "))
    else {
        return line.to_string();
    };
    let picked: Vec<&str> = labels
        .split(',')
        .filter(|kv| keep.iter().any(|k| kv.starts_with(&format!("{k}="))))
        .collect();
    format!(
        "istio_tcp_connections_opened_total{{{}}} {value}",
        picked.join(",")
    )
}

fn explore(c: &MeshCluster) {
    step("the mesh stays up until Ctrl-C. Explore it:");
    let node1 = c.node("node1").node.netns().name().to_string();
    let istioctl = mesh_e2e::bins::binary("istioctl");
    let istioctl = istioctl.display();
    println!("  ip netns list                                        # nodes and pods");
    println!("  ip netns exec {node1} {istioctl} ztunnel-config workloads");
    println!("  ip netns exec {node1} {istioctl} ztunnel-config certificates");
    println!("  ip netns exec {node1} curl -s localhost:15000/config_dump | less");
    println!("  ip netns exec {node1} curl -s 172.30.0.1:15020/metrics | grep istio_tcp");
    println!(
        "  edit YAML in {} (policies, labels) and watch it apply",
        c.objects().path().display()
    );
}

fn wait_for_ctrl_c() {
    let (tx, rx) = std::sync::mpsc::channel();
    let handler = move || {
        let _ = tx.send(());
    };
    if let Err(e) = set_ctrl_c(handler) {
        eprintln!("cannot wait for Ctrl-C ({e}); tearing down now");
        return;
    }
    let _ = rx.recv();
}

fn set_ctrl_c(handler: impl Fn() + Send + 'static) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        handler();
    });
    Ok(())
}
