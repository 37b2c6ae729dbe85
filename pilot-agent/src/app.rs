//! Wires the agent together: certificate, SDS and xDS relay sockets, the bootstrap, the status
//! port, and Envoy under supervision; SIGTERM (or `/quitquitquit`) drains and stops it all.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mesh_certs::{CaClientConfig, CertManager, CertManagerOptions, GrpcCaClient, WorkloadCert};
use mesh_identity::Identity;
use mesh_runtime::http::BoundServer;
use mesh_runtime::metrics::Metrics;
use mesh_runtime::signal::{self, Shutdown, ShutdownTrigger};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::admin::EnvoyAdmin;
use crate::config::{self, Config};
use crate::{bootstrap, envoy, sds, status, telemetry, xds_proxy};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the proxy identity is invalid: {0}")]
    Identity(#[from] mesh_identity::IdentityError),
    #[error("cannot reach istiod: {0}")]
    Upstream(#[from] mesh_certs::CertError),
    #[error(transparent)]
    Envoy(#[from] envoy::EnvoyError),
    #[error("cannot serve the status port: {0}")]
    Status(#[from] mesh_runtime::http::HttpError),
}

impl AppError {
    pub fn reason(&self) -> &'static str {
        match self {
            AppError::Io { .. } => "io",
            AppError::Identity(_) => "identity",
            AppError::Upstream(e) => e.reason(),
            AppError::Envoy(e) => e.reason(),
            AppError::Status(e) => e.reason(),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AppError + '_ {
    move |source| AppError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A unix listener at `path`, replacing a stale socket file.
fn unix_listener(path: &Path) -> Result<UnixListener, AppError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    UnixListener::bind(path).map_err(io(path))
}

/// Runs the agent until shutdown.
pub async fn run(cfg: Config) -> Result<(), AppError> {
    let (trigger, shutdown) = signal::channel();
    let trigger = Arc::new(trigger);
    forward_signals(Arc::clone(&trigger)).map_err(io(Path::new("signal handlers")))?;
    let envoy_binary = envoy::find_envoy(cfg.envoy_path.as_deref())?;

    let labels = pod_labels(&cfg);
    let bootstrap_path = cfg.path(config::BOOTSTRAP_PATH);
    if let Some(dir) = bootstrap_path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let bootstrap = bootstrap::render(&cfg, &labels);
    std::fs::write(&bootstrap_path, format!("{bootstrap:#}")).map_err(io(&bootstrap_path))?;

    let certs = start_certificates(&cfg, shutdown.clone())?;
    let sds_listener = unix_listener(&cfg.path(config::SDS_SOCKET))?;
    let sds = sds::SdsServer::new(certs.clone()).into_service();
    tokio::spawn(serve_unix(sds_listener, sds, shutdown.clone(), "SDS"));

    let upstream = mesh_certs::grpc_channel(&cfg.discovery_address, &cfg.xds_root_ca)?;
    let (relay, xds_status) =
        xds_proxy::XdsProxy::new(upstream, cfg.token_path.clone(), cfg.cluster_id.clone());
    let xds_listener = unix_listener(&cfg.path(config::XDS_SOCKET))?;
    tokio::spawn(serve_unix(
        xds_listener,
        relay.into_service(),
        shutdown.clone(),
        "xDS",
    ));

    let metrics = Metrics::new();
    let telemetry_listener = unix_listener(&cfg.path(config::TELEMETRY_SOCKET))?;
    let local = telemetry::LocalWorkload::of(&cfg, &labels);
    let als = telemetry::AccessLogServer::new(telemetry::RequestMetrics::new(&metrics, local));
    tokio::spawn(serve_unix(
        telemetry_listener,
        als.into_service(),
        shutdown.clone(),
        "access log",
    ));

    let admin = EnvoyAdmin::new(config::ADMIN_PORT);
    let state = status::StatusState {
        admin: admin.clone(),
        xds: xds_status,
        certs,
        metrics,
        shutdown: Arc::clone(&trigger),
        app_probes: crate::app_probe::AppProbes {
            probers: Arc::new(cfg.app_probers.clone()),
            target: crate::app_probe::ProbeTarget::new(cfg.instance_ip, cfg.probe_localhost),
            status_port: config::STATUS_PORT,
        },
        app_metrics: (cfg.app_metrics.as_ref())
            .map(|m| (crate::admin::EnvoyAdmin::new(m.port), m.path.clone())),
    };
    let server =
        BoundServer::bind((std::net::Ipv4Addr::UNSPECIFIED, config::STATUS_PORT).into()).await?;
    let status_shutdown = shutdown.clone();
    let status_task = tokio::spawn(server.serve(status::router(state), status_shutdown));

    let args = envoy::args(&cfg, &bootstrap_path);
    envoy::supervise(
        envoy_binary,
        args,
        admin,
        cfg.termination_drain_duration,
        shutdown,
    )
    .await?;
    trigger.trigger();
    let _ = status_task.await;
    tracing::info!("pilot-agent stopped");
    Ok(())
}

fn forward_signals(trigger: Arc<ShutdownTrigger>) -> std::io::Result<()> {
    let signals = signal::on_signals()?;
    tokio::spawn(async move {
        signals.wait().await;
        trigger.trigger();
    });
    Ok(())
}

/// The pod's labels: `ISTIO_METAJSON_LABELS`, overlaid by the downward-API labels file.
fn pod_labels(cfg: &Config) -> std::collections::BTreeMap<String, String> {
    let mut labels: std::collections::BTreeMap<String, String> = cfg
        .metadata
        .get("LABELS")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    if let Ok(text) = std::fs::read_to_string(cfg.path(config::POD_LABELS_PATH)) {
        labels.extend(config::parse_pod_labels(&text));
    }
    labels
}

/// Fetches the proxy's certificate and keeps the newest one on a watch channel (rotated at half
/// life by the certificate manager).
fn start_certificates(cfg: &Config, shutdown: Shutdown) -> Result<sds::CertWatch, AppError> {
    let identity = Identity::new(&cfg.trust_domain, &cfg.pod_namespace, &cfg.service_account)?;
    let client = GrpcCaClient::new(CaClientConfig {
        address: cfg.ca_address.clone(),
        root_cert_path: cfg.ca_root_ca.clone(),
        token_path: Some(cfg.token_path.clone()),
        cluster_id: cfg.cluster_id.clone(),
        secret_ttl: cfg.secret_ttl,
        impersonate: false,
    })?;
    let manager = CertManager::new(Arc::new(client), CertManagerOptions::default());
    let (tx, rx) = watch::channel::<Option<Arc<WorkloadCert>>>(None);
    tokio::spawn(async move {
        let mut stop = std::pin::pin!(shutdown.wait());
        loop {
            match manager.fetch_certificate(&identity).await {
                Ok(cert) => {
                    let changed = tx.borrow().as_ref().is_none_or(|c| c.serial != cert.serial);
                    if changed {
                        tracing::info!(%identity, serial = %cert.serial, "workload certificate ready");
                        tx.send_replace(Some(cert));
                    }
                }
                Err(e) => {
                    tracing::warn!(%identity, reason = e.reason(), error = %e, "no workload certificate yet")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = &mut stop => return,
            }
        }
    });
    Ok(rx)
}

/// Serves a gRPC service on a unix socket until shutdown.
async fn serve_unix<S>(listener: UnixListener, service: S, shutdown: Shutdown, what: &'static str)
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let result = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.wait())
        .await;
    if let Err(e) = result {
        tracing::error!(server = what, error = %e, "unix-socket gRPC server failed");
    }
}
