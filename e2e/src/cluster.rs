//! A whole local ambient mesh: nodes as network namespaces, istiod, and on every node a
//! cni-node agent and a ztunnel as processes. Pods are network namespaces wired by the real
//! CNI chain -- Debian's `bridge` + `host-local`, then `istio-cni` -- invoked as a container
//! runtime does, and written into istiod's configuration directory (the local "API server")
//! with their node and IP.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_testutil::netns::{ChildGuard, Node};
use mesh_testutil::{ClusterDir, Netns, TestNet};
use serde_json::json;

use crate::bins::binary;
use crate::cni::{self, CniFailure, ConfList, PodRef, DEBIAN_CNI_DIR};
use crate::http;
use crate::istiod::Istiod;
use crate::ztunnel::Ztunnel;

/// The agent's readiness port (`:8000/readyz`, as istio-cni).
pub const AGENT_READINESS_PORT: u16 = 8000;

/// How pods are captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirection {
    Nftables,
    Ebpf,
}

impl Redirection {
    fn as_env(self) -> &'static str {
        match self {
            Redirection::Nftables => "nftables",
            Redirection::Ebpf => "ebpf",
        }
    }
}

/// Extra settings of a cluster (see [`MeshCluster::start_with`]).
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// Environment added to every ztunnel (e.g. `SECRET_TTL`), kept across restarts.
    pub ztunnel_env: Vec<(String, String)>,
    /// Environment added to istiod (e.g. `MAX_WORKLOAD_CERT_TTL`), kept across restarts.
    pub istiod_env: Vec<(String, String)>,
    /// Environment added to every node agent (e.g. `AMBIENT_SOCKMAP`), kept across restarts.
    pub agent_env: Vec<(String, String)>,
    /// Flags added to istiod's command line, kept across restarts.
    pub istiod_args: Vec<String>,
}

impl ClusterOptions {
    pub fn ztunnel_env(mut self, key: &str, value: &str) -> ClusterOptions {
        self.ztunnel_env.push((key.into(), value.into()));
        self
    }

    pub fn istiod_env(mut self, key: &str, value: &str) -> ClusterOptions {
        self.istiod_env.push((key.into(), value.into()));
        self
    }

    pub fn agent_env(mut self, key: &str, value: &str) -> ClusterOptions {
        self.agent_env.push((key.into(), value.into()));
        self
    }

    pub fn istiod_arg(mut self, arg: &str) -> ClusterOptions {
        self.istiod_args.push(arg.into());
        self
    }
}

fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A pod to create.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The controlling owner, `(kind, name)` (a Deployment's pods are owned by its ReplicaSet).
    pub owner: Option<(String, String)>,
    /// The whole Pod object (e.g. as the injector returned it), used instead of the one built
    /// from the fields above; its status is set as the pod starts.
    pub object: Option<serde_json::Value>,
}

impl PodSpec {
    pub fn new(namespace: &str, name: &str, node: &str, service_account: &str) -> PodSpec {
        PodSpec {
            namespace: namespace.into(),
            name: name.into(),
            node: node.into(),
            service_account: service_account.into(),
            labels: BTreeMap::from([("app".to_string(), name.to_string())]),
            annotations: BTreeMap::new(),
            owner: None,
            object: None,
        }
    }

    /// Sets the controlling owner (e.g. `("ReplicaSet", "waypoint-5c7d9f")`).
    pub fn owned_by(mut self, kind: &str, name: &str) -> PodSpec {
        self.owner = Some((kind.into(), name.into()));
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> PodSpec {
        self.annotations.insert(key.into(), value.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> PodSpec {
        self.labels.insert(key.into(), value.into());
        self
    }

    fn uid(&self) -> String {
        format!("uid-{}-{}", self.namespace, self.name)
    }

    /// The Pod object (pending without an IP, running with one).
    pub fn yaml(&self, ip: Option<Ipv4Addr>) -> String {
        if let Some(object) = &self.object {
            let mut pod = object.clone();
            pod["status"] = match ip {
                Some(ip) => serde_json::json!({
                    "phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }),
                None => serde_json::json!({"phase": "Pending"}),
            };
            // JSON is YAML.
            return pod.to_string();
        }
        let mut labels = String::new();
        for (k, v) in &self.labels {
            labels.push_str(&format!("    {k}: \"{v}\"\n"));
        }
        if !self.annotations.is_empty() {
            labels.push_str("  annotations:\n");
            for (k, v) in &self.annotations {
                labels.push_str(&format!("    {k}: \"{v}\"\n"));
            }
        }
        if let Some((kind, name)) = &self.owner {
            let api = if kind == "ReplicaSet" {
                "apps/v1"
            } else {
                "v1"
            };
            labels.push_str(&format!(
                "  ownerReferences:\n  - apiVersion: {api}\n    kind: {kind}\n    name: {name}\n    uid: uid-{kind}-{name}\n    controller: true\n"
            ));
        }
        let status = match ip {
            Some(ip) => format!(
                "status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  conditions:\n  - type: Ready\n    status: \"True\"\n"
            ),
            None => "status:\n  phase: Pending\n".to_string(),
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  uid: {uid}\n  labels:\n{labels}spec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  containers:\n  - name: app\n    image: app\n    ports:\n    - name: http\n      containerPort: 8080\n{status}",
            name = self.name,
            ns = self.namespace,
            uid = self.uid(),
            node = self.node,
            sa = self.service_account,
        )
    }

    /// Its file in the objects directory.
    pub fn file(&self) -> String {
        format!("pod-{}-{}.yaml", self.namespace, self.name)
    }
}

/// A created pod.
#[derive(Clone, Debug)]
pub struct MeshPod {
    pub spec: PodSpec,
    pub netns: Netns,
    pub ip: Ipv4Addr,
}

impl MeshPod {
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// Its Pod uid (what ZDS and ztunnel's `workloadState` call it).
    pub fn uid(&self) -> String {
        self.spec.uid()
    }
}

/// The cni-node agent of one node.
pub struct Agent {
    netns: Netns,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<ChildGuard>,
    ip: Ipv4Addr,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("ip", &self.ip).finish()
    }
}

impl Agent {
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        let mut cmd = Command::new(binary("cni-node"));
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.child = Some(self.netns.spawn(&mut cmd).expect("start cni-node"));
    }

    /// Waits for `/readyz`.
    pub fn wait_ready(&self, limit: Duration) {
        let addr = SocketAddr::from((self.ip, AGENT_READINESS_PORT));
        let start = Instant::now();
        while start.elapsed() < limit {
            if http::get(&self.netns, addr, "/readyz").is_some_and(|(s, _)| s == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("cni-node not ready after {limit:?}; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` on the agent's readiness port (`/debug/sockmap`, say): `(status, body)`.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http::get(
            &self.netns,
            SocketAddr::from((self.ip, AGENT_READINESS_PORT)),
            path,
        )
    }

    /// Kills the agent (SIGKILL: no clean-up, as a crash).
    pub fn kill(&mut self) {
        self.child.take();
    }

    /// Starts it again with the same state directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildGuard::id)
    }
}

/// One node: its netns, agent and ztunnel.
pub struct MeshNode {
    pub node: Node,
    pub agent: Agent,
    pub ztunnel: Ztunnel,
    conflist: ConfList,
}

impl MeshNode {
    /// The addresses host-local has reserved on this node (its `dataDir/<network>` files).
    pub fn ipam_reservations(&self) -> Vec<Ipv4Addr> {
        let data_dir = self.conflist.value["plugins"][0]["ipam"]["dataDir"]
            .as_str()
            .map(PathBuf::from)
            .expect("host-local dataDir in the conflist");
        let network = self.conflist.value["name"].as_str().unwrap_or_default();
        let Ok(entries) = std::fs::read_dir(data_dir.join(network)) else {
            return Vec::new();
        };
        let mut ips: Vec<Ipv4Addr> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        ips.sort();
        ips
    }
}

/// The cluster. Dropping it stops every process and removes every namespace.
pub struct MeshCluster {
    pub istiod: Istiod,
    pub nodes: Vec<MeshNode>,
    pods: Vec<MeshPod>,
    dir: tempfile::TempDir,
    // Last: processes are killed (above) before the namespaces go.
    pub net: TestNet,
}

impl std::fmt::Debug for MeshCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshCluster")
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl MeshCluster {
    /// istiod (on the first node) and an agent + ztunnel per node; `setup` writes the
    /// initial objects (namespaces, services, policies) before anything starts.
    pub fn start(
        hint: &str,
        nodes: &[&str],
        redirection: Redirection,
        setup: impl FnOnce(&ClusterDir),
    ) -> MeshCluster {
        MeshCluster::start_with(hint, nodes, redirection, &ClusterOptions::default(), setup)
    }

    /// Like [`MeshCluster::start`] with extra process settings.
    pub fn start_with(
        hint: &str,
        nodes: &[&str],
        redirection: Redirection,
        options: &ClusterOptions,
        setup: impl FnOnce(&ClusterDir),
    ) -> MeshCluster {
        let mut net = TestNet::new(hint).expect("test network");
        let dir = runtime_dir().expect("cluster directory");
        let mut made = Vec::new();
        for (i, name) in nodes.iter().enumerate() {
            let ip = Ipv4Addr::new(172, 30, 0, i as u8 + 1);
            made.push(net.add_node(name, ip).expect("node"));
        }
        let cluster = ClusterDir::new();
        setup(&cluster);
        let first = &made[0];
        let istiod = Istiod::start_with(
            first.netns(),
            first.ip(),
            cluster,
            nodes,
            &env_refs(&options.istiod_env),
            &options.istiod_args,
        );
        let mut mesh_nodes = Vec::new();
        for node in made {
            let zt_env = env_refs(&options.ztunnel_env);
            let agent_env = env_refs(&options.agent_env);
            mesh_nodes.push(start_node(
                &istiod,
                node,
                dir.path(),
                redirection,
                &zt_env,
                &agent_env,
            ));
        }
        for n in &mesh_nodes {
            n.agent.wait_ready(Duration::from_secs(20));
            n.ztunnel.wait_ready(Duration::from_secs(30));
        }
        MeshCluster {
            istiod,
            nodes: mesh_nodes,
            pods: Vec::new(),
            dir,
            net,
        }
    }

    /// The objects directory (the local API server).
    pub fn objects(&self) -> &ClusterDir {
        &self.istiod.cluster
    }

    pub fn node(&self, name: &str) -> &MeshNode {
        self.nodes
            .iter()
            .find(|n| n.node.name() == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn node_mut(&mut self, name: &str) -> &mut MeshNode {
        self.nodes
            .iter_mut()
            .find(|n| n.node.name() == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn pod(&self, name: &str) -> &MeshPod {
        self.pods
            .iter()
            .find(|p| p.spec.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// Creates a pod as the kubelet would: the Pod object (pending), its sandbox netns, the
    /// CNI chain (bridge + host-local + istio-cni), then the Pod's IP and Running status.
    pub fn add_pod(&mut self, spec: PodSpec) -> Result<MeshPod, CniFailure> {
        self.add_pod_timed(spec).map(|(pod, _)| pod)
    }

    /// [`MeshCluster::add_pod`], also returning how long each CNI plugin took.
    pub fn add_pod_timed(
        &mut self,
        spec: PodSpec,
    ) -> Result<(MeshPod, Vec<(String, Duration)>), CniFailure> {
        self.objects().write(&spec.file(), &spec.yaml(None));
        let netns = self
            .net
            .add_bare_netns(&format!("{}-{}", spec.namespace, spec.name))
            .expect("pod netns");
        let node = self.node(&spec.node);
        let path = netns.path();
        let uid = spec.uid();
        let pod_ref = PodRef {
            namespace: &spec.namespace,
            name: &spec.name,
            uid: &uid,
            container_id: &format!("sandbox-{}", spec.name),
            netns: &path,
        };
        let (result, timings) =
            cni::add_timed(node.node.netns(), &node.conflist, &pod_ref, &cni_path())?;
        let ip: Ipv4Addr = cni::result_ips(&result)
            .first()
            .and_then(|ip| ip.parse().ok())
            .expect("the bridge plugin assigned an IPv4 address");
        self.objects().write(&spec.file(), &spec.yaml(Some(ip)));
        let pod = MeshPod { spec, netns, ip };
        self.pods.push(pod.clone());
        Ok((pod, timings))
    }

    /// Deletes a pod: CNI DEL (the sandbox goes away), then the Pod object.
    pub fn delete_pod(&mut self, name: &str) -> Result<(), CniFailure> {
        let pod = self.pod(name).clone();
        let node = self.node(&pod.spec.node);
        let path = pod.netns.path();
        let uid = pod.spec.uid();
        let pod_ref = PodRef {
            namespace: &pod.spec.namespace,
            name: &pod.spec.name,
            uid: &uid,
            container_id: &format!("sandbox-{}", pod.spec.name),
            netns: &path,
        };
        cni::del(node.node.netns(), &node.conflist, &pod_ref, &cni_path())?;
        self.objects().remove(&pod.spec.file());
        self.pods.retain(|p| p.spec.name != name);
        Ok(())
    }

    /// Every pod created and not deleted, in creation order.
    pub fn pods(&self) -> &[MeshPod] {
        &self.pods
    }

    /// Sets (`Some`) or removes (`None`) a label of a running pod, as `kubectl label` would.
    pub fn set_pod_label(&mut self, name: &str, key: &str, value: Option<&str>) {
        let pod = self
            .pods
            .iter_mut()
            .find(|p| p.spec.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"));
        match value {
            Some(value) => pod.spec.labels.insert(key.into(), value.into()),
            None => pod.spec.labels.remove(key),
        };
        let (file, yaml) = (pod.spec.file(), pod.spec.yaml(Some(pod.ip)));
        self.objects().write(&file, &yaml);
    }

    /// Deletes a pod as the kubelet does: [`MeshCluster::delete_pod`] (CNI DEL, Pod object
    /// gone), then the sandbox's network namespace is removed.
    pub fn remove_pod(&mut self, name: &str) -> Result<(), CniFailure> {
        let netns = self.pod(name).netns.clone();
        self.delete_pod(name)?;
        let out = Command::new("ip")
            .args(["netns", "del", netns.name()])
            .output()
            .expect("run ip netns del");
        assert!(
            out.status.success(),
            "ip netns del {}: {}",
            netns.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Every process's log (for failures).
    pub fn logs(&self) -> String {
        let mut out = format!("--- istiod\n{}", self.istiod.log());
        for n in &self.nodes {
            out.push_str(&format!(
                "--- cni-node {}\n{}--- ztunnel {}\n{}",
                n.node.name(),
                n.agent.log(),
                n.node.name(),
                n.ztunnel.log()
            ));
        }
        out
    }

    /// The directory of this cluster's sockets and state.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for MeshCluster {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("MESH_E2E_LOGS").is_some() {
            eprintln!("{}", self.logs());
        }
    }
}

/// The directory for the nodes' sockets and state. On a real node they live under /var/run, a
/// tmpfs; /dev/shm is the tmpfs every Linux machine has (on a disk file system, the agent's
/// rename of its state file over the old one waits for the new one's blocks, which would put
/// half a millisecond of disk into every enrollment the bench measures).
fn runtime_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::Builder::new().prefix("mesh-").tempdir_in(shm),
        false => tempfile::tempdir(),
    }
}

fn cni_path() -> Vec<PathBuf> {
    let ours = binary("istio-cni");
    let ours = ours.parent().map(Path::to_path_buf).unwrap_or_default();
    vec![PathBuf::from(DEBIAN_CNI_DIR), ours]
}

fn start_node(
    istiod: &Istiod,
    node: Node,
    dir: &Path,
    redirection: Redirection,
    ztunnel_env: &[(&str, &str)],
    agent_env: &[(&str, &str)],
) -> MeshNode {
    let node_dir = dir.join(node.name());
    let run_dir = node_dir.join("istio-cni");
    std::fs::create_dir_all(&run_dir).expect("node dir");
    let zds = node_dir.join("ztunnel.sock");
    let path = |p: &Path| p.display().to_string();
    let env: Vec<(String, String)> = [
        ("CLUSTER_CONFIG_DIR", path(istiod.cluster.path())),
        ("INPOD_UDS", path(&zds)),
        (
            "PLUGIN_EVENT_SOCKET",
            path(&run_dir.join("pluginevent.sock")),
        ),
        ("AGENT_STATE_DIR", path(&node_dir.join("agent-state"))),
        (
            "AGENT_READINESS_ADDR",
            format!("{}:{AGENT_READINESS_PORT}", node.ip()),
        ),
        ("NODE_NAME", node.name().to_string()),
        ("REDIRECTION_MODE", redirection.as_env().to_string()),
        ("AMBIENT_DNS_CAPTURE", "false".to_string()),
        ("RUST_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain(
        agent_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .collect();
    let mut agent = Agent {
        netns: node.netns().clone(),
        env,
        log: node_dir.join("cni-node.log"),
        child: None,
        ip: node.ip(),
    };
    agent.spawn();
    let ztunnel = Ztunnel::start(
        node.netns(),
        node.name(),
        node.ip(),
        istiod,
        &zds,
        ztunnel_env,
    );
    let conflist = ConfList::new(json!({
        "cniVersion": "1.0.0",
        "name": format!("mesh-{}", node.name()),
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "subnet": format!("10.{}.0.0/24", node.index()),
                    "dataDir": node_dir.join("ipam"),
                    "routes": [{ "dst": "0.0.0.0/0" }]
                }
            },
            {
                "type": "istio-cni",
                "cni_agent_run_dir": run_dir,
                "ambient_enabled": true,
                "exclude_namespaces": ["kube-system"]
            }
        ]
    }));
    MeshNode {
        node,
        agent,
        ztunnel,
        conflist,
    }
}
