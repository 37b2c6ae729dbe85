//! istioctl: the command line Istio users expect, for this mesh.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use istioctl::{
    analyze, csr, install, manifest, precheck, proxy_config, uninstall, waypoint, xds_dump,
    ztunnel_config,
};

#[derive(Debug, Parser)]
#[command(
    name = "istioctl",
    version,
    about = "Inspect and operate the ambient mesh"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what a ztunnel holds: workloads, services, policies, certificates.
    #[command(name = "ztunnel-config", visible_alias = "zc")]
    ZtunnelConfig {
        #[command(subcommand)]
        command: ztunnel_config::ZtunnelConfig,
    },
    /// Show what an Envoy proxy (waypoint) holds: listeners, clusters, routes, endpoints,
    /// secrets.
    #[command(name = "proxy-config", visible_alias = "pc")]
    ProxyConfig {
        #[command(subcommand)]
        command: proxy_config::ProxyConfig,
    },
    /// Manage waypoints (in a cluster, or the local mode's objects directory).
    Waypoint {
        #[command(subcommand)]
        command: waypoint::WaypointCommand,
    },
    /// The objects an install of the mesh writes, rendered from its charts.
    Manifest {
        #[command(subcommand)]
        command: manifest::ManifestCommand,
    },
    /// Install the mesh into a cluster: apply what `manifest generate` renders, wait for it
    /// to be ready, and prune what an earlier install left.
    #[command(visible_alias = "apply")]
    Install(install::InstallArgs),
    /// Remove the mesh (a revision's control plane, or everything with --purge) from a cluster.
    Uninstall(uninstall::UninstallArgs),
    /// Analyze a cluster's live objects and/or directories of Kubernetes/Istio YAML and print
    /// validation messages.
    Analyze(analyze::AnalyzeArgs),
    /// Experimental commands.
    #[command(name = "x", alias = "experimental")]
    Experimental {
        #[command(subcommand)]
        command: Experimental,
    },
}

#[derive(Debug, Subcommand)]
enum Experimental {
    /// Subscribe to istiod's workload discovery (delta xDS) as a ztunnel and print it.
    XdsDump(xds_dump::XdsDumpArgs),
    /// Request a workload certificate from istiod's CA (as a node's ztunnel) and show it.
    Csr(csr::CsrArgs),
    /// Check that a cluster (with --kubeconfig, --context or KUBECONFIG) or this host (the
    /// local mode) can run the mesh.
    Precheck(precheck::PrecheckArgs),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            // Every error here names its cause in its own message, so the chain is not repeated.
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::ZtunnelConfig { command } => {
            ztunnel_config::run(command).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ProxyConfig { command } => {
            proxy_config::run(command).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Analyze(args) => Ok(analyze::run(&args).await?),
        Command::Install(args) => Ok(install::run(&args).await?),
        Command::Uninstall(args) => Ok(uninstall::run(&args).await?),
        Command::Manifest { command } => {
            let (yaml, notes) = manifest::run(command)?;
            for note in notes {
                eprintln!("note: {note}");
            }
            print!("{yaml}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Waypoint { command } => {
            let out = match command {
                waypoint::WaypointCommand::Generate(a) => waypoint::gateway_yaml(&a)?,
                waypoint::WaypointCommand::Apply(a) => waypoint::apply(&a).await?,
                waypoint::WaypointCommand::List(a) => waypoint::list(&a).await?,
                waypoint::WaypointCommand::Delete(a) => waypoint::delete(&a).await?,
                waypoint::WaypointCommand::Status(a) => waypoint::status(&a).await?,
            };
            print!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Experimental { command } => match command {
            Experimental::XdsDump(args) => xds_dump::run(args).await.map(|()| ExitCode::SUCCESS),
            Experimental::Csr(args) => csr::run(args).await.map(|()| ExitCode::SUCCESS),
            Experimental::Precheck(args) if args.cluster_mode() => {
                Ok(precheck::run_cluster(&args).await?)
            }
            Experimental::Precheck(args) => Ok(precheck::run(&args)),
        },
    }
}
