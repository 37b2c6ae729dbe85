//! The real `istio-cni` binary run as a container runtime runs it (config on stdin, `CNI_*`
//! in the environment) against an in-test agent (`cni_node::event::serve`) on a temp socket;
//! and, as root with Debian's CNI plugins installed, chained after `bridge` + `host-local` in
//! throwaway network namespaces.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use cni_node::event::{bind, serve, BoxFuture, CniAddEvent, CniAddHandler, HandlerError};
use serde_json::{json, Value};

/// Records events; fails those of pods whose name starts with "fail".
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<CniAddEvent>>,
}

impl CniAddHandler for Recorder {
    fn cni_add(&self, event: CniAddEvent) -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let fail = event.pod_name.starts_with("fail");
            self.seen.lock().expect("lock").push(event);
            if fail {
                Err("partial add error: no ztunnel connection".into())
            } else {
                Ok(())
            }
        })
    }
}

/// The agent's event server on `<tempdir>/pluginevent.sock`, on its own runtime thread.
struct Agent {
    dir: tempfile::TempDir,
    recorder: Arc<Recorder>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("pluginevent.sock");
        let recorder = Arc::new(Recorder::default());
        let handler: Arc<dyn CniAddHandler> = recorder.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = bind(&socket).expect("bind");
                ready_tx.send(()).expect("ready");
                serve(listener, handler, async {
                    let _ = stopped.await;
                })
                .await;
            });
        });
        ready.recv().expect("agent started");
        Agent {
            dir,
            recorder,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn run_dir(&self) -> &Path {
        self.dir.path()
    }

    fn seen(&self) -> Vec<CniAddEvent> {
        self.recorder.seen.lock().expect("lock").clone()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout {:?} is not JSON: {error}", self.stdout))
    }
}

/// Runs `program` with a clean environment of `vars` and `stdin`, as a runtime does.
fn run_plugin(program: &Path, vars: &HashMap<&str, String>, stdin: &str) -> Run {
    let mut child = Command::new(program)
        .env_clear()
        .envs(vars)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", program.display()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("wait");
    Run {
        status: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn istio_cni() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_istio-cni"))
}

fn cni_env(
    command: &str,
    netns: &str,
    pod: &str,
    namespace: &str,
) -> HashMap<&'static str, String> {
    HashMap::from([
        ("CNI_COMMAND", command.to_owned()),
        ("CNI_CONTAINERID", "8f3c0ffee".to_owned()),
        ("CNI_NETNS", netns.to_owned()),
        ("CNI_IFNAME", "eth0".to_owned()),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni".to_owned()),
        (
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};\
                 K8S_POD_INFRA_CONTAINER_ID=8f3c0ffee;K8S_POD_UID=uid-{pod}"
            ),
        ),
    ])
}

fn prev_result() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/pod-a"}],
        "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0}],
        "dns": {},
    })
}

fn istio_conf(run_dir: &Path, prev: Option<Value>) -> String {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "istio-cni",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": run_dir,
        "ambient_enabled": true,
        "exclude_namespaces": ["kube-system"],
        "pod_namespace": "istio-system",
    });
    if let Some(prev) = prev {
        conf["prevResult"] = prev;
    }
    conf.to_string()
}

#[test]
fn add_passes_prev_result_through_once_the_agent_accepted() {
    let agent = Agent::start();
    let vars = cni_env("ADD", "/var/run/netns/pod-a", "app-1", "default");
    let run = run_plugin(
        &istio_cni(),
        &vars,
        &istio_conf(agent.run_dir(), Some(prev_result())),
    );
    assert_eq!(run.status, 0, "stdout {} stderr {}", run.stdout, run.stderr);
    assert_eq!(run.json(), prev_result());
    assert_eq!(
        agent.seen(),
        vec![CniAddEvent {
            netns: "/var/run/netns/pod-a".into(),
            pod_name: "app-1".into(),
            pod_namespace: "default".into(),
            pod_uid: "uid-app-1".into(),
            ips: vec!["10.1.0.5/24".into()],
        }]
    );
    assert!(
        run.stderr.contains("agent accepted the pod"),
        "logs go to stderr: {}",
        run.stderr
    );
}

#[test]
fn agent_failure_is_try_again_later_with_its_text() {
    let agent = Agent::start();
    let vars = cni_env("ADD", "/var/run/netns/pod-b", "fail-1", "default");
    let run = run_plugin(
        &istio_cni(),
        &vars,
        &istio_conf(agent.run_dir(), Some(prev_result())),
    );
    assert_ne!(run.status, 0);
    let error = run.json();
    assert_eq!(error["code"], 11, "{error}");
    assert_eq!(error["cniVersion"], "1.0.0");
    let details = error["details"].as_str().expect("details");
    assert!(details.contains("no ztunnel connection"), "{details}");
    assert_eq!(agent.seen().len(), 1);
}

#[test]
fn absent_agent_is_try_again_later_naming_the_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vars = cni_env("ADD", "/var/run/netns/pod-c", "app-1", "default");
    let run = run_plugin(
        &istio_cni(),
        &vars,
        &istio_conf(dir.path(), Some(prev_result())),
    );
    assert_ne!(run.status, 0);
    let error = run.json();
    assert_eq!(error["code"], 11, "{error}");
    let socket = dir.path().join("pluginevent.sock");
    let details = error["details"].as_str().expect("details");
    assert!(details.contains(&socket.display().to_string()), "{details}");
}

#[test]
fn excluded_namespace_passes_through_without_an_event() {
    let agent = Agent::start();
    let vars = cni_env("ADD", "/var/run/netns/pod-d", "coredns-1", "kube-system");
    let run = run_plugin(
        &istio_cni(),
        &vars,
        &istio_conf(agent.run_dir(), Some(prev_result())),
    );
    assert_eq!(run.status, 0, "{} {}", run.stdout, run.stderr);
    assert_eq!(run.json(), prev_result());
    assert!(agent.seen().is_empty());
}

#[test]
fn missing_prev_result_is_an_error_naming_it() {
    let agent = Agent::start();
    let vars = cni_env("ADD", "/var/run/netns/pod-e", "app-1", "default");
    let run = run_plugin(&istio_cni(), &vars, &istio_conf(agent.run_dir(), None));
    assert_ne!(run.status, 0);
    let error = run.json();
    assert_eq!(error["code"], 7);
    assert!(error["details"]
        .as_str()
        .expect("details")
        .contains("prevResult"));
    assert!(agent.seen().is_empty());
}

#[test]
fn version_lists_supported_versions() {
    let vars = HashMap::from([("CNI_COMMAND", "VERSION".to_owned())]);
    let run = run_plugin(&istio_cni(), &vars, r#"{"cniVersion":"1.0.0"}"#);
    assert_eq!(run.status, 0);
    assert_eq!(
        run.json(),
        json!({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn del_and_check_succeed_silently_without_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    for command in ["DEL", "CHECK"] {
        let vars = cni_env(command, "/var/run/netns/pod-f", "app-1", "default");
        let run = run_plugin(
            &istio_cni(),
            &vars,
            &istio_conf(dir.path(), Some(prev_result())),
        );
        assert_eq!(run.status, 0, "{command}: {} {}", run.stdout, run.stderr);
        assert_eq!(run.stdout, "", "{command}");
    }
}

const BRIDGE: &str = "/usr/lib/cni/bridge";

/// Runs a plugin binary from a thread inside `netns` (its children inherit the namespace).
fn run_in(
    netns: &mesh_testutil::netns::Netns,
    program: &Path,
    vars: &HashMap<&str, String>,
    stdin: &str,
) -> Run {
    netns
        .run(|| run_plugin(program, vars, stdin))
        .expect("enter netns")
}

#[test]
fn chained_after_bridge_and_host_local() {
    if !mesh_testutil::netns::have_root("chained_after_bridge_and_host_local") {
        return;
    }
    if !Path::new(BRIDGE).exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{BRIDGE} missing and CI is set: apt-get install containernetworking-plugins"
        );
        eprintln!("SKIPPED chained_after_bridge_and_host_local: apt-get install containernetworking-plugins");
        return;
    }
    let mut net = mesh_testutil::netns::TestNet::new("icn").expect("topology");
    // "host" stands for the node's root netns, so the real one is never touched.
    let host = net
        .add_node("host", "172.30.0.1".parse().expect("ip"))
        .expect("host");
    let pod = net
        .add_node("pod", "172.30.0.2".parse().expect("ip"))
        .expect("pod");
    let pod_netns = pod.netns().path().display().to_string();
    let agent = Agent::start();
    let ipam_dir = agent.run_dir().join("ipam");
    let bridge_conf = json!({
        "cniVersion": "1.0.0",
        "name": "icn-test",
        "type": "bridge",
        "bridge": format!("{}c0", net.prefix()),
        "isGateway": true,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.99.0.0/24"}]],
            "dataDir": ipam_dir,
        },
    });
    let mut vars = cni_env("ADD", &pod_netns, "app-1", "default");
    vars.insert("CNI_PATH", "/usr/lib/cni".to_owned());

    let bridge = run_in(
        host.netns(),
        Path::new(BRIDGE),
        &vars,
        &bridge_conf.to_string(),
    );
    assert_eq!(
        bridge.status, 0,
        "bridge ADD: {} {}",
        bridge.stdout, bridge.stderr
    );
    let bridge_result = bridge.json();
    let address = bridge_result["ips"][0]["address"]
        .as_str()
        .expect("bridge result has an address")
        .to_owned();

    let run = run_plugin(
        &istio_cni(),
        &vars,
        &istio_conf(agent.run_dir(), Some(bridge_result.clone())),
    );
    assert_eq!(
        run.status, 0,
        "istio-cni ADD: {} {}",
        run.stdout, run.stderr
    );
    assert_eq!(run.json(), bridge_result, "prevResult passed through");
    let seen = agent.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].netns, pod_netns);
    assert_eq!(seen[0].ips, vec![address.clone()]);
    let in_pod = pod
        .netns()
        .ip(&["-4", "addr", "show", "dev", "eth0"])
        .expect("ip addr");
    assert!(
        in_pod.contains(&address),
        "{address} not in the pod: {in_pod}"
    );

    // Teardown in reverse order, with the cached result, as the runtime does.
    vars.insert("CNI_COMMAND", "DEL".to_owned());
    let run = run_plugin(
        &istio_cni(),
        &vars,
        &istio_conf(agent.run_dir(), Some(bridge_result.clone())),
    );
    assert_eq!(
        run.status, 0,
        "istio-cni DEL: {} {}",
        run.stdout, run.stderr
    );
    let mut del_conf = bridge_conf.clone();
    del_conf["prevResult"] = bridge_result;
    let bridge = run_in(
        host.netns(),
        Path::new(BRIDGE),
        &vars,
        &del_conf.to_string(),
    );
    assert_eq!(
        bridge.status, 0,
        "bridge DEL: {} {}",
        bridge.stdout, bridge.stderr
    );
    let ip = address.split('/').next().expect("ip");
    assert!(
        !ipam_dir.join("icn-test").join(ip).exists(),
        "host-local released {ip}"
    );
    assert_eq!(agent.seen().len(), 1, "DEL does not contact the agent");
}
