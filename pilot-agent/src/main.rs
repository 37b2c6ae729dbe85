//! pilot-agent binary: `pilot-agent proxy <waypoint|sidecar|router> [flags]` and `pilot-agent
//! istio-iptables [flags]` (the sidecar's capture init step), as Istio's.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pilot_agent::config::{Config, ProxyArgs, ProxyType};
use pilot_agent::iptables::IptablesArgs;
use pilot_agent::wait::WaitArgs;

#[derive(Parser)]
#[command(
    name = "pilot-agent",
    about = "Runs Envoy for a mesh proxy (waypoint or sidecar)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The agent's log levels in Istio's form (`default:info`, `info`, `xds:debug,default:warn`);
    /// `RUST_LOG`, when set, wins.
    #[arg(long = "log_output_level", global = true)]
    log_output_level: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the proxy: writes Envoy's bootstrap, serves SDS and xDS to it, supervises it.
    Proxy {
        #[arg(value_enum)]
        kind: ProxyType,
        /// DNS domain suffix, e.g. `shop.svc.cluster.local`.
        #[arg(long)]
        domain: Option<String>,
        /// Service cluster, e.g. `waypoint.shop`.
        #[arg(long = "serviceCluster")]
        service_cluster: Option<String>,
        /// Envoy's log level.
        #[arg(long = "proxyLogLevel")]
        proxy_log_level: Option<String>,
        /// Envoy's per-component log levels (`misc:error`).
        #[arg(long = "proxyComponentLogLevel")]
        proxy_component_log_level: Option<String>,
        /// Envoy worker threads.
        #[arg(long)]
        concurrency: Option<u32>,
    },
    /// Writes (or checks, or removes) a sidecar pod's traffic capture, as Istio's init step.
    #[command(name = "istio-iptables")]
    IstioIptables(Box<IptablesArgs>),
    /// Waits until the proxy is ready (the app containers' postStart hook).
    Wait(WaitArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let istio_levels = cli.log_output_level.as_deref();
    let filter = istio_levels.and_then(pilot_agent::config::rust_log_filter);
    if let Some(filter) = &filter {
        if std::env::var_os("RUST_LOG").is_none() {
            std::env::set_var("RUST_LOG", filter);
        }
    }
    if let Err(e) = mesh_runtime::telemetry::init() {
        eprintln!("pilot-agent: {e}");
        return ExitCode::from(2);
    }
    if let (Some(levels), None) = (istio_levels, &filter) {
        tracing::warn!(levels, "--log_output_level names no level for the default scope (none, error, warn, info or debug); keeping the default");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (kind, args) = match cli.command {
        Command::Proxy {
            kind,
            domain,
            service_cluster,
            proxy_log_level,
            proxy_component_log_level,
            concurrency,
        } => (
            kind,
            ProxyArgs {
                domain,
                service_cluster,
                proxy_log_level,
                proxy_component_log_level,
                concurrency,
            },
        ),
        Command::IstioIptables(args) => return istio_iptables(&args),
        Command::Wait(args) => return wait(&args),
    };
    let root = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let config = match Config::from_vars(
        kind,
        &args,
        vars.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        root,
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(reason = e.reason(), "{e}");
            eprintln!("pilot-agent: {e}");
            return ExitCode::from(2);
        }
    };
    match serde_json::to_string(&config) {
        Ok(json) => tracing::info!(config = %json, "starting pilot-agent"),
        Err(e) => tracing::warn!(error = %e, "cannot render the configuration"),
    }
    block_on("pilot-agent", async {
        pilot_agent::app::run(config).await.map_err(|e| {
            tracing::error!(reason = e.reason(), "pilot-agent failed: {e}");
            e.to_string()
        })
    })
}

/// Runs `work` on a current-thread runtime; an error is printed after `what`.
fn block_on(what: &str, work: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{what}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{what}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn istio_iptables(args: &IptablesArgs) -> ExitCode {
    match pilot_agent::iptables::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(reason = e.reason(), "istio-iptables failed: {e}");
            eprintln!("pilot-agent istio-iptables: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn wait(args: &WaitArgs) -> ExitCode {
    block_on("pilot-agent wait", async {
        pilot_agent::wait::run(args).await.map_err(|e| {
            tracing::error!("pilot-agent wait: {e}");
            e.to_string()
        })
    })
}
