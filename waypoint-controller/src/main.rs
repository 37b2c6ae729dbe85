//! waypoint-controller binary: watches a config directory (the same one istiod reads) and
//! keeps every waypoint Gateway's ServiceAccount, Deployment, Service and status in it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::Parser;
use ipnet::Ipv4Net;
use mesh_source::{ClusterSource, DirectoryOptions, DirectorySource, DirectoryWriter};
use tracing::{info, warn};
use waypoint_controller::{Controller, ControllerOptions, RenderOptions};

#[derive(Parser, Debug)]
#[command(
    name = "waypoint-controller",
    about = "Deploys waypoints for Gateways of class istio-waypoint"
)]
struct Args {
    /// The directory of cluster objects (istiod's --config-dir).
    #[arg(long, env = "ISTIOD_CONFIG_DIR")]
    config_dir: PathBuf,
    /// Subdirectory of --config-dir the controller's own objects are written to.
    #[arg(
        long,
        env = "WAYPOINT_OUTPUT_SUBDIR",
        default_value = "waypoint-controller"
    )]
    output_subdir: String,
    /// Range the waypoint Services' ClusterIPs are taken from (a directory has no API server
    /// to allocate them).
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

/// Quiet time after the last change before a reconcile pass.
const DEBOUNCE: Duration = Duration::from_millis(30);

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
    let opts = ControllerOptions {
        render: RenderOptions {
            hub: args.hub,
            tag: args.tag,
            cluster_domain: args.cluster_domain,
            discovery_address: args.discovery_address,
            cluster_id: args.cluster_id,
            trust_domain: args.trust_domain,
            revision: args.revision,
            ..RenderOptions::default()
        },
        service_cidr: Some(args.service_cidr),
    };
    let writer = DirectoryWriter::new(&args.config_dir, &args.output_subdir);
    let mut controller = Controller::new(writer, opts);
    let source = DirectorySource::new(&args.config_dir, DirectoryOptions::default());
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(Box::new(source).run(tx));
    let shutdown = mesh_runtime::signal::on_signals().context("installing signal handlers")?;
    let stopped = shutdown.wait();
    tokio::pin!(stopped);
    let mut synced = false;
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            () = &mut stopped => return Ok(()),
        };
        let Some(event) = event else {
            anyhow::bail!("the directory source stopped");
        };
        synced |= matches!(event, mesh_source::SourceEvent::Synced);
        let mut changed = controller.observe(event);
        // Take the rest of the burst before reconciling.
        while let Ok(Some(event)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
            synced |= matches!(event, mesh_source::SourceEvent::Synced);
            changed |= controller.observe(event);
        }
        if !synced || !changed {
            continue;
        }
        let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let report = controller.reconcile(&now);
        for e in &report.errors {
            warn!("{e}");
        }
        if !report.applied.is_empty() || !report.deleted.is_empty() || !report.statuses.is_empty() {
            info!(
                applied = report.applied.len(),
                deleted = report.deleted.len(),
                statuses = report.statuses.len(),
                skipped = report.skipped.len(),
                "reconciled"
            );
        }
    }
}
