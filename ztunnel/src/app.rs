//! The ztunnel process: wires configuration, workload state (xDS), certificates, the in-pod
//! manager and its pod proxies, and the admin, metrics and readiness servers; drains on
//! SIGTERM or `/quitquitquit`.
//!
//! Two runtimes, as upstream: a current-thread one for control work (xDS, CA, admin, metrics)
//! and a multi-threaded one for the data plane (pod listeners and their connections).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use mesh_runtime::http::{metrics_router, BoundServer, HttpError};
use mesh_runtime::metrics::Metrics;
use mesh_runtime::readiness::Readiness;
use mesh_runtime::signal::{self, Shutdown, ShutdownTrigger};
use mesh_runtime::telemetry::LogControl;
use tokio::sync::watch;

use crate::admin::{admin_router, readiness_router, AdminView};
use crate::certs::{CaClientConfig, CertError, CertManager, CertManagerOptions, GrpcCaClient};
use crate::config::{Config, ProxyMode};
use crate::inpod::InPodManager;
use crate::proxy::{Proxy, ProxyInputs};
use crate::state::{SharedState, State, StateError};
use crate::xds::{NodeIdentity, XdsClient, XdsConfig, XdsError};

/// Readiness conditions of ztunnel.
pub const READY_XDS: &str = "workloads from xDS";
pub const READY_CERTS: &str = "certificates of local workloads";
pub const READY_INPOD: &str = "in-pod snapshot from the node agent";

/// Why ztunnel could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot start the {which} runtime: {source}")]
    Runtime {
        which: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    LocalConfig(#[from] StateError),
    #[error(transparent)]
    Xds(#[from] XdsError),
    #[error(transparent)]
    Ca(#[from] CertError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

impl AppError {
    pub fn reason(&self) -> &'static str {
        match self {
            AppError::Runtime { .. } => "runtime",
            AppError::LocalConfig(_) => "local_config",
            AppError::Xds(_) => "xds",
            AppError::Ca(_) => "ca",
            AppError::Http(_) => "http",
            AppError::Signals(_) => "signals",
        }
    }
}

/// Runs ztunnel until SIGTERM/SIGINT or `/quitquitquit`, then drains.
pub fn run(config: Config, logging: Option<LogControl>) -> Result<(), AppError> {
    let data_plane = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
        .thread_name("ztunnel-proxy")
        .enable_all()
        .build()
        .map_err(|source| AppError::Runtime {
            which: "data-plane",
            source,
        })?;
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| AppError::Runtime {
            which: "control",
            source,
        })?;
    let handle = data_plane.handle().clone();
    let result = control.block_on(async move {
        let (trigger, shutdown) = signal::channel();
        let signals = signal::on_signals().map_err(AppError::Signals)?;
        let trigger = Arc::new(trigger);
        {
            let trigger = trigger.clone();
            tokio::spawn(async move {
                signals.wait().await;
                trigger.trigger();
            });
        }
        let running = start(config, handle, trigger, shutdown.clone(), logging).await?;
        running.wait().await;
        Ok(())
    });
    data_plane.shutdown_timeout(Duration::from_secs(1));
    result
}

/// A started ztunnel (used by `run` and by in-process tests).
#[derive(Debug)]
pub struct Running {
    pub admin_addr: SocketAddr,
    pub stats_addr: SocketAddr,
    pub readiness_addr: SocketAddr,
    pub state: SharedState,
    pub readiness: Readiness,
    pub metrics: Metrics,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Waits until shutdown was requested and everything drained.
    pub async fn wait(self) {
        let _ = self.done.await;
    }
}

/// Addresses of ztunnel's own servers (fixed ports in production; port 0 in tests).
#[derive(Clone, Copy, Debug)]
pub struct ServerAddrs {
    pub admin: SocketAddr,
    pub stats: SocketAddr,
    pub readiness: SocketAddr,
}

impl ServerAddrs {
    /// Istio's ports: admin on localhost, metrics and readiness on every address.
    pub fn from_config(config: &Config) -> ServerAddrs {
        ServerAddrs {
            admin: SocketAddr::from((Ipv4Addr::LOCALHOST, config.ports.admin)),
            stats: SocketAddr::from((Ipv4Addr::UNSPECIFIED, config.ports.stats)),
            readiness: SocketAddr::from((Ipv4Addr::UNSPECIFIED, config.ports.readiness)),
        }
    }
}

/// Starts every component; `data_plane` runs the pod proxies. Call on the control runtime.
pub async fn start(
    config: Config,
    data_plane: tokio::runtime::Handle,
    trigger: Arc<ShutdownTrigger>,
    shutdown: Shutdown,
    logging: Option<LogControl>,
) -> Result<Running, AppError> {
    let addrs = ServerAddrs::from_config(&config);
    start_with(config, addrs, data_plane, trigger, shutdown, logging).await
}

/// [`start`] with explicit server addresses.
pub async fn start_with(
    config: Config,
    addrs: ServerAddrs,
    data_plane: tokio::runtime::Handle,
    trigger: Arc<ShutdownTrigger>,
    shutdown: Shutdown,
    logging: Option<LogControl>,
) -> Result<Running, AppError> {
    let config = Arc::new(config);
    let metrics = Metrics::new();
    let readiness = Readiness::new();
    let state = load_state(&config)?;

    // Bind first: a port conflict is a start-up error, not a log line later.
    let admin = BoundServer::bind(addrs.admin).await?;
    let stats = BoundServer::bind(addrs.stats).await?;
    let ready_server = BoundServer::bind(addrs.readiness).await?;

    let mut tasks = tokio::task::JoinSet::new();
    start_xds(&config, &state, &readiness, &shutdown, &mut tasks)?;
    let certs = start_certs(&config, &state, &readiness, &shutdown, &mut tasks)?;

    let proxy_metrics = crate::metrics::Metrics::register(&metrics);
    crate::dns::DnsMetrics::register(&metrics);
    let proxy = Proxy::new(ProxyInputs::new(
        config.clone(),
        state.clone(),
        Arc::new(certs.clone()),
        proxy_metrics,
    ));
    let inpod = (config.proxy_mode == ProxyMode::Shared).then(|| {
        readiness.register(READY_INPOD);
        let manager = InPodManager::new(config.clone(), Arc::new(proxy), &metrics);
        let status = manager.status();
        track_readiness(
            &mut tasks,
            readiness.clone(),
            READY_INPOD,
            status.snapshot_received(),
        );
        let drained = data_plane.spawn(manager.run(shutdown.clone().wait()));
        tasks.spawn(async move {
            if let Err(e) = drained.await {
                tracing::error!(error = %e, "in-pod manager task failed");
            }
        });
        status
    });

    let view = AdminView {
        config: config.clone(),
        state: state.clone(),
        certs: Some(Arc::new(certs)),
        shutdown: trigger,
        inpod,
        logging,
    };
    let admin_addr = admin.local_addr();
    let stats_addr = stats.local_addr();
    let readiness_addr = ready_server.local_addr();
    spawn_http(&mut tasks, admin, admin_router(view), &shutdown);
    spawn_http(
        &mut tasks,
        stats,
        metrics_router(metrics.clone()),
        &shutdown,
    );
    spawn_http(
        &mut tasks,
        ready_server,
        readiness_router(readiness.clone()),
        &shutdown,
    );
    tracing::info!(%admin_addr, %stats_addr, %readiness_addr, "ztunnel started");

    let done = tokio::spawn(async move {
        shutdown.wait().await;
        tracing::info!("draining");
        while tasks.join_next().await.is_some() {}
        tracing::info!("ztunnel stopped");
    });
    Ok(Running {
        admin_addr,
        stats_addr,
        readiness_addr,
        state,
        readiness,
        metrics,
        done,
    })
}

fn load_state(config: &Config) -> Result<SharedState, AppError> {
    let mut state = State::new();
    if let Some(path) = &config.local_xds_path {
        state.load_local_file(path)?;
        tracing::info!(path = %path.display(), "loaded local workload configuration");
    }
    Ok(SharedState::new(state))
}

fn start_xds(
    config: &Arc<Config>,
    state: &SharedState,
    readiness: &Readiness,
    shutdown: &Shutdown,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<(), AppError> {
    let Some(address) = &config.xds_address else {
        tracing::info!("XDS_ADDRESS is empty: no workload discovery, local configuration only");
        return Ok(());
    };
    readiness.register(READY_XDS);
    let self_info = &config.self_info;
    let node = NodeIdentity {
        ip: self_info
            .instance_ip
            .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string()),
        pod_name: self_info
            .pod_name
            .clone()
            .unwrap_or_else(|| "ztunnel".into()),
        pod_namespace: self_info
            .pod_namespace
            .clone()
            .unwrap_or_else(|| "istio-system".into()),
        cluster_domain: config.cluster_domain.clone(),
    };
    let xds = XdsClient::new(
        XdsConfig {
            root_cert_path: config.xds_root_cert.clone(),
            token_path: Some(config.auth_token.clone()),
            cluster_id: config.cluster_id.clone(),
            ..XdsConfig::new(address.clone(), node)
        },
        Arc::new(state.clone()),
    )?;
    track_readiness(tasks, readiness.clone(), READY_XDS, xds.ready());
    tasks.spawn(xds.run(shutdown.clone().wait()));
    Ok(())
}

fn start_certs(
    config: &Arc<Config>,
    state: &SharedState,
    readiness: &Readiness,
    shutdown: &Shutdown,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<CertManager, AppError> {
    let client = GrpcCaClient::new(CaClientConfig {
        root_cert_path: config.ca_root_cert.clone(),
        token_path: Some(config.auth_token.clone()),
        cluster_id: config.cluster_id.clone(),
        secret_ttl: config.secret_ttl,
        impersonate: config.proxy_mode == ProxyMode::Shared,
        ..CaClientConfig::new(config.ca_address.clone())
    })?;
    let certs = CertManager::new(Arc::new(client), CertManagerOptions::default());
    readiness.register(READY_CERTS);
    let (ready_tx, ready_rx) = watch::channel(false);
    let node = config.self_info.node_name.clone().unwrap_or_default();
    tasks.spawn(crate::certs::prefetch::run(
        state.clone(),
        certs.clone(),
        node,
        ready_tx,
        shutdown.clone().wait(),
    ));
    track_readiness(tasks, readiness.clone(), READY_CERTS, ready_rx);
    Ok(certs)
}

/// Marks `name` ready the first time `signal` is true.
fn track_readiness(
    tasks: &mut tokio::task::JoinSet<()>,
    readiness: Readiness,
    name: &'static str,
    mut signal: watch::Receiver<bool>,
) {
    tasks.spawn(async move {
        if signal.wait_for(|r| *r).await.is_ok() {
            tracing::info!(condition = name, "ready");
            readiness.mark_ready(name);
        }
    });
}

fn spawn_http(
    tasks: &mut tokio::task::JoinSet<()>,
    server: BoundServer,
    router: axum::Router,
    shutdown: &Shutdown,
) {
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        if let Err(e) = server.serve(router, shutdown).await {
            tracing::error!(error = %e, reason = e.reason(), "HTTP server failed");
        }
    });
}
