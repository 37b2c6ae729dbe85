//! Starting an in-process istiod for the integration tests.

// Each test binary uses a part of these helpers.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use istiod::config::Config;
use istiod::server::{self, Running};

/// Starts istiod on ephemeral loopback ports with `flags` (the source: `--config-dir=...` or
/// `--kubeconfig=...`, and any others), and waits until it has synced (before that it answers
/// UNAVAILABLE).
pub async fn start_istiod(flags: &[String], state: &Path) -> Running {
    let mut args = vec![
        "istiod".to_string(),
        format!("--state-dir={}", state.display()),
        "--grpc-addr=127.0.0.1:0".into(),
        "--secure-grpc-addr=127.0.0.1:0".into(),
        "--http-addr=127.0.0.1:0".into(),
        "--monitoring-addr=127.0.0.1:0".into(),
        "--webhook-addr=127.0.0.1:0".into(),
        "--debounce-after=50ms".into(),
    ];
    args.extend(flags.iter().cloned());
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

/// The body of `GET path` on `addr` (any status: the tests read what the page says).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    mesh_testutil::http_get(addr, path, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .body
}
