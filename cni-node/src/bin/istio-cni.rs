//! `istio-cni`: the chained CNI plugin the container runtime runs for every pod sandbox
//! (see `cni_node::plugin`). Reads the network configuration on stdin and `CNI_*` from the
//! environment; prints the result or the error JSON on stdout; logs to stderr. Synchronous
//! but for the one request to the agent (`cni_node::event::post_add`).

use std::io::{Read, Write};

use cni_node::plugin::{self, Failure, Output, PluginError, CNI_COMMAND, CURRENT_VERSION};

fn main() {
    let output = match read_stdin() {
        Ok(stdin) => {
            init_logging(&stdin);
            plugin::execute(&|var| std::env::var(var).ok(), &stdin)
        }
        Err(error) => Output::failure(&Failure {
            error: PluginError::Stdin(error),
            cni_version: CURRENT_VERSION.to_owned(),
        }),
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(output.stdout.as_bytes())
        .and_then(|()| stdout.flush())
    {
        eprintln!("istio-cni: cannot write the result to stdout: {error}");
        std::process::exit(1);
    }
    std::process::exit(output.exit_code);
}

/// VERSION may come without stdin; the other commands always have a configuration.
fn read_stdin() -> std::io::Result<Vec<u8>> {
    let mut stdin = Vec::new();
    std::io::stdin().read_to_end(&mut stdin)?;
    Ok(stdin)
}

/// Logs JSON to stderr at the configuration's `plugin_log_level` (`RUST_LOG` and
/// `LOG_FORMAT` win when set).
fn init_logging(stdin: &[u8]) {
    let level = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|conf| conf.get("plugin_log_level")?.as_str().map(str::to_owned));
    let filter = match level.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("none" | "off") => "off",
        Some("debug") => "debug",
        Some("warn" | "warning") => "warn",
        Some("error") => "error",
        _ => "info",
    };
    // Single-threaded here: nothing else reads the environment concurrently.
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", filter);
    }
    // JSON lines, as upstream's plugin logs (no terminal colours in the runtime's logs).
    if std::env::var_os(mesh_runtime::telemetry::LOG_FORMAT_ENV).is_none() {
        std::env::set_var(mesh_runtime::telemetry::LOG_FORMAT_ENV, "json");
    }
    if let Err(error) = mesh_runtime::telemetry::init() {
        eprintln!(
            "istio-cni: logging disabled: {error} ({CNI_COMMAND}={:?})",
            std::env::var(CNI_COMMAND).unwrap_or_default()
        );
    }
}
