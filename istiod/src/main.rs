//! istiod binary: parse configuration, start, run until SIGTERM/SIGINT, drain.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    mesh_runtime::telemetry::init()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = istiod::config::Config::parse();
    tracing::info!(config = %serde_json::to_string(&config)?, "starting istiod");
    let shutdown = mesh_runtime::signal::on_signals()?;
    let mut running = istiod::server::start(config).await?;
    tokio::select! {
        _ = shutdown.wait() => running.shutdown().await?,
        r = running.wait() => r?,
    }
    tracing::info!("istiod stopped");
    Ok(())
}
