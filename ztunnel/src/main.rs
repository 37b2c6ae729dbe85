//! ztunnel binary: read the configuration from the environment, log it, run until SIGTERM.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before any thread exists: arenas are per thread.
    let refused = ztunnel::allocator::tune();
    let logging = match mesh_runtime::telemetry::init_with_control() {
        Ok((_, control)) => control,
        Err(e) => {
            eprintln!("ztunnel: {e}");
            return ExitCode::from(2);
        }
    };
    for (param, value) in refused {
        tracing::warn!(
            ?param,
            value,
            "glibc refused a malloc setting; running with its default"
        );
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match ztunnel::config::Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(reason = e.reason(), "invalid configuration: {e}");
            eprintln!("ztunnel: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    match serde_json::to_string(&config) {
        Ok(json) => tracing::info!(config = %json, "starting ztunnel"),
        Err(e) => tracing::warn!(error = %e, "cannot render the configuration"),
    }
    match ztunnel::app::run(config, Some(logging)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(reason = e.reason(), "ztunnel failed: {e}");
            eprintln!("ztunnel: {e}");
            ExitCode::FAILURE
        }
    }
}
