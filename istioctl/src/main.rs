//! istioctl: the command line Istio users expect, for this mesh.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use istioctl::{
    analyze, csr, install, kube_inject, manifest, precheck, proxy_config, uninstall, waypoint,
    xds_dump, ztunnel_config,
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
    /// Inject the Envoy sidecar into the pod templates of Kubernetes manifests (offline).
    #[command(name = "kube-inject")]
    KubeInject(kube_inject::KubeInjectArgs),
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
            eprintln!("error: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error with each cause its message does not already include (most of ours name their
/// cause; a client library's often keep it in the chain only).
fn describe(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
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
        Command::KubeInject(args) => kube_inject::run(&args)
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into),
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
