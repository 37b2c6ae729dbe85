//! waypoint-controller binary: watches a config directory (the same one istiod reads), or the
//! Kubernetes API, and keeps every waypoint Gateway's ServiceAccount, Deployment, Service and
//! status there.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ipnet::Ipv4Net;
use mesh_kube::{LeaderElection, LockKind};
use mesh_source::{DirectoryOptions, DirectorySource, DirectoryWriter, KubeSource, KubeWriter};
use tracing::{info, warn};
use waypoint_controller::render::{MANAGED_LABEL, MANAGED_VALUE};
use waypoint_controller::run::run as control;
use waypoint_controller::{
    kube_watches, ControllerOptions, RenderOptions, DEPLOYMENT_LOCK_PREFIX, FIELD_MANAGER,
};

#[derive(Parser, Debug)]
#[command(
    name = "waypoint-controller",
    about = "Deploys waypoints for Gateways of class istio-waypoint"
)]
struct Args {
    /// The directory of cluster objects (istiod's --config-dir). Without it the controller
    /// works on the Kubernetes API: --kubeconfig, else the in-cluster configuration.
    #[arg(long, env = "ISTIOD_CONFIG_DIR", conflicts_with = "kubeconfig")]
    config_dir: Option<PathBuf>,
    /// A kubeconfig file naming the API server to work on.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// This replica's holder identity in the leader lock.
    #[arg(long, env = "POD_NAME", default_value = "waypoint-controller")]
    pod_name: String,
    /// Where the leader lock lives.
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    pod_namespace: String,
    /// Subdirectory of --config-dir the controller's own objects are written to.
    #[arg(
        long,
        env = "WAYPOINT_OUTPUT_SUBDIR",
        default_value = "waypoint-controller"
    )]
    output_subdir: String,
    /// Range the waypoint Services' ClusterIPs are taken from in the directory mode (a
    /// directory has no API server to allocate them).
    #[arg(long, env = "SERVICE_CIDR", default_value = "10.96.0.0/16")]
    service_cidr: Ipv4Net,
    /// Image registry and tag of the proxy image (`<hub>/proxyv2:<tag>`).
    #[arg(long, env = "HUB", default_value = "localhost/mesh")]
    hub: String,
    #[arg(long, env = "TAG", default_value = env!("CARGO_PKG_VERSION"))]
    tag: String,
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// istiod's xDS and CA address as the waypoint pods reach it.
    #[arg(
        long,
        env = "DISCOVERY_ADDRESS",
        default_value = "istiod.istio-system.svc:15012"
    )]
    discovery_address: String,
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    #[arg(long, env = "REVISION", default_value = "default")]
    revision: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = mesh_runtime::telemetry::init() {
        eprintln!("waypoint-controller: {e}");
        return ExitCode::from(2);
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("waypoint-controller: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    info!(?args, "waypoint-controller starting");
    let mut opts = ControllerOptions {
        render: RenderOptions {
            hub: args.hub,
            tag: args.tag,
            cluster_domain: args.cluster_domain,
            discovery_address: args.discovery_address,
            cluster_id: args.cluster_id,
            trust_domain: args.trust_domain,
            revision: args.revision.clone(),
            ..RenderOptions::default()
        },
        service_cidr: Some(args.service_cidr),
    };
    let shutdown = mesh_runtime::signal::on_signals().context("installing signal handlers")?;
    if let Some(dir) = args.config_dir {
        let writer = DirectoryWriter::new(&dir, &args.output_subdir);
        let source = DirectorySource::new(&dir, DirectoryOptions::default());
        return Ok(control(Box::new(source), writer, opts, shutdown.wait()).await?);
    }
    // The API server allocates ClusterIPs.
    opts.service_cidr = None;
    let client = mesh_kube::client(args.kubeconfig.as_deref()).await?;
    let lock = format!("{DEPLOYMENT_LOCK_PREFIX}{}", args.revision);
    let election = LeaderElection::new(
        client.clone(),
        LockKind::Lease,
        &args.pod_namespace,
        &lock,
        &args.pod_name,
    )
    .with_holder_key(&args.revision);
    let work = move || {
        let (client, opts) = (client.clone(), opts.clone());
        async move {
            let source = KubeSource::new(client.clone(), kube_watches());
            let writer = KubeWriter::new(client, FIELD_MANAGER, (MANAGED_LABEL, MANAGED_VALUE));
            // Runs until leadership ends (the election aborts it); a source that stops is
            // logged, and the next leadership starts afresh.
            if let Err(e) = control(Box::new(source), writer, opts, std::future::pending()).await {
                warn!(error = %e, "waypoint controller stopped");
            }
        }
    };
    election.run(work, shutdown.wait()).await;
    Ok(())
}
