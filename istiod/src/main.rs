//! istiod binary: parse configuration, start, run until SIGTERM/SIGINT, drain.

use clap::Parser;

/// jemalloc returns freed memory to the system and fragments less than glibc's allocator under
/// istiod's load (large, short-lived initial xDS responses for many clients at once).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A multi-threaded runtime, one worker per core: xDS connections, CA calls and webhooks run on
/// every core rather than queueing behind each other on one thread.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mesh_runtime::telemetry::init()?;
    // Give freed pages back to the system from a background thread, within jemalloc's decay
    // time, rather than only when istiod next allocates.
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc background thread not started");
    }
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
