//! `cni-node`: the istio-cni node agent for ambient mode.
//!
//! ```text
//! cni-node [run] [--cluster-config-dir DIR]      run the agent (configuration: cni_node::config)
//! cni-node status [--state-dir DIR] [-o table|json]   the pods the agent knows and their
//!                                                     ambient.istio.io/redirection status
//! cni-node install-cni | uninstall-cni [--net-dir DIR] [--bin-dir DIR] [--plugin FILE]
//!                                      [--conf-name NAME] [--kubeconfig FILE] [--watch]
//!     chain istio-cni into the node's primary CNI configuration (cni_node::install), or take
//!     it out; with --watch, keep it installed and repaired until SIGTERM, then take it out
//!     unless the istio-cni-node DaemonSet still exists (an upgrade)
//! ```
//!
//! The agent watches the cluster YAML directory (`CLUSTER_CONFIG_DIR`), or on Kubernetes the
//! pods of its node and all namespaces (writing `ambient.istio.io/redirection`), serves the plugin's
//! events (`PLUGIN_EVENT_SOCKET`) and ztunnel's ZDS connections (`INPOD_UDS`), keeps its pod
//! records in `AGENT_STATE_DIR`, and answers `/readyz` (`AGENT_READINESS_ADDR`) once the
//! source synced and the recorded pods were reconciled. SIGTERM/SIGINT stop it and leave
//! every pod's capture in place (as upstream: a restarted agent picks them up again).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cni_node::agent::{kube_watches, serve_probes, Agent, AgentOptions, PodAnnotator};
use cni_node::config::{Config, RedirectionMode, AGENT_STATE_DIR, DEFAULT_STATE_DIR};
use cni_node::event::{self, CniAddHandler};
use cni_node::redirect::{
    HostProbeConfig, HostProbeSnat, NftablesRedirector, Redirector, WithProbeSnat,
};
use cni_node::state::{render_table, StateStore};
use cni_node::zds_server::ZdsServer;
use mesh_source::{ClusterSource, DirectoryOptions, DirectorySource, KubeSource};
use tracing::{error, info};

const USAGE: &str = "usage:
  cni-node [run] [--cluster-config-dir DIR]
  cni-node status [--state-dir DIR] [-o table|json]
  cni-node install-cni | uninstall-cni [--net-dir DIR] [--bin-dir DIR] [--plugin FILE] [--conf-name NAME]
                                       [--kubeconfig FILE] [--watch]";

#[derive(Debug)]
enum Command {
    Run {
        cluster_dir: Option<PathBuf>,
    },
    Status {
        state_dir: PathBuf,
        json: bool,
    },
    Install {
        opts: Box<cni_node::install::InstallOptions>,
        remove: bool,
        watch: bool,
    },
    Help,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse_args(&args) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Command::Status { state_dir, json }) => status(&state_dir, json),
        Ok(Command::Run { cluster_dir }) => run(cluster_dir),
        Ok(Command::Install {
            opts,
            remove: false,
            watch: true,
        }) => keep_cni_installed(&opts),
        Ok(Command::Install { opts, remove, .. }) => install_cni(&opts, remove),
        Err(message) => {
            eprintln!("cni-node: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The value after flag `name`.
fn next_value(it: &mut std::slice::Iter<'_, String>, name: &str) -> Result<String, String> {
    it.next()
        .cloned()
        .ok_or_else(|| format!("{name} needs a value"))
}

fn parse_args(args: &[String]) -> Result<Command, String> {
    let (command, rest) = match args.first().map(String::as_str) {
        Some("status") => ("status", &args[1..]),
        Some("run") => ("run", &args[1..]),
        Some("install-cni") => ("install-cni", &args[1..]),
        Some("uninstall-cni") => ("uninstall-cni", &args[1..]),
        _ => ("run", args),
    };
    if command.ends_with("install-cni") {
        return install_args(rest, command == "uninstall-cni");
    }
    let mut cluster_dir = None;
    let mut state_dir = None;
    let mut json = false;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| next_value(&mut it, name);
        match (command, arg.as_str()) {
            (_, "-h" | "--help") => return Ok(Command::Help),
            ("run", "--cluster-config-dir") => cluster_dir = Some(PathBuf::from(value(arg)?)),
            ("status", "--state-dir") => state_dir = Some(PathBuf::from(value(arg)?)),
            ("status", "-o" | "--output") => {
                json = match value(arg)?.as_str() {
                    "json" => true,
                    "table" | "wide" => false,
                    other => return Err(format!("unknown output format {other:?}")),
                }
            }
            (_, other) => return Err(format!("unknown argument {other:?} for {command}")),
        }
    }
    Ok(match command {
        "status" => Command::Status {
            state_dir: state_dir.unwrap_or_else(|| {
                std::env::var_os(AGENT_STATE_DIR)
                    .filter(|v| !v.is_empty())
                    .map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), PathBuf::from)
            }),
            json,
        },
        _ => Command::Run { cluster_dir },
    })
}

/// `install-cni` / `uninstall-cni` flags, defaulting as Istio's install-cni container mounts
/// the host: `/host/etc/cni/net.d`, `/host/opt/cni/bin`, the plugin next to this binary;
/// `CNI_CONF_NAME` names the primary file. In a pod, the plugin's kubeconfig is written (from
/// the service account) and named in its entry.
fn install_args(rest: &[String], remove: bool) -> Result<Command, String> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/opt/cni/bin"));
    let mut opts = cni_node::install::InstallOptions {
        net_dir: PathBuf::from("/host/etc/cni/net.d"),
        bin_dir: PathBuf::from("/host/opt/cni/bin"),
        plugin_binary: exe_dir.join(cni_node::install::PLUGIN_TYPE),
        conf_name: std::env::var("CNI_CONF_NAME")
            .ok()
            .filter(|v| !v.is_empty()),
        entry: serde_json::json!({
            "cniVersion": "0.3.1",
            "name": "istio-cni",
            "type": cni_node::install::PLUGIN_TYPE,
            "plugin_log_level": "info",
            "cni_agent_run_dir": cni_node::plugin::DEFAULT_AGENT_RUN_DIR,
            "ambient_enabled": true,
            "exclude_namespaces": cni_node::plugin::DEFAULT_EXCLUDE_NAMESPACES,
        }),
        kubeconfig: None,
    };
    let mut kubeconfig = PathBuf::from(cni_node::install::kubeconfig::DEFAULT_KUBECONFIG);
    let mut watch = false;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| next_value(&mut it, name);
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--net-dir" => opts.net_dir = PathBuf::from(value(arg)?),
            "--bin-dir" => opts.bin_dir = PathBuf::from(value(arg)?),
            "--plugin" => opts.plugin_binary = PathBuf::from(value(arg)?),
            "--conf-name" => opts.conf_name = Some(value(arg)?),
            "--kubeconfig" => kubeconfig = PathBuf::from(value(arg)?),
            "--watch" if !remove => watch = true,
            other => return Err(format!("unknown argument {other:?} for install-cni")),
        }
    }
    if let Some(account) = cni_node::install::ServiceAccount::in_cluster() {
        opts.entry["kubernetes"] =
            serde_json::json!({"kubeconfig": kubeconfig.display().to_string()});
        opts.kubeconfig = Some((kubeconfig, account));
    }
    Ok(Command::Install {
        opts: Box::new(opts),
        remove,
        watch,
    })
}

fn install_cni(opts: &cni_node::install::InstallOptions, remove: bool) -> ExitCode {
    let result = if remove {
        cni_node::install::uninstall(opts).map(|()| "istio-cni removed".to_string())
    } else {
        cni_node::install::install(opts).map(|f| format!("istio-cni chained into {}", f.display()))
    };
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cni-node: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How often `install-cni --watch` checks its work.
const REPAIR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The DaemonSet whose continued existence on stop means an upgrade.
const CNI_DAEMONSET: &str = "istio-cni-node";

fn keep_cni_installed(opts: &cni_node::install::InstallOptions) -> ExitCode {
    use cni_node::install::repair::{cleanup_unless_upgrading, keep_installed, Cleanup};
    if let Err(e) = mesh_runtime::telemetry::init() {
        eprintln!("cni-node: {e}");
        return ExitCode::from(2);
    }
    block_on(async {
        let shutdown = mesh_runtime::signal::on_signals()
            .map_err(|e| format!("cannot install signal handlers: {e}"))?;
        let in_cluster = opts.kubeconfig.is_some();
        let cleanup = || async move {
            if !in_cluster {
                return Cleanup::Remove;
            }
            let namespace =
                std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "istio-system".into());
            let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
            match mesh_kube::client(None).await {
                Ok(client) => {
                    cleanup_unless_upgrading(client, &namespace, CNI_DAEMONSET, node.as_deref())
                        .await
                }
                Err(e) => {
                    error!(error = %e, "cannot reach the API server to tell an upgrade; removing istio-cni");
                    Cleanup::Remove
                }
            }
        };
        keep_installed(opts, REPAIR_INTERVAL, shutdown.wait(), cleanup)
            .await
            .map_err(|e| e.to_string())
    })
}

fn status(state_dir: &std::path::Path, json: bool) -> ExitCode {
    let pods = match StateStore::new(state_dir).load() {
        Ok(pods) => pods,
        Err(e) => {
            eprintln!("cni-node status: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = match json {
        true => match serde_json::to_string_pretty(&pods) {
            Ok(text) => text + "\n",
            Err(e) => {
                eprintln!("cni-node status: {e}");
                return ExitCode::FAILURE;
            }
        },
        false => render_table(&pods),
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    ExitCode::SUCCESS
}

fn run(cluster_dir: Option<PathBuf>) -> ExitCode {
    if let Err(e) = mesh_runtime::telemetry::init() {
        eprintln!("cni-node: {e}");
        return ExitCode::from(2);
    }
    let config = match Config::from_env(cluster_dir) {
        Ok(config) => config,
        Err(e) => {
            error!(reason = e.reason(), "{e}");
            return ExitCode::from(2);
        }
    };
    let shown = serde_json::to_string(&config).unwrap_or_default();
    info!(config = %shown, "cni-node starting");
    block_on(serve(config))
}

/// Runs `work` on a single-threaded runtime; its error is logged and fails the process.
fn block_on(work: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The capture chosen by `REDIRECTION_MODE`, with the node's probe SNAT kept in step.
fn redirector(config: &Config) -> Result<Arc<dyn Redirector>, String> {
    let inner: Arc<dyn Redirector> = match config.redirection {
        RedirectionMode::Nftables => Arc::new(NftablesRedirector::new()),
        RedirectionMode::Ebpf => ebpf_redirector()?,
    };
    let probes = HostProbeSnat::new(HostProbeConfig::default());
    let with_probes = WithProbeSnat::new(inner, probes)
        .map_err(|e| format!("cannot install the host probe SNAT rules: {e}"))?;
    tracing::info!(mode = with_probes.name(), "pod capture");
    Ok(Arc::new(with_probes))
}

#[cfg(feature = "ebpf")]
fn ebpf_redirector() -> Result<Arc<dyn Redirector>, String> {
    cni_node::redirect::ebpf::EbpfRedirector::new()
        .map(|r| Arc::new(r) as Arc<dyn Redirector>)
        .map_err(|e| format!("cannot load the eBPF capture programs: {e}"))
}

#[cfg(not(feature = "ebpf"))]
fn ebpf_redirector() -> Result<Arc<dyn Redirector>, String> {
    Err("REDIRECTION_MODE=ebpf, but this cni-node was built without the ebpf feature".into())
}

async fn serve(config: Config) -> Result<(), String> {
    let shutdown = mesh_runtime::signal::on_signals()
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let redirector = redirector(&config)?;
    let zds = ZdsServer::bind(&config.zds_socket).map_err(|e| e.to_string())?;
    let mut options = AgentOptions::from_config(&config);
    let source: Box<dyn ClusterSource> = match &config.cluster_config_dir {
        Some(dir) => Box::new(DirectorySource::new(dir, DirectoryOptions::default())),
        None => {
            let client = mesh_kube::client(config.kubeconfig.as_deref())
                .await
                .map_err(|e| e.to_string())?;
            options.annotator = Some(PodAnnotator::spawn(client.clone()));
            Box::new(KubeSource::new(
                client,
                kube_watches(config.node_name.as_deref()),
            ))
        }
    };
    let agent = Agent::new(options, redirector, zds.handle());
    // Before ztunnel can be accepted: recorded pods must be in its first snapshot.
    agent.restore().await.map_err(|e| e.to_string())?;

    let (tx, events) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(source.run(tx));
    let zds_task = tokio::spawn(zds.run(shutdown.clone().wait()));

    let listener = event::bind(&config.plugin_event_socket).map_err(|e| e.to_string())?;
    let handler: Arc<dyn CniAddHandler> = Arc::new(agent.clone());
    let plugin_task = tokio::spawn(event::serve(listener, handler, shutdown.clone().wait()));

    let probes = tokio::net::TcpListener::bind(config.readiness_addr)
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {} for /readyz: {e}; is another agent running?",
                config.readiness_addr
            )
        })?;
    tokio::spawn(serve_probes(probes, agent.ready(), shutdown.clone().wait()));

    agent.run(events, shutdown.clone().wait()).await;
    let _ = plugin_task.await;
    let _ = zds_task.await;
    let _ = std::fs::remove_file(&config.plugin_event_socket);
    info!("cni-node stopped");
    Ok(())
}
