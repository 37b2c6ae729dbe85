//! `cni-node`: the istio-cni node agent for ambient mode.
//!
//! ```text
//! cni-node [run] [--cluster-config-dir DIR]      run the agent (configuration: cni_node::config)
//! cni-node status [--state-dir DIR] [-o table|wide|json]   the pods the agent knows and their
//!                                                     ambient.istio.io/redirection status
//! cni-node install-cni | uninstall-cni [--net-dir DIR] [--bin-dir DIR] [--plugin FILE]
//!                                      [--conf-name NAME] [--kubeconfig FILE] [--watch]
//!     chain istio-cni into the node's primary CNI configuration (cni_node::install), or take
//!     it out; with --watch, keep it installed and repaired until SIGTERM, then take it out
//!     unless the istio-cni-node DaemonSet still exists (an upgrade)
//! ```
//!
//! The command line is parsed by clap (`cni-node --help`); a bad flag exits 2.
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

use clap::{Args, Parser, Subcommand, ValueEnum};
use cni_node::agent::{kube_watches, serve_probes, Agent, AgentOptions, PodAnnotator};
use cni_node::config::{Config, RedirectionMode, AGENT_STATE_DIR, DEFAULT_STATE_DIR};
use cni_node::event::{self, CniAddHandler};
use cni_node::redirect::{
    HostProbeConfig, HostProbeSnat, NftablesRedirector, Redirector, WithProbeSnat,
};
use cni_node::state::{render_table, StateStore};
use cni_node::zds_server::ZdsServer;
use mesh_source::{ClusterSource, DirectoryOptions, DirectorySource, KubeSource};
use tracing::{error, info, warn};

/// The istio-cni node agent for ambient mode.
#[derive(Debug, Parser)]
#[command(name = "cni-node", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand: `run`.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (the default; configured by environment, see cni_node::config).
    Run(RunArgs),
    /// The pods the agent knows and their ambient.istio.io/redirection status.
    Status(StatusArgs),
    /// Chain istio-cni into the node's primary CNI configuration; with --watch keep it
    /// installed and repaired until SIGTERM.
    InstallCni {
        #[command(flatten)]
        paths: CniPaths,
        /// Keep the entry installed and repaired until SIGTERM, then take it out unless the
        /// istio-cni-node DaemonSet still exists (an upgrade).
        #[arg(long)]
        watch: bool,
    },
    /// Take istio-cni out of the node's CNI configuration.
    UninstallCni {
        #[command(flatten)]
        paths: CniPaths,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Read pods and namespaces from this YAML directory instead of the Kubernetes API.
    #[arg(long, value_name = "DIR")]
    cluster_config_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// Where the agent keeps its pod records [default: $AGENT_STATE_DIR, else
    /// /var/run/istio-cni/state].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Wide,
    Json,
}

/// Where install-cni works, defaulting as Istio's install-cni container mounts the host.
#[derive(Debug, Args)]
struct CniPaths {
    /// The node's CNI configuration directory.
    #[arg(long, value_name = "DIR", default_value = "/host/etc/cni/net.d")]
    net_dir: PathBuf,
    /// Where the plugin binary is copied.
    #[arg(long, value_name = "DIR", default_value = "/host/opt/cni/bin")]
    bin_dir: PathBuf,
    /// The plugin binary to copy (default: istio-cni next to this binary).
    #[arg(long, value_name = "FILE")]
    plugin: Option<PathBuf>,
    /// The primary configuration file to chain into [default: $CNI_CONF_NAME, else the
    /// first one by name].
    #[arg(long, value_name = "NAME")]
    conf_name: Option<String>,
    /// Where the plugin's kubeconfig is written when running in a pod.
    #[arg(long, value_name = "FILE", default_value = cni_node::install::kubeconfig::DEFAULT_KUBECONFIG)]
    kubeconfig: PathBuf,
}

/// Why the agent or the installer stopped with an error.
#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("cannot install the host probe SNAT rules: {0}")]
    ProbeSnat(#[source] cni_node::redirect::RedirectError),
    #[cfg(feature = "ebpf")]
    #[error("cannot load the eBPF capture programs: {0}")]
    Ebpf(#[source] mesh_ebpf::CaptureError),
    #[cfg(not(feature = "ebpf"))]
    #[error("REDIRECTION_MODE=ebpf, but this cni-node was built without the ebpf feature")]
    EbpfNotBuilt,
    #[error(transparent)]
    Zds(#[from] cni_node::zds_server::ZdsError),
    #[error(transparent)]
    Kube(#[from] mesh_kube::ClientError),
    #[error(transparent)]
    Restore(#[from] cni_node::agent::AgentError),
    #[error(transparent)]
    PluginSocket(#[from] cni_node::event::EventError),
    #[error("cannot listen on {addr} for /readyz: {source}; is another agent running?")]
    Readiness {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Install(#[from] cni_node::install::InstallError),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run(cli.run)) {
        Command::Run(args) => run(args.cluster_config_dir),
        Command::Status(args) => {
            let state_dir = args.state_dir.unwrap_or_else(|| {
                std::env::var_os(AGENT_STATE_DIR)
                    .filter(|v| !v.is_empty())
                    .map_or_else(|| PathBuf::from(DEFAULT_STATE_DIR), PathBuf::from)
            });
            status(&state_dir, args.output == Output::Json)
        }
        Command::InstallCni { paths, watch } => {
            let opts = install_options(paths);
            if watch {
                keep_cni_installed(&opts)
            } else {
                install_cni(&opts, false)
            }
        }
        Command::UninstallCni { paths } => install_cni(&install_options(paths), true),
    }
}

/// An environment variable's value; unset and empty are the same (as in a pod spec).
fn env_non_empty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The installer's options: Istio's chained entry, and in a pod the plugin's kubeconfig
/// (written from the service account) named in it.
fn install_options(paths: CniPaths) -> cni_node::install::InstallOptions {
    let plugin_binary = paths.plugin.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/opt/cni/bin"))
            .join(cni_node::install::PLUGIN_TYPE)
    });
    let mut opts = cni_node::install::InstallOptions {
        net_dir: paths.net_dir,
        bin_dir: paths.bin_dir,
        plugin_binary,
        conf_name: paths
            .conf_name
            .or_else(|| env_non_empty("CNI_CONF_NAME"))
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
    if let Some(account) = cni_node::install::ServiceAccount::in_cluster() {
        opts.entry["kubernetes"] =
            serde_json::json!({"kubeconfig": paths.kubeconfig.display().to_string()});
        opts.kubeconfig = Some((paths.kubeconfig, account));
    }
    opts
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
        let shutdown = mesh_runtime::signal::on_signals().map_err(MainError::Signals)?;
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
        Ok(keep_installed(opts, REPAIR_INTERVAL, shutdown.wait(), cleanup).await?)
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
fn block_on(work: impl std::future::Future<Output = Result<(), MainError>>) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(MainError::Runtime)
        .and_then(|runtime| runtime.block_on(work));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The capture chosen by `REDIRECTION_MODE`, with the node's probe SNAT kept in step and, with
/// `AMBIENT_SOCKMAP`, the pods' addresses in the sockmap programs.
fn redirector(
    config: &Config,
    sockmap: Option<&Arc<SockmapHandle>>,
) -> Result<Arc<dyn Redirector>, MainError> {
    let mut inner: Arc<dyn Redirector> = match config.redirection {
        RedirectionMode::Nftables => Arc::new(NftablesRedirector::new()),
        RedirectionMode::Ebpf => ebpf_redirector()?,
    };
    if let Some(sockmap) = sockmap {
        inner = with_sockmap(inner, sockmap);
    }
    let probes = HostProbeSnat::new(HostProbeConfig::default());
    let with_probes = WithProbeSnat::new(inner, probes).map_err(MainError::ProbeSnat)?;
    tracing::info!(mode = with_probes.name(), "pod capture");
    Ok(Arc::new(with_probes))
}

#[cfg(feature = "ebpf")]
type SockmapHandle = mesh_ebpf::Sockmap;
#[cfg(not(feature = "ebpf"))]
type SockmapHandle = ();

/// With `AMBIENT_SOCKMAP`: the sockmap programs, loaded on `AMBIENT_SOCKMAP_CGROUP` or else the
/// first cgroup v2 hierarchy (one is mounted when the machine has none). Without kernel support
/// (or without the `ebpf` feature) the agent warns and runs without them: every connection
/// keeps TCP.
#[cfg(feature = "ebpf")]
fn load_sockmap(config: &Config) -> Option<Arc<SockmapHandle>> {
    if !config.sockmap {
        return None;
    }
    let cgroup = match &config.sockmap_cgroup {
        Some(dir) => Ok(dir.clone()),
        None => {
            warn_if_own_cgroup_namespace(&config.host_proc);
            mesh_ebpf::cgroup2_root(std::path::Path::new(mesh_ebpf::DEFAULT_CGROUP2_MOUNT))
        }
    };
    let loaded = cgroup.and_then(|cgroup| mesh_ebpf::Sockmap::load(&cgroup));
    match loaded {
        Ok(sockmap) => {
            tracing::info!(cgroup = %sockmap.cgroup().display(), "sockmap: in-pod legs go socket to socket");
            Some(Arc::new(sockmap))
        }
        Err(error) => {
            warn!(
                reason = error.reason(),
                "sockmap unavailable, in-pod legs keep TCP: {error}"
            );
            None
        }
    }
}

/// In a cgroup namespace of its own (a container), the agent's cgroup v2 root holds only the
/// agent, so the program would see no pod's socket.
#[cfg(feature = "ebpf")]
fn warn_if_own_cgroup_namespace(host_proc: &std::path::Path) {
    let own = std::fs::read_link("/proc/self/ns/cgroup");
    let host = std::fs::read_link(host_proc.join("1/ns/cgroup"));
    if let (Ok(own), Ok(host)) = (own, host) {
        if own != host {
            warn!(
                "sockmap: the agent runs in a cgroup namespace of its own, whose root holds no \
                 pod; mount the host's cgroup v2 root into it and set AMBIENT_SOCKMAP_CGROUP"
            );
        }
    }
}

#[cfg(not(feature = "ebpf"))]
fn load_sockmap(config: &Config) -> Option<Arc<SockmapHandle>> {
    if config.sockmap {
        warn!(
            reason = "not_built",
            "sockmap unavailable, in-pod legs keep TCP: cni-node was built without its ebpf feature"
        );
    }
    None
}

#[cfg(feature = "ebpf")]
fn with_sockmap(inner: Arc<dyn Redirector>, sockmap: &Arc<SockmapHandle>) -> Arc<dyn Redirector> {
    Arc::new(cni_node::redirect::WithSockmap::new(inner, sockmap.clone()))
}

#[cfg(not(feature = "ebpf"))]
fn with_sockmap(inner: Arc<dyn Redirector>, _sockmap: &Arc<SockmapHandle>) -> Arc<dyn Redirector> {
    inner
}

/// `GET /debug/sockmap` on the readiness port: the programs' counters as JSON.
#[cfg(feature = "ebpf")]
fn sockmap_routes(sockmap: Option<Arc<SockmapHandle>>) -> axum::Router {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let Some(sockmap) = sockmap else {
        return axum::Router::new();
    };
    let stats = move || {
        let sockmap = sockmap.clone();
        async move {
            match sockmap.stats() {
                Ok(s) => axum::Json(serde_json::json!({
                        "appSockets": s.app_sockets,
                        "proxySockets": s.proxy_sockets,
                        "redirectedMessages": s.redirected_msgs,
                        "redirectedBytes": s.redirected_bytes,
                        "tcpStreams": s.tcp_streams,
                        "insertFailed": s.insert_failed,
                }))
                .into_response(),
                Err(error) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response()
                }
            }
        }
    };
    axum::Router::new().route("/debug/sockmap", axum::routing::get(stats))
}

#[cfg(not(feature = "ebpf"))]
fn sockmap_routes(_sockmap: Option<Arc<SockmapHandle>>) -> axum::Router {
    axum::Router::new()
}

#[cfg(feature = "ebpf")]
fn ebpf_redirector() -> Result<Arc<dyn Redirector>, MainError> {
    cni_node::redirect::ebpf::EbpfRedirector::new()
        .map(|r| Arc::new(r) as Arc<dyn Redirector>)
        .map_err(MainError::Ebpf)
}

#[cfg(not(feature = "ebpf"))]
fn ebpf_redirector() -> Result<Arc<dyn Redirector>, MainError> {
    Err(MainError::EbpfNotBuilt)
}

async fn serve(config: Config) -> Result<(), MainError> {
    let shutdown = mesh_runtime::signal::on_signals().map_err(MainError::Signals)?;
    let sockmap = load_sockmap(&config);
    let redirector = redirector(&config, sockmap.as_ref())?;
    let zds = ZdsServer::bind(&config.zds_socket)?;
    let mut options = AgentOptions::from_config(&config);
    let source: Box<dyn ClusterSource> = match &config.cluster_config_dir {
        Some(dir) => Box::new(DirectorySource::new(dir, DirectoryOptions::default())),
        None => {
            let client = mesh_kube::client(config.kubeconfig.as_deref()).await?;
            options.annotator = Some(PodAnnotator::spawn(client.clone()));
            Box::new(KubeSource::new(
                client,
                kube_watches(config.node_name.as_deref()),
            ))
        }
    };
    let agent = Agent::new(options, redirector, zds.handle());
    // Before ztunnel can be accepted: recorded pods must be in its first snapshot.
    agent.restore().await?;

    let (tx, events) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(source.run(tx));
    let zds_task = tokio::spawn(zds.run(shutdown.clone().wait()));

    let listener = event::bind(&config.plugin_event_socket)?;
    let handler: Arc<dyn CniAddHandler> = Arc::new(agent.clone());
    let plugin_task = tokio::spawn(event::serve(listener, handler, shutdown.clone().wait()));

    let probes = tokio::net::TcpListener::bind(config.readiness_addr)
        .await
        .map_err(|source| MainError::Readiness {
            addr: config.readiness_addr,
            source,
        })?;
    tokio::spawn(serve_probes(
        probes,
        agent.ready(),
        sockmap_routes(sockmap),
        shutdown.clone().wait(),
    ));

    agent.run(events, shutdown.clone().wait()).await;
    let _ = plugin_task.await;
    let _ = zds_task.await;
    let _ = std::fs::remove_file(&config.plugin_event_socket);
    info!("cni-node stopped");
    Ok(())
}
