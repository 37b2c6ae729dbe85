//! Waypoint benchmark: HTTP/1.1 1 KB responses over keep-alive connections, in one run,
//! direct (no mesh), through the L4 mesh (two ztunnels) and through a waypoint (ztunnel ->
//! Envoy -> ztunnel). Reports requests/s at saturation, p50/p99 at a fixed rate, the
//! waypoint's CPU (Envoy + pilot-agent) and memory (RSS and private), and how long an
//! HTTPRoute edit takes to be served. Needs root (network namespaces).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use clap::Parser;
use mesh_bench::http_load::{
    cpu_ticks, memory_kib, paced, pct, print_rows, saturate, warm_up, LoadArgs, Row,
};
use mesh_e2e::cluster::{MeshCluster, PodSpec, Redirection};
use mesh_e2e::controller::WaypointController;
use mesh_e2e::kubelet::{gateway_programmed, Kubelet};
use mesh_e2e::procfs::children;
use mesh_testutil::{http_request, namespace_yaml, ClusterDir, HttpApp};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    load: LoadArgs,
}

const BODY: usize = 1024;

/// A minimal Envoy reverse proxy (HTTP/1.1 in, HTTP/1.1 out, no TLS, no internal listeners,
/// no telemetry) from `127.0.0.1:10000` to `upstream`: the floor of Envoy's per-request cost on
/// this machine, next to which the waypoint's figures are read.
fn plain_envoy_bootstrap(upstream: SocketAddr) -> String {
    format!(
        r#"{{"admin": {{"address": {{"socket_address": {{"address": "127.0.0.1", "port_value": 10001}}}}}},
 "static_resources": {{
  "listeners": [{{"name": "plain", "address": {{"socket_address": {{"address": "127.0.0.1", "port_value": 10000}}}},
   "filter_chains": [{{"filters": [{{"name": "envoy.filters.network.http_connection_manager",
    "typed_config": {{"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
     "stat_prefix": "plain",
     "route_config": {{"virtual_hosts": [{{"name": "all", "domains": ["*"], "routes": [{{"match": {{"prefix": "/"}}, "route": {{"cluster": "app"}}}}]}}]}},
     "http_filters": [{{"name": "envoy.filters.http.router", "typed_config": {{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}}}]}}}}]}}]}}],
  "clusters": [{{"name": "app", "type": "STATIC", "connect_timeout": "1s",
   "load_assignment": {{"cluster_name": "app", "endpoints": [{{"lb_endpoints": [{{"endpoint": {{"address": {{"socket_address": {{"address": "{ip}", "port_value": {port}}}}}}}}}]}}]}}}}]}}}}"#,
        ip = upstream.ip(),
        port = upstream.port()
    )
}

fn svc(ns: &str, name: &str, vip: &str, selector: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  clusterIP: {vip}\n  selector: {{app: {selector}}}\n  ports:\n  - name: http\n    port: 80\n    targetPort: http\n"
    )
}

fn setup(dir: &ClusterDir) {
    dir.write("ns-plain.yaml", &namespace_yaml("plain", &[]));
    dir.write(
        "ns-l4.yaml",
        &namespace_yaml("l4", &[("istio.io/dataplane-mode", "ambient")]),
    );
    dir.write(
        "ns-demo.yaml",
        &namespace_yaml(
            "demo",
            &[
                ("istio.io/dataplane-mode", "ambient"),
                ("istio.io/use-waypoint", "waypoint"),
            ],
        ),
    );
    dir.write("svc-l4.yaml", &svc("l4", "server", "10.96.1.10", "server"));
    dir.write(
        "svc-demo.yaml",
        &format!(
            "{}---\n{}",
            svc("demo", "server", "10.96.0.10", "server"),
            svc("demo", "server-v2", "10.96.0.12", "server-v2")
        ),
    );
    dir.write(
        "gateway.yaml",
        &format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: waypoint\n  namespace: demo\nspec:\n  gatewayClassName: istio-waypoint\n  listeners:\n  - name: mesh\n    port: {}\n    protocol: HBONE\n",
            mesh_capture::HBONE_PORT
        ),
    );
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse().load;
    let dur = args.duration();
    let mut c = MeshCluster::start("wpb", &["node1", "node2"], Redirection::Nftables, setup);
    let add = |c: &mut MeshCluster, spec: PodSpec| {
        let name = spec.name.clone();
        c.add_pod(spec)
            .map_err(|e| anyhow::anyhow!("pod {name}: {e}"))
    };
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 8080));
    let body = "x".repeat(BODY);
    let plain_server = add(
        &mut c,
        PodSpec::new("plain", "plain-server", "node2", "server"),
    )?;
    let plain_client = add(
        &mut c,
        PodSpec::new("plain", "plain-client", "node1", "client"),
    )?;
    let l4_server = add(
        &mut c,
        PodSpec::new("l4", "l4-server", "node2", "server").label("app", "server"),
    )?;
    let l4_client = add(&mut c, PodSpec::new("l4", "l4-client", "node1", "client"))?;
    let wp_server = add(
        &mut c,
        PodSpec::new("demo", "wp-server", "node2", "server").label("app", "server"),
    )?;
    let wp_v2 = add(
        &mut c,
        PodSpec::new("demo", "wp-server-v2", "node2", "server").label("app", "server-v2"),
    )?;
    let wp_client = add(&mut c, PodSpec::new("demo", "wp-client", "node1", "client"))?;
    let _apps = [
        HttpApp::start(&plain_server.netns, any, &body)?,
        HttpApp::start(&l4_server.netns, any, &body)?,
        HttpApp::start(&wp_server.netns, any, &body)?,
        HttpApp::start(&wp_v2.netns, any, "v2")?,
    ];
    let proxy_config = format!(
        "{{\"discoveryAddress\":\"{}:15012\",\"concurrency\":{}}}",
        c.istiod.ip(),
        args.envoy_concurrency
    );
    // The waypoint as users get it: the controller deploys the Gateway, the kubelet runs it.
    let _controller = WaypointController::start(&c);
    let mut kubelet = Kubelet::new("node1", &[("PROXY_CONFIG", &proxy_config)]);
    kubelet.run_until(&mut c, Duration::from_secs(60), |c| {
        gateway_programmed(c.objects().path(), "demo", "waypoint")
    });
    let waypoint = kubelet.proxy("demo", "waypoint");
    let agent = waypoint
        .pid()
        .ok_or_else(|| anyhow::anyhow!("agent not running"))?;
    let envoy = *children(agent)
        .first()
        .ok_or_else(|| anyhow::anyhow!("no Envoy under pilot-agent {agent}"))?;
    // The baseline Envoy, in the plain client's namespace, in front of the plain server.
    let envoy_bin =
        mesh_testutil::envoy_path().ok_or_else(|| anyhow::anyhow!("no Envoy (set ENVOY_PATH)"))?;
    let baseline_dir = tempfile::tempdir()?;
    let baseline_cfg = baseline_dir.path().join("plain-envoy.json");
    std::fs::write(
        &baseline_cfg,
        plain_envoy_bootstrap(plain_server.addr(8080)),
    )?;
    let mut baseline_cmd = std::process::Command::new(&envoy_bin);
    baseline_cmd
        .arg("-c")
        .arg(&baseline_cfg)
        .arg("--concurrency")
        .arg(args.envoy_concurrency.to_string())
        .arg("--log-level")
        .arg("warn")
        .arg("--base-id")
        .arg("77")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let baseline = plain_client.netns.spawn(&mut baseline_cmd)?;
    let baseline_pid = baseline.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let targets = [
        ("direct", &plain_client.netns, plain_server.addr(8080)),
        (
            "L4 mesh (2 ztunnels)",
            &l4_client.netns,
            SocketAddr::from(([10, 96, 1, 10], 80)),
        ),
        (
            "waypoint",
            &wp_client.netns,
            SocketAddr::from(([10, 96, 0, 10], 80)),
        ),
        (
            "plain Envoy proxy (baseline)",
            &plain_client.netns,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 10000)),
        ),
    ];
    // Warm up every path (certificates, pooled HBONE connections).
    warm_up(&targets)?;
    let mut rows = Vec::new();
    let mut wp_cpu = (0.0, 0.0);
    let mut baseline_cpu = 0.0;
    let idle_mem = (memory_kib(envoy), memory_kib(agent));
    for (name, netns, addr) in &targets {
        let rps = rt.block_on(saturate(netns, *addr, args.connections, dur))?;
        let (e0, a0, b0) = (cpu_ticks(envoy), cpu_ticks(agent), cpu_ticks(baseline_pid));
        let lat = rt.block_on(paced(netns, *addr, args.rate, dur))?;
        if name.starts_with("plain Envoy") {
            baseline_cpu = (cpu_ticks(baseline_pid) - b0) as f64 / (dur.as_secs_f64() * 100.0);
        }
        if *name == "waypoint" {
            let secs = dur.as_secs_f64() * 100.0;
            wp_cpu = (
                (cpu_ticks(envoy) - e0) as f64 / secs,
                (cpu_ticks(agent) - a0) as f64 / secs,
            );
        }
        rows.push(Row { name, rps, lat });
    }
    let busy_mem = (memory_kib(envoy), memory_kib(agent));

    // Route change: from the HTTPRoute file written to the waypoint serving it.
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: probe\n  namespace: demo\nspec:\n  parentRefs:\n  - {group: \"\", kind: Service, name: server, port: 80}\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /probe}}]\n    backendRefs: [{name: server-v2, port: 80}]\n  - backendRefs: [{name: server, port: 80}]\n";
    let vip = SocketAddr::from(([10, 96, 0, 10], 80));
    let mut route_ms = Vec::new();
    for i in 0..5 {
        let name = format!("route-{i}.yaml");
        let path = format!("/probe{i}");
        let text = route
            .replace("name: probe", &format!("name: probe{i}"))
            .replace("value: /probe", &format!("value: {path}"));
        let start = Instant::now();
        c.objects().write(&name, &text);
        loop {
            if http_request(
                &wp_client.netns,
                vip,
                "GET",
                &path,
                &[],
                Duration::from_secs(2),
            )
            .is_some_and(|r| r.body == "v2")
            {
                break;
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(10),
                "route {i} never served"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        route_ms.push(start.elapsed().as_secs_f64() * 1000.0);
        c.objects().remove(&name);
        std::thread::sleep(Duration::from_millis(300));
    }

    println!("\nwaypoint HTTP benchmark: {BODY} B responses, HTTP/1.1 keep-alive, {} s per figure, saturation with {} connections, latency at {} rps, Envoy concurrency {}\n", dur.as_secs(), args.connections, args.rate, args.envoy_concurrency);
    print_rows(&rows, args.rate);
    let l4 = pct(&rows[1].lat, 0.5);
    let wp = pct(&rows[2].lat, 0.5);
    println!(
        "\nwaypoint over L4 mesh at p50: +{:.0} us (target <= 500 us)",
        (wp.as_secs_f64() - l4.as_secs_f64()) * 1e6
    );
    println!(
        "waypoint CPU at {} rps: Envoy {:.3} + pilot-agent {:.3} = {:.3} vCPU (target <= 0.2)",
        args.rate,
        wp_cpu.0,
        wp_cpu.1,
        wp_cpu.0 + wp_cpu.1
    );
    println!(
        "plain Envoy proxy (HTTP/1.1 -> HTTP/1.1, no TLS, no internal listeners, no telemetry) at {} rps: {:.3} vCPU",
        args.rate, baseline_cpu
    );
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "memory idle: Envoy RSS {:.1} MiB / private {:.1} MiB, pilot-agent RSS {:.1} / private {:.1} MiB",
        mib(idle_mem.0 .0), mib(idle_mem.0 .1), mib(idle_mem.1 .0), mib(idle_mem.1 .1)
    );
    println!(
        "memory after load: Envoy RSS {:.1} MiB / private {:.1} MiB, pilot-agent RSS {:.1} / private {:.1} MiB; private total {:.1} MiB (target <= 40)",
        mib(busy_mem.0 .0), mib(busy_mem.0 .1), mib(busy_mem.1 .0), mib(busy_mem.1 .1),
        mib(busy_mem.0 .1 + busy_mem.1 .1)
    );
    route_ms.sort_by(f64::total_cmp);
    println!(
        "HTTPRoute edit on disk -> served: {} ms (median {:.0} ms, target <= 200 ms; includes istiod's 100 ms debounce)",
        route_ms.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(", "),
        route_ms[route_ms.len() / 2]
    );
    Ok(())
}
