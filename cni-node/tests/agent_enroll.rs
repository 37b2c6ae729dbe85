//! The agent end to end in one process: a YAML cluster directory as the source, the real
//! ZDS server with a test ztunnel, a recording redirector (the real nftables one where a
//! test says so), and the state directory.

mod agent_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_support::{AutoZtunnel, Call, RecordingRedirector, TestZtunnel, WAIT};
use cni_node::agent::{Agent, AgentOptions, RestoreSummary};
use cni_node::event::{CniAddEvent, CniAddHandler};
use cni_node::redirect::{
    HostProbeConfig, HostProbeSnat, NftablesRedirector, PodNetwork, RedirectError, Redirector,
    WithProbeSnat, HOST_TABLE, PROBE_SET_V4,
};
use cni_node::state::{PodRecord, Redirection, StateStore};
use cni_node::zds_server::{ZdsHandle, ZdsServer};
use mesh_runtime::signal::{self, ShutdownTrigger};
use mesh_source::{ClusterSource, DirectoryOptions, DirectorySource};
use mesh_testutil::netns::{have_root, Netns, TestNet};
use mesh_testutil::{namespace_yaml, pod_yaml, ClusterDir, PodSpec};
use tokio::task::JoinHandle;

const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");

/// Files standing in for pod netns, the cluster directory and the agent's state: they
/// survive agent restarts.
struct Node {
    cluster: ClusterDir,
    dir: tempfile::TempDir,
    redirector: Arc<RecordingRedirector>,
    /// When set, the agent captures with this one instead of `redirector`.
    real_redirector: Option<Arc<dyn Redirector>>,
    /// With it the agent runs as `node1` and looks up unrecorded pods in this procfs.
    proc_dir: Option<PathBuf>,
}

impl Node {
    fn new() -> Node {
        Node {
            cluster: ClusterDir::new(),
            dir: tempfile::tempdir().expect("tempdir"),
            redirector: Arc::new(RecordingRedirector::default()),
            real_redirector: None,
            proc_dir: None,
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("ztunnel.sock")
    }

    /// A "netns" of a pod (a plain file: the recording redirector and ZDS only pass it on).
    fn netns(&self, pod: &str) -> PathBuf {
        let path = self.dir.path().join(format!("netns-{pod}"));
        if !path.exists() {
            std::fs::write(&path, "").expect("fake netns");
        }
        path
    }

    fn write_pod(&self, name: &str, labels: &[(&str, &str)]) {
        let yaml = pod_yaml(&PodSpec {
            namespace: "apps",
            name,
            ip: "10.1.0.5",
            node: "node1",
            service_account: "sa",
            labels,
        })
        .replacen("metadata:\n", &format!("metadata:\n  uid: uid-{name}\n"), 1);
        self.cluster.write(&format!("pod-{name}.yaml"), &yaml);
    }

    fn write_namespace(&self, labels: &[(&str, &str)]) {
        self.cluster
            .write("ns-apps.yaml", &namespace_yaml("apps", labels));
    }

    fn event(&self, name: &str) -> CniAddEvent {
        CniAddEvent {
            netns: self.netns(name).display().to_string(),
            pod_name: name.to_string(),
            pod_namespace: "apps".to_string(),
            pod_uid: format!("uid-{name}"),
            ips: vec!["10.1.0.5/32".to_string()],
        }
    }

    /// Starts an agent on this node's state; returns once it is ready.
    async fn start(&self) -> (Running, RestoreSummary) {
        let server = ZdsServer::bind(&self.socket()).expect("bind ZDS");
        let zds = server.handle();
        let mut options = AgentOptions::new(self.state_dir());
        options.pod_wait = Duration::from_secs(2);
        if let Some(proc_dir) = &self.proc_dir {
            options.node_name = Some("node1".to_string());
            options.host_proc = proc_dir.clone();
        }
        let redirector = match &self.real_redirector {
            Some(real) => Arc::clone(real),
            None => self.redirector.clone(),
        };
        let agent = Agent::new(options, redirector, zds.clone());
        let summary = agent.restore().await.expect("restore");
        let (trigger, shutdown) = signal::channel();
        let (tx, events) = tokio::sync::mpsc::channel(256);
        let source = Box::new(DirectorySource::new(
            self.cluster.path(),
            DirectoryOptions::default(),
        ));
        let mut tasks = vec![tokio::spawn(source.run(tx))];
        tasks.push(tokio::spawn(server.run(shutdown.clone().wait())));
        let runner = agent.clone();
        tasks.push(tokio::spawn(async move {
            runner.run(events, shutdown.wait()).await
        }));
        let mut ready = agent.ready();
        tokio::time::timeout(WAIT, ready.wait_for(|r| *r))
            .await
            .expect("agent ready in time")
            .expect("agent alive");
        let running = Running {
            agent,
            zds,
            trigger,
            tasks,
        };
        (running, summary)
    }
}

struct Running {
    agent: Agent,
    zds: ZdsHandle,
    trigger: ShutdownTrigger,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    async fn stop(self) {
        self.trigger.trigger();
        for task in self.tasks {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("task stopped in time")
                .expect("task");
        }
    }

    async fn record(&self, name: &str) -> Option<PodRecord> {
        self.agent.pods().await.into_iter().find(|p| p.name == name)
    }

    /// Waits until the pod's record has `status` (`None` inside = known, not enrolled).
    async fn wait_status(&self, name: &str, status: Option<Option<Redirection>>) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let got = self.record(name).await.map(|r| r.redirection);
            if got == status {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name}: status {got:?}, want {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn saved(node: &Node) -> Vec<PodRecord> {
    StateStore::new(node.state_dir()).load().expect("state")
}

#[tokio::test]
async fn cni_add_enrolls_labeled_pods_and_remembers_the_others() {
    let node = Node::new();
    node.write_namespace(&[]);
    node.write_pod("a", &[AMBIENT]);
    node.write_pod("b", &[]);
    let (agent, _) = node.start().await;
    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;

    agent
        .agent
        .cni_add(node.event("a"))
        .await
        .expect("a enrolled");
    agent
        .agent
        .cni_add(node.event("b"))
        .await
        .expect("b is fine too");

    assert_eq!(node.redirector.installed(), vec![node.netns("a")]);
    assert_eq!(zt.log(), vec!["snapshot-sent", "add uid-a"]);
    let a = agent.record("a").await.expect("a recorded");
    assert_eq!(a.redirection, Some(Redirection::Enabled));
    assert_eq!(a.redirector.as_deref(), Some("recording"));
    assert_eq!(a.netns, node.netns("a"));
    assert_eq!(
        a.ips,
        vec!["10.1.0.5".parse::<std::net::IpAddr>().expect("ip")]
    );
    assert_eq!(a.service_account, "sa");
    assert!(a.dns_capture, "DNS capture defaults on");
    let b = agent
        .record("b")
        .await
        .expect("b recorded though not enrolled");
    assert_eq!(b.redirection, None);
    assert_eq!(saved(&node), agent.agent.pods().await, "state file written");
    agent.stop().await;
}

#[tokio::test]
async fn namespace_label_enrolls_running_pods_and_its_removal_unenrolls_them() {
    let node = Node::new();
    node.write_namespace(&[]);
    node.write_pod("b", &[]);
    node.write_pod("opt-out", &[("istio.io/dataplane-mode", "none")]);
    let (agent, _) = node.start().await;
    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;
    agent.agent.cni_add(node.event("b")).await.expect("add b");
    agent
        .agent
        .cni_add(node.event("opt-out"))
        .await
        .expect("add opt-out");
    assert!(node.redirector.installed().is_empty());

    node.write_namespace(&[AMBIENT]);
    agent
        .wait_status("b", Some(Some(Redirection::Enabled)))
        .await;
    zt.wait_for("add uid-b").await;
    assert_eq!(node.redirector.installed(), vec![node.netns("b")]);
    assert_eq!(
        agent.record("opt-out").await.expect("known").redirection,
        None
    );

    node.write_namespace(&[]);
    agent.wait_status("b", Some(None)).await;
    zt.wait_for("del uid-b").await;
    assert!(node.redirector.installed().is_empty());
    assert!(agent.zds.cached().is_empty());
    agent.stop().await;
}

#[tokio::test]
async fn pod_label_removal_and_pod_deletion_unenroll() {
    let node = Node::new();
    node.write_namespace(&[]);
    node.write_pod("a", &[AMBIENT]);
    node.write_pod("c", &[AMBIENT]);
    let (agent, _) = node.start().await;
    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;
    agent.agent.cni_add(node.event("a")).await.expect("add a");
    agent.agent.cni_add(node.event("c")).await.expect("add c");

    node.write_pod("a", &[]);
    agent.wait_status("a", Some(None)).await;
    zt.wait_for("del uid-a").await;
    // Labeling it again enrolls the running pod.
    node.write_pod("a", &[AMBIENT]);
    agent
        .wait_status("a", Some(Some(Redirection::Enabled)))
        .await;

    node.cluster.remove("pod-c.yaml");
    agent.wait_status("c", None).await;
    zt.wait_for("del uid-c").await;
    node.redirector
        .wait_installed(&node.netns("c"), false)
        .await;
    assert_eq!(node.redirector.installed(), vec![node.netns("a")]);
    assert!(
        saved(&node).iter().all(|p| p.name != "c"),
        "deleted pod forgotten"
    );
    agent.stop().await;
}

#[tokio::test]
async fn failed_enrollments_leave_nothing_behind() {
    let node = Node::new();
    node.write_namespace(&[AMBIENT]);
    for pod in ["rules", "nack", "early"] {
        node.write_pod(pod, &[]);
    }
    let (agent, _) = node.start().await;

    // No ztunnel yet.
    let err = agent
        .agent
        .cni_add(node.event("early"))
        .await
        .expect_err("no ztunnel")
        .to_string();
    assert!(err.contains("no ztunnel connection"), "{err}");
    assert!(node.redirector.installed().is_empty(), "capture undone");
    assert!(agent.zds.cached().is_empty(), "not left for the snapshot");
    assert!(agent.record("early").await.is_none());

    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;

    // The redirector fails.
    node.redirector
        .fail
        .lock()
        .expect("lock")
        .insert(node.netns("rules"));
    let err = agent
        .agent
        .cni_add(node.event("rules"))
        .await
        .expect_err("redirect fails")
        .to_string();
    assert!(err.contains("cannot apply traffic capture"), "{err}");
    assert!(agent.record("rules").await.is_none());
    // The ZDS add ran beside the capture: ztunnel is told to drop the pod again.
    zt.wait_for("del uid-rules").await;

    // ztunnel NACKs.
    zt.nack.lock().expect("lock").insert("uid-nack".to_string());
    let err = agent
        .agent
        .cni_add(node.event("nack"))
        .await
        .expect_err("nacked")
        .to_string();
    assert!(err.contains("test ztunnel rejects this pod"), "{err}");
    assert_eq!(
        node.redirector.calls().last(),
        Some(&Call::Unenroll(node.netns("nack")))
    );
    zt.wait_for("del uid-nack").await;

    assert!(node.redirector.installed().is_empty());
    assert!(agent.zds.cached().is_empty());
    assert!(agent.agent.pods().await.is_empty());
    assert!(saved(&node).is_empty(), "nothing recorded");
    agent.stop().await;
}

/// The real capture (nftables in the pod, the probe SNAT set on the node), after which the
/// pod's netns is deleted, as when its sandbox dies while the agent enrolls it.
struct VanishesAfterCapture {
    real: WithProbeSnat,
    netns: Netns,
}

impl Redirector for VanishesAfterCapture {
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.real.enroll(pod)?;
        self.netns.delete().map_err(|error| RedirectError::Netns {
            path: pod.netns.clone(),
            source: std::io::Error::other(error),
        })
    }

    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.real.unenroll(pod)
    }

    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError> {
        self.real.is_enrolled(pod)
    }

    fn name(&self) -> &'static str {
        self.real.name()
    }
}

fn probe_set(node: &Netns) -> String {
    node.exec_ok("nft", &["list", "set", "inet", HOST_TABLE, PROBE_SET_V4])
        .expect("nft list set")
}

#[tokio::test]
async fn a_netns_that_vanishes_mid_enrollment_is_rolled_back_and_reported() {
    if !have_root("a_netns_that_vanishes_mid_enrollment_is_rolled_back_and_reported") {
        return;
    }
    let mut net = TestNet::new("van").expect("test network");
    let host = net
        .add_node("node", std::net::Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let pod = net
        .add_pod(&host, "vanishing", std::net::Ipv4Addr::new(10, 1, 0, 5))
        .expect("pod");
    let probes = HostProbeSnat::in_netns(
        HostProbeConfig {
            ipv6: false,
            ..HostProbeConfig::default()
        },
        host.netns().path(),
    );
    let real = WithProbeSnat::new(Arc::new(NftablesRedirector::new()), probes).expect("probes");
    let mut node = Node::new();
    node.real_redirector = Some(Arc::new(VanishesAfterCapture {
        real,
        netns: pod.netns().clone(),
    }));
    node.write_namespace(&[AMBIENT]);
    node.write_pod("vanishing", &[]);
    let (agent, _) = node.start().await;
    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;

    let netns = pod.netns().path();
    let event = CniAddEvent {
        netns: netns.display().to_string(),
        ..node.event("vanishing")
    };
    let err = agent
        .agent
        .cni_add(event)
        .await
        .expect_err("the netns is gone before ztunnel gets it")
        .to_string();
    assert!(
        err.contains("apps/vanishing") && err.contains(&netns.display().to_string()),
        "names the pod and its netns: {err}"
    );
    // Rolled back: the node's probe set no longer lists the pod, nothing is recorded as
    // enrolled, ztunnel does not keep it (the ZDS add runs beside the capture, so it may have
    // got the pod before the netns went: then it was told to delete it again), and the
    // snapshot will not carry it.
    let set = probe_set(host.netns());
    assert!(!set.contains("10.1.0.5"), "{set}");
    let record = agent.record("vanishing").await;
    assert!(
        record.as_ref().is_none_or(|r| r.redirection.is_none()),
        "{record:?}"
    );
    let log = zt.log();
    let adds = log.iter().filter(|line| line.starts_with("add")).count();
    let dels = log.iter().filter(|line| line.starts_with("del")).count();
    assert!(adds <= dels, "every add was undone: {log:?}");
    assert!(agent.zds.cached().is_empty());
    assert!(saved(&node)
        .iter()
        .all(|r| r.name != "vanishing" || r.redirection.is_none()));
    agent.stop().await;
}

#[tokio::test]
async fn unknown_pod_fails_after_waiting() {
    let node = Node::new();
    let (agent, _) = node.start().await;
    let started = tokio::time::Instant::now();
    let err = agent
        .agent
        .cni_add(node.event("ghost"))
        .await
        .expect_err("no such pod")
        .to_string();
    assert!(started.elapsed() >= Duration::from_secs(2), "waited for it");
    assert!(
        err.contains("apps/ghost is not in the cluster source"),
        "{err}"
    );

    // A pod written while the ADD waits is found.
    let handler = agent.agent.clone();
    let event = node.event("late");
    let add = tokio::spawn(async move { handler.cni_add(event).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.write_pod("late", &[]);
    add.await.expect("task").expect("found once written");
    agent.stop().await;
}

#[tokio::test]
async fn restart_reenrolls_once_and_ztunnel_gets_the_pods_in_its_snapshot() {
    let node = Node::new();
    node.write_namespace(&[]);
    node.write_pod("a", &[AMBIENT]);
    node.write_pod("gone", &[AMBIENT]);
    let (first, _) = node.start().await;
    let (zt, task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;
    first.agent.cni_add(node.event("a")).await.expect("add a");
    first
        .agent
        .cni_add(node.event("gone"))
        .await
        .expect("add gone");
    first.stop().await;
    tokio::time::timeout(WAIT, task)
        .await
        .expect("ztunnel saw the agent go")
        .expect("ztunnel task");
    assert_eq!(
        node.redirector.installed().len(),
        2,
        "capture left in place"
    );
    std::fs::remove_file(node.netns("gone")).expect("pod gone while the agent was down");
    let enrolls_before = node.redirector.enroll_count(&node.netns("a"));

    let (second, summary) = node.start().await;
    assert_eq!(
        summary,
        RestoreSummary {
            kept: 1,
            dropped: 1,
            reenrolled: 1,
            failed: 0
        }
    );
    let zt = TestZtunnel::hello(&node.socket()).await;
    let snapshot = zt.take_snapshot().await;
    let names: Vec<String> = snapshot.iter().map(|r| r.describe()).collect();
    assert_eq!(names, vec!["add uid-a"]);
    assert!(
        snapshot[0].fd.is_some(),
        "netns fd re-opened from the recorded path"
    );

    assert_eq!(
        node.redirector.enroll_count(&node.netns("a")),
        enrolls_before + 1,
        "re-enrolled exactly once (restore), not again after the source synced"
    );
    assert!(
        node.redirector.installed().contains(&node.netns("a")),
        "one copy installed"
    );
    second
        .wait_status("a", Some(Some(Redirection::Enabled)))
        .await;
    assert!(second.record("gone").await.is_none());
    assert!(
        zt.try_recv(Duration::from_millis(300)).await.is_none(),
        "no duplicate add after the snapshot"
    );
    second.stop().await;
}

#[tokio::test]
async fn selected_running_pod_without_a_record_is_found_in_proc() {
    let uid = "2c48913c-b29f-11e7-9350-020968147796";
    let mut node = Node::new();
    // A fake procfs with the pod's process (cgroup names the pod uid).
    let proc_dir = node.dir.path().join("proc");
    let pid = proc_dir.join("4242");
    std::fs::create_dir_all(pid.join("ns")).expect("mkdir");
    std::fs::write(pid.join("ns/net"), "").expect("netns");
    std::fs::write(
        pid.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-besteffort-pod{}.slice/cri-containerd-1.scope\n",
            uid.replace('-', "_")
        ),
    )
    .expect("cgroup");
    node.proc_dir = Some(proc_dir);
    node.write_namespace(&[]);
    let yaml = pod_yaml(&PodSpec {
        namespace: "apps",
        name: "old",
        ip: "10.1.0.9",
        node: "node1",
        service_account: "sa",
        labels: &[],
    })
    .replacen("metadata:\n", &format!("metadata:\n  uid: {uid}\n"), 1);
    node.cluster.write("pod-old.yaml", &yaml);
    let (agent, _) = node.start().await;
    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;
    assert!(
        agent.record("old").await.is_none(),
        "not selected: not adopted"
    );

    node.write_namespace(&[AMBIENT]);
    agent
        .wait_status("old", Some(Some(Redirection::Enabled)))
        .await;
    zt.wait_for(&format!("add {uid}")).await;
    let record = agent.record("old").await.expect("adopted");
    assert_eq!(record.netns, pid.join("ns/net"));
    assert_eq!(
        record.ips,
        vec!["10.1.0.9".parse::<std::net::IpAddr>().expect("ip")]
    );
    agent.stop().await;
}

/// An injected pod (`istio-validation`, not `istio-init`) whose capture cni-node writes.
fn write_injected_pod(node: &Node, name: &str, annotations: &[(&str, &str)]) {
    let mut extra = String::new();
    for (k, v) in annotations {
        extra.push_str(&format!("    {k}: {v:?}\n"));
    }
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: apps\n  uid: uid-{name}\n  annotations:\n    sidecar.istio.io/status: '{{\"containers\":[\"istio-proxy\"]}}'\n{extra}spec:\n  nodeName: node1\n  serviceAccountName: sa\n  initContainers:\n  - name: istio-validation\n    image: proxyv2\n  containers:\n  - name: app\n    image: app\n  - name: istio-proxy\n    image: proxyv2\n    args: [proxy, sidecar]\n    securityContext: {{runAsUser: 1337, runAsGroup: 1337}}\nstatus:\n  phase: Pending\n  podIP: 10.1.0.5\n"
    );
    node.cluster.write(&format!("pod-{name}.yaml"), &yaml);
}

#[tokio::test]
async fn an_injected_pod_gets_sidecar_capture_and_a_bad_annotation_is_named() {
    if !have_root("an_injected_pod_gets_sidecar_capture_and_a_bad_annotation_is_named") {
        return;
    }
    let mut net = TestNet::new("sdc").expect("test network");
    let host = net
        .add_node("node", std::net::Ipv4Addr::new(172, 30, 0, 11))
        .expect("node");
    let good = net
        .add_pod(&host, "legacy", std::net::Ipv4Addr::new(10, 1, 0, 5))
        .expect("pod");
    let bad = net
        .add_pod(&host, "typo", std::net::Ipv4Addr::new(10, 1, 0, 6))
        .expect("pod");
    let node = Node::new();
    // An ambient namespace: the sidecar pod must still not be enrolled in ambient.
    node.write_namespace(&[AMBIENT]);
    write_injected_pod(
        &node,
        "legacy",
        &[("traffic.sidecar.istio.io/excludeOutboundPorts", "5432")],
    );
    write_injected_pod(
        &node,
        "typo",
        &[("traffic.sidecar.istio.io/includeInboundPorts", "80,htp")],
    );
    let (agent, _) = node.start().await;
    let (zt, _task) = AutoZtunnel::spawn(&node.socket());
    zt.wait_for("snapshot-sent").await;

    let event = |pod: &Netns, name: &str| CniAddEvent {
        netns: pod.path().display().to_string(),
        ..node.event(name)
    };
    agent
        .agent
        .cni_add(event(good.netns(), "legacy"))
        .await
        .expect("sidecar capture written");
    let rules = good
        .netns()
        .exec_ok("nft", &["list", "table", "inet", "istio-proxy-nat"])
        .expect("table");
    for expected in [
        "redirect to :15001",
        "redirect to :15006",
        "meta skuid 1337",
    ] {
        assert!(rules.contains(expected), "{expected} in {rules}");
    }
    assert!(
        rules
            .lines()
            .any(|l| l.contains("tcp dport 5432") && l.trim_end().ends_with("return")),
        "the excluded outbound port: {rules}"
    );
    // A sidecar pod in an ambient namespace: recorded as not enrolled, and ztunnel never
    // heard of it.
    agent.wait_status("legacy", Some(None)).await;
    assert!(
        zt.log().iter().all(|line| !line.starts_with("add")),
        "{:?}",
        zt.log()
    );

    let err = agent
        .agent
        .cni_add(event(bad.netns(), "typo"))
        .await
        .expect_err("bad annotation")
        .to_string();
    assert!(
        err.contains("apps/typo") && err.contains("includeInboundPorts") && err.contains("\"htp\""),
        "{err}"
    );
    let ruleset = bad
        .netns()
        .exec_ok("nft", &["list", "ruleset"])
        .expect("ruleset");
    assert!(
        !ruleset.contains("istio-proxy"),
        "nothing written: {ruleset}"
    );
    agent.stop().await;
}
