//! Starting an in-process istiod for the integration tests.

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use istiod::config::Config;
use istiod::server::{self, Running};

/// Starts istiod on ephemeral loopback ports reading `source` (`--config-dir=...` or
/// `--kubeconfig=...`), and waits until it has synced (before that it answers UNAVAILABLE).
pub async fn start_istiod(source: &str, state: &Path, tokens: &Path) -> Running {
    let args = [
        "istiod".to_string(),
        source.to_string(),
        format!("--state-dir={}", state.display()),
        format!("--tokens-file={}", tokens.display()),
        "--grpc-addr=127.0.0.1:0".into(),
        "--secure-grpc-addr=127.0.0.1:0".into(),
        "--http-addr=127.0.0.1:0".into(),
        "--monitoring-addr=127.0.0.1:0".into(),
        "--debounce-after=50ms".into(),
    ];
    let config = Config::try_parse_from(args).expect("config");
    let running = server::start(config).await.expect("istiod starts");
    let mut snaps = running.snapshots.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        snaps.wait_for(|s| mesh_xds::XdsSnapshot::version(s.as_ref()) > 0),
    )
    .await
    .expect("synced in time")
    .expect("snapshots");
    running
}
