//! istioctl: the command line Istio users expect, for this mesh.

use clap::{Parser, Subcommand};

mod connect;
mod csr;
mod render;
mod xds_dump;

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
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Experimental { command } => match command {
            Experimental::XdsDump(args) => xds_dump::run(args).await,
            Experimental::Csr(args) => csr::run(args).await,
        },
    }
}
