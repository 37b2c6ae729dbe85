//! A waypoint as the kubelet would run it: `pilot-agent proxy waypoint` (which runs Envoy) in
//! the waypoint pod's network namespace, with the files its Deployment mounts (token, root
//! certificate, pod labels) under a directory of its own.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mesh_api::k8s_openapi::api::core::v1::{Container, Volume};
use mesh_testutil::netns::ChildGuard;
use mesh_testutil::{http_request, Netns};

use crate::bins::binary;
use crate::cluster::MeshPod;
use crate::istiod::{Istiod, SECURE_GRPC_PORT};

pub const ADMIN_PORT: u16 = 15000;
pub const STATUS_PORT: u16 = 15020;
pub const READINESS_PORT: u16 = 15021;
/// Hands `dir` and everything in it to `uid` (a sidecar's files, which it writes to).
fn give_to(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            give_to(&path, uid);
        } else {
            std::os::unix::fs::chown(&path, Some(uid), Some(uid)).expect("chown");
        }
    }
}

/// The Envoy binary the tests run (installed by scripts/install-deps.sh).
pub fn envoy_path() -> PathBuf {
    mesh_testutil::envoy_path().expect("no Envoy: run scripts/install-deps.sh (or set ENVOY_PATH)")
}

/// The downward API's rendering of labels (`key="value"` lines).
fn downward_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{v}\"\n"))
        .collect()
}

/// Kubernetes' `$(VAR)` expansion against the variables defined so far (unknown ones stay).
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// Fills the mount point `path` with what `volume` holds for `pod`.
fn mount_volume(path: &Path, volume: &Volume, pod: &MeshPod, istiod: &Istiod) {
    let spec = &pod.spec;
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                assert_eq!(
                    token.audience.as_deref(),
                    Some("istio-ca"),
                    "token audience"
                );
                let jwt = istiod.add_workload_token(&spec.namespace, &spec.service_account);
                std::fs::write(path.join(&token.path), jwt).expect("token");
            }
        }
    } else if let Some(cm) = &volume.config_map {
        assert_eq!(
            cm.name, "istio-ca-root-cert",
            "the only ConfigMap the harness has"
        );
        std::fs::copy(istiod.root_cert(), path.join("root-cert.pem")).expect("root cert");
    } else if let Some(downward) = &volume.downward_api {
        for item in downward.items.iter().flatten() {
            let text = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.labels") => downward_labels(&spec.labels),
                Some("metadata.annotations") => downward_labels(&spec.annotations),
                _ => String::new(),
            };
            std::fs::write(path.join(&item.path), text).expect("downward API file");
        }
    }
}

pub struct Waypoint {
    netns: Netns,
    ip: Ipv4Addr,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    args: Vec<String>,
    /// The user (and group) the agent runs as; `None`: the harness's own (root).
    uid: Option<u32>,
    child: Option<ChildGuard>,
}

impl std::fmt::Debug for Waypoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waypoint").field("ip", &self.ip).finish()
    }
}

/// The harness's additions to every waypoint container's environment: where Envoy is, and
/// plain logs.
fn harness_env() -> Vec<(String, String)> {
    [
        ("ENVOY_PATH", envoy_path().display().to_string()),
        ("LOG_FORMAT", "plain".to_string()),
        ("RUST_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `extra` replaces or adds to `env`.
fn override_env(env: &mut Vec<(String, String)>, extra: &[(&str, &str)]) {
    for (k, v) in extra {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v.to_string()));
    }
}

impl Waypoint {
    /// Starts the agent for `pod` (a pod of the waypoint's Deployment, labelled with its
    /// Gateway's name) against `istiod`, with the environment and mounts the waypoint
    /// template gives its container, written out by hand.
    pub fn start(pod: &MeshPod, istiod: &Istiod, extra: &[(&str, &str)]) -> Waypoint {
        let (dir, env) = Waypoint::pod_files(pod, istiod, extra);
        let spec = &pod.spec;
        let args = vec![
            "proxy".to_string(),
            "waypoint".to_string(),
            "--domain".to_string(),
            format!("{}.svc.cluster.local", spec.namespace),
            "--serviceCluster".to_string(),
            format!("{}.{}", spec.service_account, spec.namespace),
        ];
        Waypoint::launch(pod, dir, env, args, None)
    }

    /// The files the proxy's container mounts (token, root certificate, pod labels) in a
    /// directory of its own, and its environment.
    fn pod_files(
        pod: &MeshPod,
        istiod: &Istiod,
        extra: &[(&str, &str)],
    ) -> (tempfile::TempDir, Vec<(String, String)>) {
        let spec = &pod.spec;
        let dir = tempfile::tempdir().expect("waypoint directory");
        let put = |rel: &str, content: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, content).expect("write");
        };
        let token = istiod.add_workload_token(&spec.namespace, &spec.service_account);
        put("var/run/secrets/tokens/istio-token", &token);
        let root = std::fs::read_to_string(istiod.root_cert()).expect("istiod root cert");
        put("var/run/secrets/istio/root-cert.pem", &root);
        put("etc/istio/pod/labels", &downward_labels(&spec.labels));
        let mut env: Vec<(String, String)> = [
            ("POD_NAME", spec.name.clone()),
            ("POD_NAMESPACE", spec.namespace.clone()),
            ("INSTANCE_IP", pod.ip.to_string()),
            ("SERVICE_ACCOUNT", spec.service_account.clone()),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes".to_string()),
            (
                "PROXY_CONFIG",
                format!(
                    "{{\"discoveryAddress\":\"{}:{SECURE_GRPC_PORT}\",\"drainDuration\":\"2s\"}}",
                    istiod.ip()
                ),
            ),
            ("TERMINATION_DRAIN_DURATION", "2s".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(harness_env())
        .collect();
        override_env(&mut env, extra);
        (dir, env)
    }

    /// Starts `container` of `pod` as the kubelet would: its args with `$(VAR)` expanded, its
    /// environment (values and field references), and its volume mounts under the pod's
    /// directory (the projected `istio-ca` token, the root certificate ConfigMap, the
    /// downward-API labels, empty dirs). `istiod.istio-system.svc` resolves to `istiod`'s
    /// address, as cluster DNS would. `extra` adds to the environment (test settings).
    pub fn from_container(
        pod: &MeshPod,
        istiod: &Istiod,
        container: &Container,
        volumes: &[Volume],
        extra: &[(&str, &str)],
    ) -> Waypoint {
        let dir = tempfile::tempdir().expect("pod directory");
        for mount in container.volume_mounts.iter().flatten() {
            let Some(volume) = volumes.iter().find(|v| v.name == mount.name) else {
                panic!("volume {} of the container is not in the pod", mount.name);
            };
            let path = dir.path().join(mount.mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(&path).expect("mount point");
            mount_volume(&path, volume, pod, istiod);
        }
        let mut env: Vec<(String, String)> = Vec::new();
        let istiod_host = format!("{}:", istiod.ip());
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(v), _) => expand(v, &env),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.name") => pod.spec.name.clone(),
                        Some("metadata.namespace") => pod.spec.namespace.clone(),
                        Some("status.podIP" | "status.hostIP") => pod.ip.to_string(),
                        Some("spec.serviceAccountName") => pod.spec.service_account.clone(),
                        Some("spec.nodeName") => pod.spec.node.clone(),
                        // Resource limits: the pod has none.
                        _ => continue,
                    }
                }
                (None, None) => String::new(),
            };
            env.push((
                var.name.clone(),
                value.replace("istiod.istio-system.svc:", &istiod_host),
            ));
        }
        env.extend(harness_env());
        override_env(&mut env, extra);
        let args = container
            .args
            .iter()
            .flatten()
            .map(|a| expand(a, &env))
            .collect();
        // The user the container runs as (a sidecar's 1337, which its capture lets through).
        let uid = (container.security_context.as_ref())
            .and_then(|s| s.run_as_user)
            .and_then(|u| u32::try_from(u).ok())
            .filter(|u| *u != 0);
        if let Some(uid) = uid {
            give_to(dir.path(), uid);
        }
        Waypoint::launch(pod, dir, env, args, uid)
    }

    fn launch(
        pod: &MeshPod,
        dir: tempfile::TempDir,
        env: Vec<(String, String)>,
        args: Vec<String>,
        uid: Option<u32>,
    ) -> Waypoint {
        let mut wp = Waypoint {
            netns: pod.netns.clone(),
            ip: pod.ip,
            dir,
            env,
            args,
            uid,
            child: None,
        };
        wp.spawn();
        wp
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pilot-agent.log")
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(binary("pilot-agent"));
        cmd.args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path());
        if let Some(uid) = self.uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
            // Its stdout and stderr: Envoy reopens `/dev/stdout` for an access log file, which
            // needs the file to be the proxy's, as a container's own stdout is.
            let log = self.log_path();
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("log file");
            std::os::unix::fs::chown(&log, Some(uid), Some(uid)).expect("chown log");
        }
        self.child = Some(crate::process::spawn_logged(
            &self.netns,
            &mut cmd,
            &self.log_path(),
        ));
    }

    /// The agent's and Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `GET path` on the readiness port (served by Envoy, answered by the agent).
    pub fn readiness(&self) -> Option<(u16, String)> {
        http_request(
            &self.netns,
            SocketAddr::from((self.ip, READINESS_PORT)),
            "GET",
            "/healthz/ready",
            &[],
            Duration::from_secs(5),
        )
        .map(|r| (r.status, r.body))
    }

    /// `GET /healthz/ready` on the agent's status port (what 15021 forwards to once Envoy has
    /// started its listeners).
    pub fn agent_readiness(&self) -> Option<(u16, String)> {
        http_request(
            &self.netns,
            SocketAddr::from((self.ip, STATUS_PORT)),
            "GET",
            "/healthz/ready",
            &[],
            Duration::from_secs(5),
        )
        .map(|r| (r.status, r.body))
    }

    /// Waits until `/healthz/ready` on 15021 answers 200.
    pub fn wait_ready(&self, limit: Duration) {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < limit {
            last = self.readiness();
            if last.as_ref().is_some_and(|(s, _)| *s == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "waypoint not ready after {limit:?} (last answer {last:?}); log:\n{}",
            self.log()
        );
    }

    /// `GET path` on Envoy's admin port (localhost in the pod).
    pub fn admin(&self, path: &str) -> String {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
        let r = http_request(&self.netns, addr, "GET", path, &[], Duration::from_secs(5))
            .expect("Envoy admin answers");
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        r.body
    }

    /// One Envoy counter or gauge from `/stats` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        self.admin(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The merged metrics on the status port.
    pub fn metrics(&self) -> String {
        http_request(
            &self.netns,
            SocketAddr::from((self.ip, STATUS_PORT)),
            "GET",
            "/stats/prometheus",
            &[],
            Duration::from_secs(5),
        )
        .map(|r| r.body)
        .unwrap_or_default()
    }

    /// The pod's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The pod's network namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The agent's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildGuard::id)
    }

    /// SIGTERM; waits up to `limit` for the agent to drain and exit.
    pub fn stop(&mut self, limit: Duration) -> bool {
        crate::process::terminate(self.child.take(), limit)
    }
}
