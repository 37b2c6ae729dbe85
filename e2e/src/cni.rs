//! Runs a CNI plugin chain exactly as a container runtime does (libcni's behaviour): each
//! plugin of the conflist is executed with the CNI_* environment and its network
//! configuration on stdin, ADD in order with the previous result injected as `prevResult`,
//! DEL in reverse order. Plugins run inside the node's network namespace, like the kubelet.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mesh_testutil::Netns;
use serde_json::{json, Value};

/// Debian's reference plugins (`containernetworking-plugins`).
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";

/// A network configuration list (`.conflist`).
#[derive(Clone, Debug)]
pub struct ConfList {
    pub value: Value,
}

/// Who the pod is, as the runtime passes it in `CNI_ARGS`.
#[derive(Clone, Debug)]
pub struct PodRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// The sandbox container id.
    pub container_id: &'a str,
    /// The pod's netns path (`CNI_NETNS`).
    pub netns: &'a Path,
}

/// Why a chain failed: the plugin, its exit status and its CNI error JSON (or output).
#[derive(Debug)]
pub struct CniFailure {
    pub plugin: String,
    pub command: &'static str,
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for CniFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CNI {} of plugin {} failed (exit {:?}): {} {}",
            self.command, self.plugin, self.status, self.stdout, self.stderr
        )
    }
}

impl ConfList {
    pub fn new(value: Value) -> ConfList {
        ConfList { value }
    }

    fn plugins(&self) -> Vec<Value> {
        self.value["plugins"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn plugin_conf(&self, plugin: &Value, prev: Option<&Value>) -> Value {
        let mut conf = plugin.clone();
        conf["name"] = self.value["name"].clone();
        conf["cniVersion"] = self.value["cniVersion"].clone();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        conf
    }
}

/// Runs the chain's ADD in `node` for `pod`; the final result.
pub fn add(
    node: &Netns,
    list: &ConfList,
    pod: &PodRef<'_>,
    cni_path: &[PathBuf],
) -> Result<Value, CniFailure> {
    add_timed(node, list, pod, cni_path).map(|(result, _)| result)
}

/// [`add`], also returning how long each plugin took (process start to exit), in order.
pub fn add_timed(
    node: &Netns,
    list: &ConfList,
    pod: &PodRef<'_>,
    cni_path: &[PathBuf],
) -> Result<(Value, Vec<(String, std::time::Duration)>), CniFailure> {
    let mut prev: Option<Value> = None;
    let mut timings = Vec::new();
    for plugin in list.plugins() {
        let conf = list.plugin_conf(&plugin, prev.as_ref());
        let started = std::time::Instant::now();
        let out = exec(node, "ADD", &conf, pod, cni_path)?;
        let name = plugin["type"].as_str().unwrap_or_default().to_string();
        timings.push((name, started.elapsed()));
        prev = Some(out);
    }
    Ok((prev.unwrap_or(Value::Null), timings))
}

/// Runs the chain's DEL in reverse order (every plugin runs even if one fails; the first
/// failure is returned).
pub fn del(
    node: &Netns,
    list: &ConfList,
    pod: &PodRef<'_>,
    cni_path: &[PathBuf],
) -> Result<(), CniFailure> {
    let mut first = None;
    for plugin in list.plugins().iter().rev() {
        let conf = list.plugin_conf(plugin, None);
        if let Err(e) = exec(node, "DEL", &conf, pod, cni_path) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

fn exec(
    node: &Netns,
    command: &'static str,
    conf: &Value,
    pod: &PodRef<'_>,
    cni_path: &[PathBuf],
) -> Result<Value, CniFailure> {
    let plugin = conf["type"].as_str().unwrap_or_default().to_string();
    let fail = |status, stdout: String, stderr: String| CniFailure {
        plugin: plugin.clone(),
        command,
        status,
        stdout,
        stderr,
    };
    let Some(binary) = cni_path
        .iter()
        .map(|d| d.join(&plugin))
        .find(|p| p.is_file())
    else {
        return Err(fail(
            None,
            String::new(),
            format!("plugin not found in {cni_path:?}"),
        ));
    };
    let path = std::env::join_paths(cni_path).unwrap_or_default();
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
        pod.namespace, pod.name, pod.container_id, pod.uid
    );
    let mut cmd = Command::new(&binary);
    cmd.env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", pod.container_id)
        .env("CNI_NETNS", pod.netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", args)
        .env("CNI_PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = node
        .spawn(&mut cmd)
        .map_err(|e| fail(None, String::new(), e.to_string()))?;
    let stdin = conf.to_string();
    if let Some(mut pipe) = child.child().stdin.take() {
        let _ = pipe.write_all(stdin.as_bytes());
    }
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.child().stdout.take() {
        let _ = std::io::Read::read_to_string(&mut out, &mut stdout);
    }
    if let Some(mut err) = child.child().stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    let status = child
        .child()
        .wait()
        .map_err(|e| fail(None, stdout.clone(), e.to_string()))?;
    if !status.success() {
        return Err(fail(status.code(), stdout, stderr));
    }
    if command == "DEL" || stdout.trim().is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(&stdout).map_err(|e| fail(status.code(), stdout.clone(), e.to_string()))
}

/// The pod IPs (without prefix) of a CNI result.
pub fn result_ips(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip["address"].as_str())
                .filter_map(|a| a.split('/').next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}
