//! istiod as a process inside a node's network namespace, reading a cluster directory.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_testutil::netns::ChildGuard;
use mesh_testutil::{ClusterDir, Netns};

use crate::bins::binary;
use crate::http;

/// istiod's debug port (`/ready`).
pub const HTTP_PORT: u16 = 8080;
/// xDS + CA over TLS.
pub const SECURE_GRPC_PORT: u16 = 15012;

/// A running istiod. Its state directory (CA root) survives [`Istiod::restart`].
pub struct Istiod {
    netns: Netns,
    ip: Ipv4Addr,
    pub cluster: ClusterDir,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    args: Vec<String>,
    child: Option<ChildGuard>,
}

impl std::fmt::Debug for Istiod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Istiod").field("ip", &self.ip).finish()
    }
}

impl Istiod {
    /// Starts istiod in `netns` (reachable at `ip`), with a bearer token per node in `nodes`
    /// (see [`Istiod::token_file`]), and waits until it is ready.
    pub fn start(netns: &Netns, ip: Ipv4Addr, cluster: ClusterDir, nodes: &[&str]) -> Istiod {
        Istiod::start_with(netns, ip, cluster, nodes, &[], &[])
    }

    /// Like [`Istiod::start`] with `extra` environment (e.g. `MAX_WORKLOAD_CERT_TTL`) and
    /// command-line flags (e.g. Istio's `--keepaliveMaxServerConnectionAge=...`), both kept
    /// across [`Istiod::restart`].
    pub fn start_with(
        netns: &Netns,
        ip: Ipv4Addr,
        cluster: ClusterDir,
        nodes: &[&str],
        extra: &[(&str, &str)],
        args: &[String],
    ) -> Istiod {
        let dir = tempfile::tempdir().expect("istiod directory");
        let mut tokens = String::from("tokens:\n");
        for node in nodes {
            let token = format!("e2e-ztunnel-{node}");
            tokens.push_str(&format!(
                "- token: {token}\n  identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel\n  node: {node}\n"
            ));
            std::fs::write(dir.path().join(format!("token-{node}")), &token).expect("token file");
        }
        std::fs::write(dir.path().join("tokens.yaml"), tokens).expect("tokens file");
        std::fs::create_dir_all(dir.path().join("state")).expect("state dir");
        let mut istiod = Istiod {
            netns: netns.clone(),
            ip,
            cluster,
            dir,
            env: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: args.to_vec(),
            child: None,
        };
        istiod.spawn();
        istiod
    }

    /// Where proxies reach it.
    pub fn address(&self) -> String {
        format!("https://{}:{SECURE_GRPC_PORT}", self.ip)
    }

    /// The mesh root certificate istiod published.
    pub fn root_cert(&self) -> PathBuf {
        self.dir.path().join("state").join("root-cert.pem")
    }

    /// The token file the ztunnel of `node` presents.
    pub fn token_file(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("token-{node}"))
    }

    /// Registers a bearer token for the workload identity `namespace`/`service_account` (what
    /// a pod's projected token is in a cluster) and returns it. istiod re-reads the file.
    pub fn add_workload_token(&self, namespace: &str, service_account: &str) -> String {
        let token = format!("e2e-workload-{namespace}-{service_account}");
        let path = self.dir.path().join("tokens.yaml");
        let mut tokens = std::fs::read_to_string(&path).expect("tokens file");
        if !tokens.contains(&token) {
            tokens.push_str(&format!(
                "- token: {token}\n  identity: spiffe://cluster.local/ns/{namespace}/sa/{service_account}\n"
            ));
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, tokens).expect("tokens file");
            std::fs::rename(&tmp, &path).expect("tokens file");
        }
        token
    }

    /// istiod's IP.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// istiod's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("istiod.log")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("istiod log");
        let path = |p: &Path| p.display().to_string();
        let mut cmd = Command::new(binary("istiod"));
        cmd.arg(format!("--config-dir={}", path(self.cluster.path())))
            .arg(format!(
                "--state-dir={}",
                path(&self.dir.path().join("state"))
            ))
            .arg(format!(
                "--tokens-file={}",
                path(&self.dir.path().join("tokens.yaml"))
            ))
            .args(&self.args)
            .env("ISTIOD_SERVING_IPS", format!("127.0.0.1,{}", self.ip))
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.child = Some(self.netns.spawn(&mut cmd).expect("start istiod"));
        self.wait_ready(Duration::from_secs(20));
    }

    fn wait_ready(&self, limit: Duration) {
        let addr = SocketAddr::from((self.ip, HTTP_PORT));
        let start = Instant::now();
        while start.elapsed() < limit {
            if http::get(&self.netns, addr, "/ready").is_some_and(|(status, _)| status == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("istiod not ready after {limit:?}; log:\n{}", self.log());
    }

    /// Stops istiod with SIGTERM and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("istiod did not exit within 10 s of SIGTERM");
        }
    }

    /// Starts it again (same CA, same configuration) and waits until it is ready.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}
