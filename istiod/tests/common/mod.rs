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

/// The whole HTTP/1.0 response (head and body) to `GET path` on `addr`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect http");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    String::from_utf8_lossy(&buf).into_owned()
}
