//! Running Envoy: start it with the bootstrap, restart it when it dies (with backoff), and on
//! shutdown drain its listeners gracefully, give in-flight requests the termination drain
//! duration, then stop it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use mesh_runtime::signal::Shutdown;
use tokio::process::{Child, Command};

use crate::admin::EnvoyAdmin;
use crate::config::Config;

const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long Envoy may take to exit after SIGTERM before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("no Envoy binary: set ENVOY_PATH or put `envoy` on PATH (scripts/install-deps.sh installs Envoy 1.40)")]
    NotFound,
    #[error("cannot start Envoy {path}: {source}")]
    Spawn {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl EnvoyError {
    pub fn reason(&self) -> &'static str {
        match self {
            EnvoyError::NotFound => "not_found",
            EnvoyError::Spawn { .. } => "spawn",
        }
    }
}

/// `ENVOY_PATH`, else `envoy` on `PATH`.
pub fn find_envoy(configured: Option<&Path>) -> Result<PathBuf, EnvoyError> {
    if let Some(p) = configured {
        return if p.exists() {
            Ok(p.to_path_buf())
        } else {
            Err(EnvoyError::NotFound)
        };
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("envoy"))
                .find(|p| p.is_file())
        })
        .ok_or(EnvoyError::NotFound)
}

/// Envoy's command line, as Istio's agent runs it.
pub fn args(cfg: &Config, bootstrap: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-c".into(),
        bootstrap.display().to_string(),
        "--drain-time-s".into(),
        cfg.drain_duration.as_secs().max(1).to_string(),
        "--drain-strategy".into(),
        "immediate".into(),
        "--local-address-ip-version".into(),
        if cfg.instance_ip.is_ipv6() {
            "v6"
        } else {
            "v4"
        }
        .into(),
        "--file-flush-interval-msec".into(),
        "1000".into(),
        "--disable-hot-restart".into(),
        "--allow-unknown-static-fields".into(),
        "-l".into(),
        cfg.proxy_log_level.clone(),
        "--concurrency".into(),
        cfg.concurrency.to_string(),
    ];
    if let Some(levels) = &cfg.proxy_component_log_level {
        args.extend(["--component-log-level".into(), levels.clone()]);
    }
    args
}

/// Supervises Envoy until `shutdown`; returns once Envoy has drained and exited.
pub async fn supervise(
    binary: PathBuf,
    args: Vec<String>,
    admin: EnvoyAdmin,
    termination_drain: Duration,
    shutdown: Shutdown,
) -> Result<(), EnvoyError> {
    let mut backoff = MIN_BACKOFF;
    loop {
        let mut child = spawn(&binary, &args)?;
        let started = std::time::Instant::now();
        tracing::info!(pid = child.id(), binary = %binary.display(), "Envoy started");
        tokio::select! {
            status = child.wait() => {
                let ran = started.elapsed();
                tracing::error!(status = ?status.ok(), ran = ?ran, restart_in = ?backoff, "Envoy exited; restarting it");
                if ran > MAX_BACKOFF {
                    backoff = MIN_BACKOFF;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.clone().wait() => return Ok(()),
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            _ = shutdown.clone().wait() => {
                drain_and_stop(&mut child, &admin, termination_drain).await;
                return Ok(());
            }
        }
    }
}

#[expect(
    unsafe_code,
    reason = "pre_exec runs between fork and exec to tie Envoy's life to the agent's"
)]
fn spawn(binary: &Path, args: &[String]) -> Result<Child, EnvoyError> {
    let mut cmd = Command::new(binary);
    cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
    // SAFETY: the closure only calls prctl(PR_SET_PDEATHSIG), which is async-signal-safe and
    // touches no memory of the parent: if the agent dies (even by SIGKILL), Envoy is killed
    // instead of lingering with the pod's listeners.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn().map_err(|source| EnvoyError::Spawn {
        path: binary.display().to_string(),
        source,
    })
}

/// Graceful drain (listeners stop taking new connections, HTTP connections are closed after
/// their current request), a wait for in-flight requests, then SIGTERM.
async fn drain_and_stop(child: &mut Child, admin: &EnvoyAdmin, termination_drain: Duration) {
    match admin.post("/drain_listeners?graceful").await {
        Ok((status, _)) => tracing::info!(status, wait = ?termination_drain, "Envoy draining"),
        Err(e) => tracing::warn!(error = %e, "could not start Envoy's drain; stopping it anyway"),
    }
    tokio::select! {
        _ = tokio::time::sleep(termination_drain) => {}
        status = child.wait() => {
            tracing::warn!(status = ?status.ok(), "Envoy exited while draining");
            return;
        }
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(EXIT_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::warn!("Envoy did not exit after SIGTERM; killing it");
        let _ = child.kill().await;
    }
    tracing::info!("Envoy stopped");
}
