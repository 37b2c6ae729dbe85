//! Enrollment latency: how long the `istio-cni` plugin's ADD takes -- the agent looks the pod
//! up, programs its capture, hands its netns to ztunnel over ZDS and waits for the ack -- over
//! N pods created through the real CNI chain on one node, with nftables and with eBPF
//! capture. The bridge + host-local part of the chain is reported beside it for scale.
//! Target (issue): p99 < 20 ms.

use std::time::Duration;

use clap::Parser;
use mesh_e2e::cluster::{MeshCluster, PodSpec, Redirection};
use mesh_testutil::{namespace_yaml, ClusterDir};

#[derive(Parser, Debug)]
struct Args {
    /// Pods per capture mode.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Only this mode (nftables or ebpf).
    #[arg(long)]
    mode: Option<String>,
}

fn setup(dir: &ClusterDir) {
    dir.write(
        "ns.yaml",
        &namespace_yaml("bench", &[("istio.io/dataplane-mode", "ambient")]),
    );
}

struct Figures {
    istio_cni: Vec<Duration>,
    rest_of_chain: Vec<Duration>,
}

fn measure(mode: Redirection, pods: usize) -> anyhow::Result<Figures> {
    let mut c = MeshCluster::start("enr", &["node1"], mode, setup);
    let mut figures = Figures {
        istio_cni: Vec::new(),
        rest_of_chain: Vec::new(),
    };
    for i in 0..pods {
        let spec = PodSpec::new("bench", &format!("p{i}"), "node1", "default");
        // As in a cluster, the Pod object exists before the kubelet creates its sandbox: give
        // the agent's watch time to see it, so the figure is CNI ADD -> ztunnel ack.
        c.objects().write(&spec.file(), &spec.yaml(None));
        std::thread::sleep(Duration::from_millis(100));
        let (_, timings) = c
            .add_pod_timed(spec)
            .map_err(|e| anyhow::anyhow!("pod {i}: {e}\n{}", c.logs()))?;
        for (plugin, took) in timings {
            if plugin == "istio-cni" {
                figures.istio_cni.push(took);
            } else {
                figures.rest_of_chain.push(took);
            }
        }
    }
    Ok(figures)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let modes: Vec<(Redirection, &str)> = [
        (Redirection::Nftables, "nftables"),
        (Redirection::Ebpf, "ebpf"),
    ]
    .into_iter()
    .filter(|(_, name)| args.mode.as_deref().is_none_or(|m| m == *name))
    .collect();
    println!("| capture  | pods | istio-cni ADD p50 (ms) | p99 (ms) | max (ms) | bridge+host-local p50 (ms) | target p99 < 20 ms |");
    println!("|----------|------|------------------------|----------|----------|----------------------------|--------------------|");
    for (mode, name) in modes {
        let mut f = measure(mode, args.pods)?;
        f.istio_cni.sort();
        f.rest_of_chain.sort();
        let p99 = pct(&f.istio_cni, 99.0);
        println!(
            "| {name:<8} | {:>4} | {:>22} | {:>8} | {:>8} | {:>26} | {:<18} |",
            f.istio_cni.len(),
            ms(pct(&f.istio_cni, 50.0)),
            ms(p99),
            ms(*f.istio_cni.last().unwrap_or(&Duration::ZERO)),
            ms(pct(&f.rest_of_chain, 50.0)),
            if p99 < Duration::from_millis(20) {
                "PASS"
            } else {
                "MISS"
            }
        );
    }
    Ok(())
}
