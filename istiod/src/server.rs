//! Wires istiod together: source -> debounce/model -> snapshots -> xDS (15010, 15012), CA
//! (15012), debug (8080) and metrics (15014), with graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_identity::{CaOptions, CaSource, CertificateAuthority};
use mesh_runtime::http::{metrics_router, BoundServer};
use mesh_runtime::metrics::Metrics;
use mesh_runtime::readiness::Readiness;
use mesh_runtime::signal::{self, Shutdown, ShutdownTrigger};
use mesh_source::{
    ClusterSource, DirectoryOptions, DirectorySource, KubeOptions, KubeSource, SourceEvent,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::auth::{Authenticator, RequireAuth, TokenFileAuthenticator, TokenReviewAuthenticator};
use crate::ca::{CaService, NodeLocator};
use crate::config::Config;
use crate::connection_age::AgedIo;
use crate::debug::{self, DebugViews};
use crate::live_ca::{watch_cacerts, LiveCa, ReloadStats};
use crate::metrics::{CaCollector, CaReloadCollector, KubeSourceCollector, PushMetrics};
use crate::model::{Model, ModelConfig, Snapshot};
use crate::push::{self, DebounceConfig, ModelEvent};
use crate::serving_tls::{tls_incoming, ServingCerts, ServingTlsError};
use crate::xds::{XdsMetrics, XdsServer};

/// Where the root certificate is published in the state directory.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
/// How long shutdown waits for connections to drain before closing them.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// How many recent source errors `/debug/configz` shows.
const KEPT_SOURCE_ERRORS: usize = 100;

/// Why istiod could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("certificate authority: {0}")]
    Ca(#[from] mesh_identity::CaError),
    #[error("tokens: {0}")]
    Auth(#[from] crate::auth::AuthError),
    #[error("cannot listen on {addr}: {source} (is another istiod running?)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Http(#[from] mesh_runtime::http::HttpError),
    #[error(transparent)]
    Inject(#[from] crate::inject::InjectConfigError),
    #[error("webhook server on {addr}: {source}")]
    Webhook {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC server on {addr}: {source}")]
    Grpc {
        addr: SocketAddr,
        source: tonic::transport::Error,
    },
    #[error(transparent)]
    ServingTls(#[from] ServingTlsError),
    #[error("cannot create state directory {path}: {source}")]
    StateDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("Kubernetes API: {0}")]
    Kube(String),
    #[error("cannot start the CA's signing threads: {0}")]
    SigningPool(#[source] std::io::Error),
    #[error("the cluster's CA root: {0}")]
    CaSecret(#[from] crate::kube::ca_secret::CaSecretError),
}

impl ServerError {
    pub fn reason(&self) -> &'static str {
        match self {
            ServerError::Config(_) => "config",
            ServerError::Ca(_) => "ca",
            ServerError::Auth(_) => "auth",
            ServerError::Inject(_) => "inject",
            ServerError::Bind { .. } => "bind",
            ServerError::Http(_) => "http",
            ServerError::Grpc { .. } => "grpc",
            ServerError::Webhook { .. } => "webhook",
            ServerError::StateDir { .. } => "state_dir",
            ServerError::Kube(_) => "kube",
            ServerError::SigningPool(_) => "signing_pool",
            ServerError::CaSecret(e) => e.reason(),
            ServerError::ServingTls(e) => e.reason(),
        }
    }
}

/// A running istiod (also used in-process by tests).
#[derive(Debug)]
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub secure_grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub monitoring_addr: SocketAddr,
    /// The validating webhook (TLS).
    pub webhook_addr: SocketAddr,
    /// PEM of the roots at start.
    pub root_cert_pem: String,
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    trigger: ShutdownTrigger,
    tasks: JoinSet<Result<(), ServerError>>,
}

impl Running {
    /// Requests shutdown and waits for every server to drain (at most [`DRAIN_DEADLINE`], then
    /// remaining connections are closed).
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        self.trigger.trigger();
        match tokio::time::timeout(DRAIN_DEADLINE, self.wait()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(deadline = ?DRAIN_DEADLINE, "drain deadline passed; closing remaining connections");
                self.tasks.abort_all();
                self.wait().await
            }
        }
    }

    /// Waits until every task ends (after shutdown), returning the first error.
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        let mut result = Ok(());
        while let Some(r) = self.tasks.join_next().await {
            match r {
                Ok(Err(e)) if result.is_ok() => result = Err(e),
                Err(e) if !e.is_cancelled() => tracing::error!(error = %e, "istiod task panicked"),
                _ => {}
            }
        }
        result
    }

    /// Requests shutdown without waiting.
    pub fn trigger_shutdown(&self) {
        self.trigger.trigger();
    }
}

/// The CA's node check reads the current snapshot.
struct SnapshotLocator(watch::Receiver<Arc<Snapshot>>);

impl NodeLocator for SnapshotLocator {
    fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.0
            .borrow()
            .identity_on_node(node, namespace, service_account)
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<crate::model::PodFacts> {
        self.0.borrow().pod(namespace, name).cloned()
    }
}

/// Binds a listener with the kernel's largest accept queue (`net.core.somaxconn`), as Go's
/// listeners (and so Istio's istiod) do. tokio's default of 1,024 overflows when a thousand
/// proxies reconnect at once while istiod is busy sending initial configurations: the kernel
/// then drops handshakes and falls back to SYN cookies, and some connections are reset.
fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    let err = |source| ServerError::Bind { addr, source };
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(err)?;
    // As `TcpListener::bind`: a restarted istiod binds again while old connections linger.
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(listen_backlog()).map_err(err)
}

/// `net.core.somaxconn`, or 4,096 (the kernel's default since 5.4) when it cannot be read.
fn listen_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(4096)
}

fn local(l: &TcpListener, fallback: SocketAddr) -> SocketAddr {
    l.local_addr().unwrap_or(fallback)
}

/// Starts every part of istiod and returns once all listeners are bound.
pub async fn start(mut config: Config) -> Result<Running, ServerError> {
    config.validate()?;
    std::fs::create_dir_all(&config.state_dir).map_err(|source| ServerError::StateDir {
        path: config.state_dir.clone(),
        source,
    })?;
    let (trigger, shutdown) = signal::channel();
    let readiness = Readiness::new();
    readiness.register("config synced");
    let metrics = Metrics::new();
    let mut tasks = JoinSet::new();

    // On Kubernetes, one API client for the source, the CA's token reviews and the writers;
    // the mesh config's fields go over the flags before the CA and the model start.
    let kube = match &config.config_dir {
        Some(_) => None,
        None => Some(kube_client(config.kubeconfig.as_deref()).await?),
    };
    let flags = model_config(&config);
    if let Some(client) = &kube {
        apply_mesh_config(client, &mut config).await;
    }

    let ca_options = CaOptions {
        trust_domain: config.trust_domain.clone(),
        max_ttl: config.max_workload_cert_ttl,
        ..CaOptions::default()
    };
    // On a cluster a self-signed root lives in the Secret istio-ca-secret, shared by every
    // replica and restart; a plugged-in CA (cacerts with ca-key.pem) needs none.
    let plugged_in = config
        .cacerts_dir
        .as_deref()
        .is_some_and(|dir| dir.join(mesh_identity::ca::CA_KEY_FILE).exists());
    if let (Some(client), false) = (&kube, plugged_in) {
        crate::kube::ca_secret::sync(
            client,
            &config.pod_namespace,
            &config.state_dir,
            &ca_options,
        )
        .await?;
    }
    let loaded = CertificateAuthority::load(
        config.cacerts_dir.as_deref(),
        &config.state_dir,
        ca_options.clone(),
    )?;
    let root_file = config.state_dir.join(ROOT_CERT_FILE);
    loaded.write_root_cert(&root_file)?;
    tracing::info!(source = ?loaded.source(), root = %root_file.display(), "certificate authority ready");
    let plugged_in = match loaded.source() {
        CaSource::PluggedIn { dir } => Some(dir.clone()),
        CaSource::SelfSigned { .. } => None,
    };
    let ca = LiveCa::new(Arc::new(loaded));
    let reload_stats = Arc::new(ReloadStats::default());
    if let Some(dir) = plugged_in {
        let watch = watch_cacerts(
            ca.clone(),
            dir,
            ca_options,
            config.cacerts_poll,
            reload_stats.clone(),
        );
        tasks.spawn(until_shutdown(shutdown.clone(), watch));
        tasks.spawn(until_shutdown(
            shutdown.clone(),
            publish_root_file(ca.clone(), root_file),
        ));
    }
    metrics.register(|r| r.register_collector(Box::new(CaReloadCollector(reload_stats))));
    let authenticator: Arc<dyn Authenticator> = match (&config.tokens_file, &kube) {
        (Some(file), _) => Arc::new(TokenFileAuthenticator::new(file)?),
        (None, Some(client)) => Arc::new(TokenReviewAuthenticator::new(
            client.clone(),
            config
                .token_audiences
                .iter()
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect(),
            &config.trust_domain,
        )),
        (None, None) => {
            return Err(ServerError::Config(crate::config::ConfigError::Invalid(
                "no way to authenticate callers: give --tokens-file".into(),
            )))
        }
    };

    let mut pipeline = JoinSet::new();
    let (snapshots, source_errors) = start_pipeline(
        &config,
        &flags,
        kube.clone(),
        &metrics,
        &readiness,
        &mut pipeline,
    );
    tasks.spawn(supervise_pipeline(pipeline, shutdown.clone()));
    if let Some(client) = &kube {
        let controllers = crate::kube::Controllers {
            client: client.clone(),
            identity: config.pod_name.clone(),
            namespace: config.pod_namespace.clone(),
            revision: config.revision.clone(),
            leader_election: config.enable_leader_election,
            roots: ca.roots(),
            status: config.ambient_enable_status.then(|| {
                (
                    snapshots.clone(),
                    metrics.register(crate::metrics::register_status_writes),
                )
            }),
        };
        let sd = shutdown.clone();
        tasks.spawn(async move {
            controllers.run(sd).await;
            Ok(())
        });
    }

    let xds = XdsServer::new(snapshots.clone())
        .with_push_throttle(match config.push_throttle {
            0 => crate::xds::default_push_throttle(),
            n => n,
        })
        .with_push_bytes(match config.push_bytes_in_flight {
            0 => crate::xds::DEFAULT_PUSH_BYTES,
            n => n,
        })
        .with_metrics(metrics.register(XdsMetrics::register));
    let ca_service = CaService::new(
        ca.clone(),
        authenticator.clone(),
        Arc::new(SnapshotLocator(snapshots.clone())),
        config.cluster_id.clone(),
    )
    .with_trusted_node_accounts(
        crate::ca::parse_node_accounts(&config.ca_trusted_node_accounts)
            .map_err(|e| ServerError::Config(crate::config::ConfigError::Invalid(e)))?,
    )
    .with_signing_pool(
        // One thread per core: a storm then signs on every core when nothing else runs.
        crate::signing_pool::SigningPool::start(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            crate::signing_pool::SIGNING_NICE,
        )
        .map_err(ServerError::SigningPool)?,
    );
    metrics.register(|r| r.register_collector(Box::new(CaCollector(ca_service.stats()))));

    let grpc = bind(config.grpc_addr)?;
    let secure = bind(config.secure_grpc_addr)?;
    let grpc_addr = local(&grpc, config.grpc_addr);
    let secure_grpc_addr = local(&secure, config.secure_grpc_addr);
    let keepalive = Keepalive::of(&config);
    tasks.spawn(serve_plaintext(
        GrpcListener {
            listener: grpc,
            addr: grpc_addr,
            keepalive,
        },
        xds.clone(),
        shutdown.clone(),
    ));
    let serving = ServingCerts::new(
        ca.clone(),
        config.serving_dns_names.clone(),
        config.serving_ips.clone(),
    )?;
    let tls = serving.server_config()?;
    let webhook_tls = serving.server_config_with_alpn(vec![b"http/1.1".to_vec()])?;
    // Renew istiod's own certificate at half-life (and with a new CA) until shutdown.
    tasks.spawn(until_shutdown(shutdown.clone(), serving.renew_forever()));
    tasks.spawn(serve_secure(
        GrpcListener {
            listener: secure,
            addr: secure_grpc_addr,
            keepalive,
        },
        tls,
        xds.clone(),
        ca_service,
        authenticator,
        shutdown.clone(),
    ));

    let views = DebugViews {
        syncz: {
            let xds = xds.clone();
            Arc::new(move || xds.syncz())
        },
        configz: {
            let snaps = snapshots.clone();
            Arc::new(move || {
                let mut v = snaps.borrow().debug_json();
                let errs: Vec<String> = source_errors.lock().map(|e| e.clone()).unwrap_or_default();
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("sourceErrors".into(), serde_json::json!(errs));
                }
                v
            })
        },
        config: serde_json::to_value(&config).unwrap_or_default(),
    };
    let http = BoundServer::bind(config.http_addr).await?;
    let monitoring = BoundServer::bind(config.monitoring_addr).await?;
    let http_addr = http.local_addr();
    let monitoring_addr = monitoring.local_addr();
    let webhook = bind(config.webhook_addr)?;
    let webhook_addr = local(&webhook, config.webhook_addr);
    let listener = crate::webhook::TlsListener {
        incoming: tls_incoming(webhook, webhook_tls),
        addr: webhook_addr,
    };
    let injector = Arc::new(crate::inject::load(&config)?);
    let sd = shutdown.clone();
    tasks.spawn(async move {
        tracing::info!(addr = %webhook_addr, "validating and injection webhooks (TLS) listening");
        axum::serve(listener, crate::webhook::router(injector))
            .with_graceful_shutdown(sd.wait())
            .await
            .map_err(|source| ServerError::Webhook {
                addr: webhook_addr,
                source,
            })
    });
    let debug_router = debug::router(views, readiness.clone());
    let sd = shutdown.clone();
    tasks.spawn(async move { Ok(http.serve(debug_router, sd).await?) });
    let (metrics_r, sd) = (metrics_router(metrics.clone()), shutdown.clone());
    tasks.spawn(async move { Ok(monitoring.serve(metrics_r, sd).await?) });

    tracing::info!(%grpc_addr, %secure_grpc_addr, %http_addr, %monitoring_addr, "istiod started");
    Ok(Running {
        grpc_addr,
        secure_grpc_addr,
        http_addr,
        monitoring_addr,
        webhook_addr,
        root_cert_pem: ca.root_cert_pem(),
        snapshots,
        trigger,
        tasks,
    })
}

/// Runs `work` until shutdown.
async fn until_shutdown(
    shutdown: Shutdown,
    work: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    tokio::select! {
        _ = shutdown.wait() => {}
        _ = work => {}
    }
    Ok(())
}

/// Rewrites the root file in the state directory whenever the roots change.
async fn publish_root_file(ca: Arc<LiveCa>, path: std::path::PathBuf) {
    let mut roots = ca.roots();
    while roots.changed().await.is_ok() {
        match ca.current().write_root_cert(&path) {
            Ok(()) => tracing::info!(path = %path.display(), "published the new roots"),
            Err(e) => tracing::error!(error = %e, "cannot publish the new roots"),
        }
    }
}

type SourceErrors = Arc<Mutex<Vec<String>>>;

/// Runs the source/model pipeline until shutdown, then stops it: the snapshot channel closes,
/// which ends every xDS stream so that the gRPC servers can drain.
async fn supervise_pipeline(
    mut pipeline: JoinSet<Result<(), ServerError>>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(r) = pipeline.join_next() => {
                // The pipeline never ends on its own; if a part does, say so and keep serving
                // the last snapshot until shutdown.
                let detail = match r {
                    Ok(Ok(())) => "finished".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                tracing::error!(%detail, "config pipeline task ended; serving the last snapshot");
            }
        }
    }
    pipeline.abort_all();
    while pipeline.join_next().await.is_some() {}
    Ok(())
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, ServerError> {
    mesh_kube::client(kubeconfig)
        .await
        .map_err(|e| ServerError::Kube(e.to_string()))
}

/// Source -> (adapter) -> debounce/model -> watch channel of snapshots.
fn start_pipeline(
    config: &Config,
    flags: &ModelConfig,
    kube: Option<kube::Client>,
    metrics: &Metrics,
    readiness: &Readiness,
    tasks: &mut JoinSet<Result<(), ServerError>>,
) -> (watch::Receiver<Arc<Snapshot>>, SourceErrors) {
    let (src_tx, mut src_rx) = mpsc::channel::<SourceEvent>(1024);
    let (ev_tx, ev_rx) = mpsc::channel::<ModelEvent>(1024);
    let (snap_tx, snap_rx) = watch::channel(Snapshot::empty());
    let push_metrics = metrics.register(PushMetrics::register);
    let errors: SourceErrors = Arc::default();

    let source: Option<Box<dyn ClusterSource>> = match (config.config_dir.clone(), kube) {
        (Some(dir), _) => Some(Box::new(DirectorySource::new(
            dir,
            DirectoryOptions::default(),
        ))),
        (None, None) => None,
        (None, Some(client)) => {
            tasks.spawn({
                let (client, events) = (client.clone(), ev_tx.clone());
                let name = crate::mesh_config::configmap_name(&config.revision);
                let namespace = config.pod_namespace.clone();
                let (base, current) = (flags.clone(), model_config(config));
                async move {
                    crate::mesh_config::watch(client, namespace, name, base, current, events).await;
                    Ok(())
                }
            });
            let source = KubeSource::new(client, KubeOptions::default());
            let stats = source.stats();
            metrics.register(|r| r.register_collector(Box::new(KubeSourceCollector(stats))));
            Some(Box::new(source))
        }
    };
    tasks.spawn(async move {
        let Some(source) = source else {
            return Ok(());
        };
        source.run(src_tx).await;
        Ok(())
    });
    let (pm, errs) = (push_metrics.clone(), errors.clone());
    tasks.spawn(async move {
        while let Some(ev) = src_rx.recv().await {
            let ev = match ev {
                SourceEvent::Applied(o) => {
                    pm.record_event(o.kind().as_str(), "apply");
                    ModelEvent::Applied(o)
                }
                SourceEvent::Deleted(k) => {
                    pm.record_event(k.kind.as_str(), "delete");
                    ModelEvent::Deleted(k)
                }
                SourceEvent::Synced => ModelEvent::Synced,
                SourceEvent::Invalid(e) => {
                    tracing::warn!(error = %e, "invalid configuration ignored; the rest still applies");
                    pm.record_config_error(e.reason());
                    if let Ok(mut list) = errs.lock() {
                        if list.len() >= KEPT_SOURCE_ERRORS {
                            list.remove(0);
                        }
                        list.push(e.to_string());
                    }
                    continue;
                }
            };
            if ev_tx.send(ev).await.is_err() {
                break;
            }
        }
        Ok(())
    });
    let model = Model::new(model_config(config));
    let debounce = DebounceConfig {
        after: config.debounce_after,
        max: config.debounce_max,
    };
    let ready = readiness.clone();
    let snap_watch = snap_rx.clone();
    tasks.spawn(async move {
        push::run(model, debounce, ev_rx, snap_tx, move |stats| {
            let errors = snap_watch.borrow().errors().len();
            push_metrics.record_push(stats, errors);
            if stats.initial {
                ready.mark_ready("config synced");
            }
        })
        .await;
        Ok(())
    });
    (snap_rx, errors)
}

/// The model's settings from istiod's configuration.
fn model_config(config: &Config) -> ModelConfig {
    ModelConfig {
        cluster_id: config.cluster_id.clone(),
        trust_domain: config.trust_domain.clone(),
        domain_suffix: config.domain_suffix.clone(),
        root_namespace: config.root_namespace.clone(),
        access_log_file: config.access_log_file.clone(),
        network: config.network.clone(),
        sending_hbone: config.enable_sending_hbone,
        sidecar_listening_hbone: config.enable_sidecar_listening_hbone,
        outbound_registry_only: config.outbound_registry_only,
    }
}

/// How long start-up waits for the mesh config before going on with the flags (the watcher
/// applies it later).
const MESH_CONFIG_WAIT: Duration = Duration::from_secs(5);

/// Puts the mesh config's fields over the flags in `config`.
async fn apply_mesh_config(client: &kube::Client, config: &mut Config) {
    let name = crate::mesh_config::configmap_name(&config.revision);
    let read = crate::mesh_config::read(client, &config.pod_namespace, &name);
    let mesh = match tokio::time::timeout(MESH_CONFIG_WAIT, read).await {
        Ok(Ok(Some(mesh))) => mesh,
        Ok(Ok(None)) => {
            tracing::info!(configmap = %format!("{}/{name}", config.pod_namespace), "no mesh config; using the flags");
            return;
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "mesh config not applied at start; using the flags");
            return;
        }
        Err(_) => {
            tracing::warn!("the API server did not answer for the mesh config in time; using the flags until it does");
            return;
        }
    };
    let cfg = mesh.over(&model_config(config));
    tracing::info!(trust_domain = %cfg.trust_domain, root_namespace = %cfg.root_namespace, access_log_file = %cfg.access_log_file, "mesh config applied");
    config.trust_domain = cfg.trust_domain;
    config.root_namespace = cfg.root_namespace;
    config.access_log_file = cfg.access_log_file;
    config.outbound_registry_only = cfg.outbound_registry_only;
}

/// Accepted connections with TCP_NODELAY (small xDS deltas must not wait for Nagle) and TCP
/// keepalive, so that dead proxies are noticed.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(crate::serving_tls::TCP_KEEPALIVE))
}

/// The gRPC servers' connection keepalive (`--keepalive*`, as Istio's).
#[derive(Debug, Clone, Copy)]
struct Keepalive {
    interval: Duration,
    timeout: Duration,
    max_age: Option<Duration>,
}

/// How long calls in flight may go on after a connection's maximum age sent GOAWAY (Istio's
/// default; it has no flag). Then the connection is closed ([`AgedIo`]).
const MAX_AGE_GRACE: Duration = Duration::from_secs(10);

impl Keepalive {
    fn of(config: &Config) -> Keepalive {
        Keepalive {
            interval: config.keepalive_interval,
            timeout: config.keepalive_timeout,
            // 0 is "never", as gRPC's servers read it.
            max_age: config
                .keepalive_max_server_connection_age
                .filter(|age| !age.is_zero()),
        }
    }

    /// A gRPC server that PINGs its connections and closes them when a PING goes unanswered,
    /// and sends GOAWAY at the maximum age.
    fn server(self) -> Server {
        let server = Server::builder()
            .http2_keepalive_interval(Some(self.interval))
            .http2_keepalive_timeout(Some(self.timeout));
        match self.max_age {
            Some(age) => server.max_connection_age(age),
            None => server,
        }
    }

    /// An accepted connection, closed at the maximum age plus the grace plus up to a tenth of
    /// the age at random: connections opened together (after an istiod rollout) then reconnect
    /// spread out, as gRPC-Go spreads its ages by a tenth.
    fn aged<T>(self, io: T) -> AgedIo<T> {
        let spread = rand::random_range(0.0..0.1);
        AgedIo::new(
            io,
            self.max_age
                .map(|age| age + MAX_AGE_GRACE + age.mul_f64(spread)),
        )
    }
}

/// A gRPC port: its socket, its address and its connections' keepalive.
struct GrpcListener {
    listener: TcpListener,
    addr: SocketAddr,
    keepalive: Keepalive,
}

async fn serve_plaintext(
    GrpcListener {
        listener,
        addr,
        keepalive,
    }: GrpcListener,
    xds: XdsServer<Snapshot>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    tracing::info!(%addr, "xDS (plaintext) listening");
    keepalive
        .server()
        .add_service(xds.into_service())
        .serve_with_incoming_shutdown(
            incoming(listener).map(move |io| io.map(|io| keepalive.aged(io))),
            shutdown.wait(),
        )
        .await
        .map_err(|source| ServerError::Grpc { addr, source })
}

async fn serve_secure(
    GrpcListener {
        listener,
        addr,
        keepalive,
    }: GrpcListener,
    tls: rustls::ServerConfig,
    xds: XdsServer<Snapshot>,
    ca: CaService,
    authenticator: Arc<dyn Authenticator>,
    shutdown: Shutdown,
) -> Result<(), ServerError> {
    tracing::info!(%addr, "xDS and CA (TLS) listening");
    let xds = RequireAuth::new(xds.into_service(), authenticator);
    let incoming = tokio_stream::wrappers::ReceiverStream::new(tls_incoming(listener, tls))
        .map(move |io| io.map(|io| keepalive.aged(io)));
    keepalive
        .server()
        .add_service(xds)
        .add_service(ca.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown.wait())
        .await
        .map_err(|source| ServerError::Grpc { addr, source })
}
