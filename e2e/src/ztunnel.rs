//! ztunnel as a process inside a node's network namespace, talking to an [`Istiod`] and to
//! the node agent's ZDS socket.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;

use crate::bins::binary;
use crate::http;
use crate::istiod::Istiod;

/// ztunnel's well-known ports in its own netns.
pub const ADMIN_PORT: u16 = 15000;
pub const STATS_PORT: u16 = 15020;
pub const READINESS_PORT: u16 = 15021;

/// A running ztunnel of one node.
pub struct Ztunnel {
    netns: Netns,
    node: String,
    ip: Ipv4Addr,
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
    child: Option<ChildGuard>,
}

impl std::fmt::Debug for Ztunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ztunnel").field("node", &self.node).finish()
    }
}

impl Ztunnel {
    /// Starts the ztunnel of `node` (its netns and IP) against `istiod`, connecting to the
    /// ZDS socket at `zds`, with `extra` environment on top of the defaults. Does not wait
    /// for readiness (see [`Ztunnel::wait_ready`]).
    pub fn start(
        netns: &Netns,
        node: &str,
        ip: Ipv4Addr,
        istiod: &Istiod,
        zds: &Path,
        extra: &[(&str, &str)],
    ) -> Ztunnel {
        let path = |p: PathBuf| p.display().to_string();
        let mut env: Vec<(String, String)> = [
            ("XDS_ADDRESS", istiod.address()),
            ("CA_ADDRESS", istiod.address()),
            ("XDS_ROOT_CA", path(istiod.root_cert())),
            ("CA_ROOT_CA", path(istiod.root_cert())),
            ("AUTH_TOKEN", path(istiod.token_file(node))),
            ("NODE_NAME", node.to_string()),
            ("POD_NAME", format!("ztunnel-{node}")),
            ("POD_NAMESPACE", "istio-system".to_string()),
            ("INSTANCE_IP", ip.to_string()),
            ("INPOD_UDS", zds.display().to_string()),
            ("CLUSTER_ID", "Kubernetes".to_string()),
            ("LOG_FORMAT", "json".to_string()),
            ("RUST_LOG", "info".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v.to_string()));
        }
        let mut zt = Ztunnel {
            netns: netns.clone(),
            node: node.to_string(),
            ip,
            env,
            dir: tempfile::tempdir().expect("ztunnel directory"),
            child: None,
        };
        zt.spawn();
        zt
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("ztunnel.log")
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(binary("ztunnel"));
        cmd.env_clear().envs(self.env.iter().map(|(k, v)| (k, v)));
        self.child = Some(crate::process::spawn_logged(
            &self.netns,
            &mut cmd,
            &self.log_path(),
        ));
    }

    /// The node it serves.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Its log so far (JSON lines).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Access-log lines (target `access`) so far.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.get("target").and_then(|t| t.as_str()) == Some("access"))
            .collect()
    }

    /// Waits until `/healthz/ready` answers 200.
    pub fn wait_ready(&self, limit: Duration) {
        let addr = SocketAddr::from((self.ip, READINESS_PORT));
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < limit {
            last = http::get(&self.netns, addr, "/healthz/ready");
            if last.as_ref().is_some_and(|(status, _)| *status == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "ztunnel of {} not ready after {limit:?} (last answer {last:?}); log:\n{}",
            self.node,
            self.log()
        );
    }

    /// `/config_dump` from the admin port.
    pub fn config_dump(&self) -> serde_json::Value {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
        let (status, body) = http::get(&self.netns, addr, "/config_dump").expect("admin answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("config_dump is JSON")
    }

    /// `/metrics` text.
    pub fn metrics(&self) -> String {
        let addr = SocketAddr::from((self.ip, STATS_PORT));
        http::get(&self.netns, addr, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// Whether its metrics count an inbound connection (`reporter="destination"`) from
    /// `principal`.
    pub fn saw_inbound_from(&self, principal: &str) -> bool {
        let source = format!("source_principal=\"{principal}\"");
        self.metrics()
            .lines()
            .filter(|l| l.starts_with("istio_tcp_connections_opened_total"))
            .any(|l| l.contains("reporter=\"destination\"") && l.contains(&source))
    }

    /// Sends SIGTERM and waits up to `limit` for the exit; returns whether it exited cleanly.
    pub fn stop(&mut self, limit: Duration) -> bool {
        crate::process::terminate(self.child.take(), limit)
    }

    /// Kills it (SIGKILL) without draining.
    pub fn kill(&mut self) {
        self.child.take();
    }

    /// Starts it again with the same environment.
    pub fn restart(&mut self) {
        self.stop(Duration::from_secs(10));
        self.spawn();
    }

    /// The process id while it runs (`None` after [`Ztunnel::stop`] or [`Ztunnel::kill`]).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildGuard::id)
    }

    /// Its open file descriptors (`/proc/<pid>/fd`), `None` when it is not running.
    pub fn fd_count(&self) -> Option<usize> {
        crate::procfs::fd_count(self.pid()?)
    }

    /// `/config_dump`, or `None` when the admin port does not answer 200 with JSON.
    pub fn try_config_dump(&self) -> Option<serde_json::Value> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
        let (status, body) = http::get(&self.netns, addr, "/config_dump")?;
        (status == 200).then(|| serde_json::from_str(&body).ok())?
    }
}
