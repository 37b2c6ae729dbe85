//! The benchmark cluster, built with the e2e harness: two nodes (istiod on node1, a ztunnel
//! per node), an enrolled client (node1) and server (node2) pair for the mesh path, and an
//! unenrolled pair on the same nodes for the direct path.
//!
//! ```text
//! mesh:   client  -> ztunnel node1 -> HBONE -> ztunnel node2 -> server    (10.1.0.10 -> 10.2.0.10)
//! direct: dclient ------------- node1 -> node2 --------------> dserver   (10.1.0.11 -> 10.2.0.11)
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{ensure, Context};
use mesh_e2e::probe::{echo_until, Echo};
use mesh_e2e::{Istiod, Ztunnel};
use mesh_testutil::netns::{pod_redirect_rules, Node, RedirectOptions};
use mesh_testutil::{
    namespace_yaml, pod_yaml, workload_info, ClusterDir, FakeZds, Netns, PodSpec, SnapshotItem,
    TestNet,
};

use crate::procfs;
use crate::CaptureMode;

const NAMESPACE: &str = "bench";
const CLIENT_PRINCIPAL: &str = "spiffe://cluster.local/ns/bench/sa/client";

/// One path under test: where the client runs and where the server listens.
#[derive(Debug, Clone)]
pub struct Path {
    pub client: Netns,
    pub server: Netns,
    pub server_ip: Ipv4Addr,
}

impl Path {
    pub fn server_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.server_ip, port))
    }
}

/// Everything running; dropping it stops the processes and removes the namespaces.
pub struct Cluster {
    pub direct: Path,
    pub mesh: Path,
    /// ztunnel pids, node1 then node2.
    pub ztunnel_pids: [u32; 2],
    // Field order is drop order: the processes go before the namespaces they run in.
    ztunnels: Vec<Ztunnel>,
    _zds: Vec<FakeZds>,
    /// The sockmap programs (detached when dropped) and the eBPF capture, when chosen.
    sockmap: Option<mesh_ebpf::Sockmap>,
    _capture: Option<mesh_ebpf::Capture>,
    istiod: Istiod,
    _net: TestNet,
    _dir: tempfile::TempDir,
}

/// (pod, node index, enrolled in the mesh)
const PODS: [(&str, usize, bool); 4] = [
    ("client", 0, true),
    ("dclient", 0, false),
    ("server", 1, true),
    ("dserver", 1, false),
];

impl Cluster {
    /// Builds the topology and starts istiod and both ztunnels (the binaries `bins::binary`
    /// finds: `MESH_BIN_DIR`, else next to this executable) and waits until the ztunnels are
    /// ready. Must be called within a Tokio runtime (the fake node agent runs on it).
    pub fn start(capture: CaptureMode, sockmap: bool) -> anyhow::Result<Cluster> {
        let mut net = TestNet::new("zdp")?;
        let nodes = [
            net.add_node("node1", Ipv4Addr::new(172, 30, 0, 1))?,
            net.add_node("node2", Ipv4Addr::new(172, 30, 0, 2))?,
        ];
        let dir = tempfile::tempdir()?;
        let cluster_dir = ClusterDir::new();
        cluster_dir.write(
            "namespace.yaml",
            &namespace_yaml(NAMESPACE, &[("istio.io/dataplane-mode", "ambient")]),
        );
        let ebpf = match capture {
            CaptureMode::Nftables => None,
            CaptureMode::Ebpf => Some(mesh_ebpf::Capture::new().context("eBPF capture")?),
        };
        let sockmap = if sockmap {
            let cgroup =
                mesh_ebpf::cgroup2_root(std::path::Path::new(mesh_ebpf::DEFAULT_CGROUP2_MOUNT))?;
            Some(mesh_ebpf::Sockmap::load(&cgroup)?)
        } else {
            None
        };
        let capture = PodCapture {
            ebpf: ebpf.as_ref(),
            sockmap: sockmap.as_ref(),
        };
        let snapshots = add_pods(&mut net, &nodes, &cluster_dir, capture)?;
        let istiod = Istiod::start(
            nodes[0].netns(),
            nodes[0].ip(),
            cluster_dir,
            &["node1", "node2"],
        );
        let mut zds = Vec::new();
        let mut ztunnels = Vec::new();
        // Default settings, but for the worker count when the bench's caller sets it.
        let workers = std::env::var("ZTUNNEL_WORKER_THREADS").ok();
        let extra: Vec<(&str, &str)> = workers
            .iter()
            .map(|n| ("ZTUNNEL_WORKER_THREADS", n.as_str()))
            .collect();
        for (node, snapshot) in nodes.iter().zip(snapshots) {
            let sock = dir.path().join(format!("zds-{}.sock", node.name()));
            zds.push(FakeZds::start(&sock, snapshot)?);
            ztunnels.push(Ztunnel::start(
                node.netns(),
                node.name(),
                node.ip(),
                &istiod,
                &sock,
                &extra,
            ));
        }
        for z in &ztunnels {
            z.wait_ready(Duration::from_secs(60));
        }
        let ztunnel_pids = [
            procfs::find_pid(nodes[0].netns(), "ztunnel")?,
            procfs::find_pid(nodes[1].netns(), "ztunnel")?,
        ];
        Ok(Cluster {
            direct: path(&net, "dclient", "dserver")?,
            mesh: path(&net, "client", "server")?,
            ztunnel_pids,
            ztunnels,
            _zds: zds,
            sockmap,
            _capture: ebpf,
            istiod,
            _net: net,
            _dir: dir,
        })
    }

    /// Waits until an echo round trip works on both paths to `port`, and checks that the mesh
    /// one went through node2's ztunnel over mTLS with the client's identity.
    pub fn wait_paths(&self, port: u16) -> anyhow::Result<()> {
        for (what, path) in [("direct", &self.direct), ("mesh", &self.mesh)] {
            let got = echo_until(
                &path.client,
                path.server_addr(port),
                |e| *e == Echo::Ok,
                Duration::from_secs(30),
            );
            ensure!(
                got == Echo::Ok,
                "{what} path not working: {got:?}\n{}",
                self.logs()
            );
        }
        let metrics = self.ztunnels[1].metrics();
        let through = metrics.lines().any(|l| {
            l.starts_with("istio_tcp_connections_opened_total")
                && l.contains("reporter=\"destination\"")
                && l.contains(&format!("source_principal=\"{CLIENT_PRINCIPAL}\""))
                && l.contains("connection_security_policy=\"mutual_tls\"")
        });
        ensure!(
            through,
            "the mesh probe did not show up in node2's ztunnel metrics as mTLS from the client:\n{metrics}"
        );
        Ok(())
    }

    /// The sockmap programs' counters, when `--sockmap` loaded them.
    pub fn sockmap_stats(&self) -> anyhow::Result<Option<mesh_ebpf::SockmapStats>> {
        Ok(match &self.sockmap {
            Some(sockmap) => Some(sockmap.stats()?),
            None => None,
        })
    }

    /// The tail of istiod's and both ztunnels' logs, for errors.
    pub fn logs(&self) -> String {
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        let mut out = format!("--- istiod\n{}\n", tail(self.istiod.log()));
        for z in &self.ztunnels {
            out.push_str(&format!("--- ztunnel {}\n{}\n", z.node(), tail(z.log())));
        }
        out
    }
}

/// How enrolled pods are captured.
#[derive(Clone, Copy)]
struct PodCapture<'a> {
    /// eBPF programs, or else the nftables rules.
    ebpf: Option<&'a mesh_ebpf::Capture>,
    sockmap: Option<&'a mesh_ebpf::Sockmap>,
}

/// Creates the [`PODS`]; the enrolled ones get a Pod in `cluster_dir`, the in-pod capture
/// (nftables rules or eBPF programs, and the sockmap's pod address) and a ZDS snapshot entry
/// (returned per node).
fn add_pods(
    net: &mut TestNet,
    nodes: &[Node; 2],
    cluster_dir: &ClusterDir,
    capture: PodCapture<'_>,
) -> anyhow::Result<[Vec<SnapshotItem>; 2]> {
    let mut snapshots: [Vec<SnapshotItem>; 2] = [Vec::new(), Vec::new()];
    for (i, (name, node_index, enrolled)) in PODS.iter().enumerate() {
        let node = &nodes[*node_index];
        let ip = node.pod_ip(10 + (i % 2) as u8);
        let pod = net.add_pod(node, name, ip)?;
        // Room for the connection-churn phase: ~49k ports, TIME_WAIT reused.
        pod.netns()
            .sysctl("net.ipv4.ip_local_port_range", "16000 65000")?;
        pod.netns().sysctl("net.ipv4.tcp_tw_reuse", "1")?;
        if !enrolled {
            continue;
        }
        cluster_dir.write(
            &format!("pod-{name}.yaml"),
            &pod_yaml(&PodSpec {
                namespace: NAMESPACE,
                name,
                ip: &ip.to_string(),
                node: node.name(),
                service_account: name,
                labels: &[("app", name)],
            }),
        );
        match capture.ebpf {
            Some(ebpf) => ebpf.enroll(&pod.netns().path())?,
            None => pod_redirect_rules(&pod, RedirectOptions::default())?,
        }
        if let Some(sockmap) = capture.sockmap {
            sockmap.add_pod(ip)?;
        }
        snapshots[*node_index].push(SnapshotItem::add(
            &format!("uid-{name}"),
            workload_info(name, NAMESPACE, name),
            pod.netns().open_fd()?,
        )?);
    }
    Ok(snapshots)
}

fn path(net: &TestNet, client: &str, server: &str) -> anyhow::Result<Path> {
    let pod = |name: &str| net.pod(name).context("pod of the topology");
    Ok(Path {
        client: pod(client)?.netns().clone(),
        server: pod(server)?.netns().clone(),
        server_ip: pod(server)?.ip(),
    })
}
