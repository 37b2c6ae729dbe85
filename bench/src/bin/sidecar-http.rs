//! Sidecar benchmark: HTTP/1.1 1 KB responses over keep-alive connections, in one run, direct
//! (no mesh), sidecar -> sidecar (Istio mutual TLS between two Envoys) and sidecar -> ambient
//! pod (the sidecar's HBONE to the pod's ztunnel). Reports requests/s at saturation, p50/p99 at
//! a fixed rate, and each sidecar's CPU (Envoy + pilot-agent) during the fixed-rate
//! sidecar -> sidecar run and its memory (RSS and private). Needs root (network namespaces).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use mesh_bench::http_load::{
    cpu_ticks, memory_kib, paced, pct, print_rows, saturate, warm_up, LoadArgs, Row,
};
use mesh_e2e::cluster::{MeshCluster, PodSpec, Redirection};
use mesh_e2e::injection;
use mesh_e2e::procfs::children;
use mesh_e2e::waypoint::Waypoint;
use mesh_testutil::{namespace_yaml, ClusterDir, HttpApp};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    load: LoadArgs,
}

const BODY: usize = 1024;
const APP_PORT: u16 = 8080;
const SIDECAR_VIP: [u8; 4] = [10, 96, 2, 10];
const AMBIENT_VIP: [u8; 4] = [10, 96, 2, 20];

fn svc(ns: &str, vip: [u8; 4]) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: server\n  namespace: {ns}\nspec:\n  clusterIP: {}\n  selector: {{app: server}}\n  ports:\n  - name: http\n    port: 80\n    targetPort: {APP_PORT}\n",
        Ipv4Addr::from(vip)
    )
}

fn setup(dir: &ClusterDir) {
    dir.write("ns-plain.yaml", &namespace_yaml("plain", &[]));
    dir.write(
        "ns-legacy.yaml",
        &namespace_yaml("legacy", &[("istio-injection", "enabled")]),
    );
    dir.write(
        "ns-amb.yaml",
        &namespace_yaml("amb", &[("istio.io/dataplane-mode", "ambient")]),
    );
    dir.write("svc-legacy.yaml", &svc("legacy", SIDECAR_VIP));
    dir.write("svc-amb.yaml", &svc("amb", AMBIENT_VIP));
}

/// A pod of `legacy` through the injector, with the ambient profile's values.
fn injected(name: &str, node: &str) -> PodSpec {
    injection::injected(
        PodSpec::new("legacy", name, node, name),
        &injection::ambient_values(false),
    )
}

/// A sidecar's agent and Envoy processes.
struct Proxy {
    name: &'static str,
    agent: u32,
    envoy: u32,
}

impl Proxy {
    fn of(name: &'static str, w: &Waypoint) -> anyhow::Result<Proxy> {
        let agent = w
            .pid()
            .ok_or_else(|| anyhow::anyhow!("{name}: agent not running"))?;
        let envoy = *children(agent)
            .first()
            .ok_or_else(|| anyhow::anyhow!("{name}: no Envoy under pilot-agent {agent}"))?;
        Ok(Proxy { name, agent, envoy })
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse().load;
    let dur = args.duration();
    let mut c = MeshCluster::start("scb", &["node1", "node2"], Redirection::Nftables, setup);
    let add = |c: &mut MeshCluster, spec: PodSpec| {
        let name = spec.name.clone();
        c.add_pod(spec)
            .map_err(|e| anyhow::anyhow!("pod {name}: {e}"))
    };
    let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, APP_PORT));
    let body = "x".repeat(BODY);
    let plain_server = add(&mut c, PodSpec::new("plain", "plain-server", "node2", "s"))?;
    let plain_client = add(&mut c, PodSpec::new("plain", "plain-client", "node1", "c"))?;
    let sc_server = add(&mut c, injected("server", "node2"))?;
    let sc_client = add(&mut c, injected("client", "node1"))?;
    let amb_server = add(
        &mut c,
        PodSpec::new("amb", "amb-server", "node2", "server").label("app", "server"),
    )?;
    let _apps = [
        HttpApp::start(&plain_server.netns, any, &body)?,
        HttpApp::start(&sc_server.netns, any, &body)?,
        HttpApp::start(&amb_server.netns, any, &body)?,
    ];
    let proxy_config = format!(
        "{{\"discoveryAddress\":\"{}:15012\",\"concurrency\":{},\"drainDuration\":\"2s\"}}",
        c.istiod.ip(),
        args.envoy_concurrency
    );
    let env = [("PROXY_CONFIG", proxy_config.as_str())];
    let server_proxy = injection::start_sidecar(&sc_server, &c.istiod, &env);
    let client_proxy = injection::start_sidecar(&sc_client, &c.istiod, &env);
    server_proxy.wait_ready(Duration::from_secs(30));
    client_proxy.wait_ready(Duration::from_secs(30));
    let proxies = [
        Proxy::of("client sidecar", &client_proxy)?,
        Proxy::of("server sidecar", &server_proxy)?,
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let targets = [
        ("direct", &plain_client.netns, plain_server.addr(APP_PORT)),
        (
            "sidecar -> sidecar",
            &sc_client.netns,
            SocketAddr::from((SIDECAR_VIP, 80)),
        ),
        (
            "sidecar -> ambient",
            &sc_client.netns,
            SocketAddr::from((AMBIENT_VIP, 80)),
        ),
    ];
    warm_up(&targets)?;
    let idle: Vec<_> = (proxies.iter())
        .map(|p| (memory_kib(p.envoy), memory_kib(p.agent)))
        .collect();
    let mut rows = Vec::new();
    let mut cpu: Vec<(f64, f64)> = vec![(0.0, 0.0); proxies.len()];
    for (name, netns, addr) in &targets {
        let rps = rt.block_on(saturate(netns, *addr, args.connections, dur))?;
        let before: Vec<_> = (proxies.iter())
            .map(|p| (cpu_ticks(p.envoy), cpu_ticks(p.agent)))
            .collect();
        let lat = rt.block_on(paced(netns, *addr, args.rate, dur))?;
        if *name == "sidecar -> sidecar" {
            let secs = dur.as_secs_f64() * 100.0;
            for (i, p) in proxies.iter().enumerate() {
                cpu[i] = (
                    (cpu_ticks(p.envoy) - before[i].0) as f64 / secs,
                    (cpu_ticks(p.agent) - before[i].1) as f64 / secs,
                );
            }
        }
        rows.push(Row { name, rps, lat });
    }
    let busy: Vec<_> = (proxies.iter())
        .map(|p| (memory_kib(p.envoy), memory_kib(p.agent)))
        .collect();

    println!("\nsidecar HTTP benchmark: {BODY} B responses, HTTP/1.1 keep-alive, {} s per figure, saturation with {} connections, latency at {} rps, Envoy concurrency {}\n", dur.as_secs(), args.connections, args.rate, args.envoy_concurrency);
    print_rows(&rows, args.rate);
    let p50 = |i: usize| pct(&rows[i].lat, 0.5).as_secs_f64() * 1e6;
    println!(
        "\ntwo sidecars over direct at p50: +{:.0} us (target <= 1000 us); sidecar -> ambient over direct: +{:.0} us",
        p50(1) - p50(0),
        p50(2) - p50(0)
    );
    let mib = |k: u64| k as f64 / 1024.0;
    for (i, p) in proxies.iter().enumerate() {
        println!(
            "{} at {} rps (sidecar -> sidecar): Envoy {:.3} + pilot-agent {:.3} = {:.3} vCPU (target <= 0.15)",
            p.name,
            args.rate,
            cpu[i].0,
            cpu[i].1,
            cpu[i].0 + cpu[i].1
        );
        let ((ie, ia), (be, ba)) = (idle[i], busy[i]);
        println!(
            "{} memory: idle Envoy RSS {:.1} / private {:.1} MiB, agent RSS {:.1} / private {:.1} MiB; after load Envoy RSS {:.1} / private {:.1} MiB, agent RSS {:.1} / private {:.1} MiB; private total {:.1} MiB (target <= 35)",
            p.name,
            mib(ie.0), mib(ie.1), mib(ia.0), mib(ia.1),
            mib(be.0), mib(be.1), mib(ba.0), mib(ba.1),
            mib(be.1 + ba.1)
        );
    }
    Ok(())
}
