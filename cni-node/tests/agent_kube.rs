//! The node agent on the Kubernetes API (the fake API server): it watches only its node's
//! pods (field selector `spec.nodeName`), a namespace label change re-queues that namespace's
//! pods, and the `ambient.istio.io/redirection` annotation follows enrolment on the Pod.

mod agent_support;

use std::sync::Arc;
use std::time::Duration;

use agent_support::{AutoZtunnel, RecordingRedirector, WAIT};
use cni_node::agent::{kube_watches, Agent, AgentOptions, PodAnnotator, REDIRECTION_ANNOTATION};
use cni_node::event::{CniAddEvent, CniAddHandler};
use cni_node::zds_server::ZdsServer;
use mesh_runtime::signal;
use mesh_source::{ClusterSource, KubeSource};
use mesh_testutil::kube_api::{core_types, FakeApiServer};
use mesh_testutil::{namespace_yaml, pod_yaml, PodSpec};
use serde_json::Value;

fn pod(name: &str, node: &str) -> Value {
    serde_yaml::from_str(&pod_yaml(&PodSpec {
        namespace: "apps",
        name,
        ip: "10.1.0.5",
        node,
        service_account: "sa",
        labels: &[],
    }))
    .expect("pod")
}

fn namespace(labels: &[(&str, &str)]) -> Value {
    serde_yaml::from_str(&namespace_yaml("apps", labels)).expect("namespace")
}

async fn eventually(what: &str, f: impl FnMut() -> bool) {
    assert!(
        mesh_testutil::eventually(WAIT, f).await,
        "timed out waiting for {what}"
    );
}

#[tokio::test]
async fn the_agent_follows_its_nodes_pods_and_annotates_them() {
    let api = FakeApiServer::start(core_types()).await.expect("fake API");
    api.seed(namespace(&[])).expect("ns");
    api.seed(pod("a", "node1")).expect("a");
    api.seed(pod("elsewhere", "node2")).expect("elsewhere");
    let uid = |name: &str| {
        api.get("v1", "Pod", "apps", name).expect("pod")["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string()
    };
    let annotation = |name: &str| {
        api.get("v1", "Pod", "apps", name).and_then(|p| {
            p["metadata"]["annotations"][REDIRECTION_ANNOTATION]
                .as_str()
                .map(str::to_string)
        })
    };

    let dir = tempfile::tempdir().expect("tempdir");
    let client = api.client();
    let socket = dir.path().join("ztunnel.sock");
    let server = ZdsServer::bind(&socket).expect("bind ZDS");
    let mut options = AgentOptions::new(dir.path().join("state"));
    options.pod_wait = Duration::from_secs(1);
    options.node_name = Some("node1".into());
    options.host_proc = dir.path().join("no-proc");
    options.annotator = Some(PodAnnotator::spawn(client.clone()));
    let redirector = Arc::new(RecordingRedirector::default());
    let agent = Agent::new(options, redirector.clone(), server.handle());
    agent.restore().await.expect("restore");
    let source = KubeSource::new(client, kube_watches(Some("node1")));
    let (trigger, shutdown) = signal::channel();
    let (tx, events) = tokio::sync::mpsc::channel(256);
    tokio::spawn(Box::new(source).run(tx));
    tokio::spawn(server.run(shutdown.clone().wait()));
    let runner = agent.clone();
    let agent_task = tokio::spawn(async move { runner.run(events, shutdown.wait()).await });
    let mut ready = agent.ready();
    tokio::time::timeout(WAIT, ready.wait_for(|r| *r))
        .await
        .expect("ready")
        .expect("alive");
    let (zt, _zt_task) = AutoZtunnel::spawn(&socket);
    zt.wait_for("snapshot-sent").await;

    let netns = dir.path().join("netns-a");
    std::fs::write(&netns, "").expect("netns");
    let event = |name: &str, netns: &std::path::Path| CniAddEvent {
        netns: netns.display().to_string(),
        pod_name: name.into(),
        pod_namespace: "apps".into(),
        pod_uid: uid(name),
        ips: vec!["10.1.0.5/32".into()],
    };
    // Not selected yet: remembered, not enrolled, not annotated.
    agent.cni_add(event("a", &netns)).await.expect("add a");
    assert_eq!(annotation("a"), None);

    // The namespace joins the mesh: its running pod is enrolled and annotated.
    api.seed(namespace(&[("istio.io/dataplane-mode", "ambient")]))
        .expect("label");
    eventually("a enabled", || {
        annotation("a").as_deref() == Some("enabled")
    })
    .await;
    zt.wait_for(&format!("add {}", uid("a"))).await;

    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("PATCH /api/v1/namespaces/apps/pods/a/status")),
        "written through pods/status"
    );
    // A pod on another node is not in the agent's view at all.
    let err = agent
        .cni_add(event("elsewhere", &netns))
        .await
        .expect_err("not this node's pod")
        .to_string();
    assert!(err.contains("elsewhere"), "{err}");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/pods?")
                && r.contains("fieldSelector=spec.nodeName%3Dnode1")),
        "pods listed with the node's field selector: {:?}",
        api.requests()
    );

    // The label goes: unenrolled, the annotation removed.
    api.seed(namespace(&[])).expect("unlabel");
    eventually("a's annotation removed", || annotation("a").is_none()).await;
    zt.wait_for(&format!("del {}", uid("a"))).await;

    trigger.trigger();
    tokio::time::timeout(WAIT, agent_task)
        .await
        .expect("agent stops")
        .expect("agent task");
}

#[tokio::test]
async fn the_installer_keeps_the_plugin_while_its_daemonset_lives() {
    use cni_node::install::repair::{cleanup_unless_upgrading, Cleanup};
    let api = FakeApiServer::start(core_types()).await.expect("fake API");
    let client = api.client();
    let daemonset = |deleting: bool| {
        let mut ds = serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "istio-cni-node", "namespace": "istio-system"},
            "spec": {"selector": {"matchLabels": {"k8s-app": "istio-cni-node"}},
                     "template": {"metadata": {"labels": {"k8s-app": "istio-cni-node"}},
                                  "spec": {"containers": [{"name": "install-cni", "image": "cni"}]}}}});
        if deleting {
            ds["metadata"]["deletionTimestamp"] = serde_json::json!("2026-12-01T00:00:00Z");
        }
        ds
    };
    let decide = || {
        cleanup_unless_upgrading(
            client.clone(),
            "istio-system",
            "istio-cni-node",
            Some("node1"),
        )
    };
    assert_eq!(decide().await, Cleanup::Remove, "no DaemonSet: uninstalled");
    api.seed(daemonset(false)).expect("seed");
    assert_eq!(decide().await, Cleanup::Keep, "an upgrade or a restart");
    api.seed(daemonset(true)).expect("seed");
    assert_eq!(
        decide().await,
        Cleanup::Remove,
        "the DaemonSet is being deleted"
    );

    // The DaemonSet's required node affinity decides (its nodeSelector does not, as in Istio).
    let mut with_affinity = daemonset(false);
    with_affinity["spec"]["template"]["spec"]["nodeSelector"] =
        serde_json::json!({"nowhere": "true"});
    with_affinity["spec"]["template"]["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                                  {"key": "example.com/no-istio", "operator": "DoesNotExist"}]}]}}});
    api.seed(with_affinity).expect("seed");
    let node = |labels: serde_json::Value| serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1", "labels": labels}});
    api.seed(node(serde_json::json!({"kubernetes.io/os": "linux"})))
        .expect("node");
    assert_eq!(
        decide().await,
        Cleanup::Keep,
        "the node still matches: keep"
    );
    api.seed(node(
        serde_json::json!({"kubernetes.io/os": "linux", "example.com/no-istio": "1"}),
    ))
    .expect("node");
    assert_eq!(
        decide().await,
        Cleanup::Remove,
        "the node no longer matches: remove"
    );
}
