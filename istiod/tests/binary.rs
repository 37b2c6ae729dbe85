//! The istiod binary as an operator runs it: configuration errors, readiness, SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mesh_testutil::{namespace_yaml, ClusterDir};

const ISTIOD: &str = env!("CARGO_BIN_EXE_istiod");

#[test]
fn bad_configuration_is_reported_all_at_once() {
    let out = Command::new(ISTIOD)
        .args([
            "--config-dir=/nonexistent/cluster",
            "--tokens-file=/nonexistent/tokens.yaml",
            "--debounce-after=30s",
        ])
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run istiod");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "/nonexistent/cluster",
        "/nonexistent/tokens.yaml",
        "PILOT_DEBOUNCE_AFTER",
    ] {
        assert!(stderr.contains(needle), "{needle} not in: {stderr}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Whether `GET /ready` on `port` answers 200.
fn answers_ready(port: u16) -> bool {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return false;
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    runtime
        .block_on(mesh_testutil::http_get(
            addr,
            "/ready",
            Duration::from_secs(2),
        ))
        .is_ok_and(|response| response.status == 200)
}

#[test]
fn becomes_ready_then_drains_on_sigterm() {
    let cluster = ClusterDir::new();
    cluster.write("ns.yaml", &namespace_yaml("demo", &[]));
    let state = tempfile::tempdir().expect("state dir");
    let tokens_file = tempfile::NamedTempFile::new().expect("tokens file");
    std::fs::write(tokens_file.path(), "tokens: []\n").expect("write tokens");
    let tokens = tokens_file.path();
    let http = free_port();
    let mut child = Command::new(ISTIOD)
        .arg(format!("--config-dir={}", cluster.path().display()))
        .arg(format!("--state-dir={}", state.path().display()))
        .arg(format!("--tokens-file={}", tokens.display()))
        .arg(format!("--grpc-addr=127.0.0.1:{}", free_port()))
        .arg(format!("--secure-grpc-addr=127.0.0.1:{}", free_port()))
        .arg(format!("--monitoring-addr=127.0.0.1:{}", free_port()))
        .arg(format!("--webhook-addr=127.0.0.1:{}", free_port()))
        .arg(format!("--http-addr=127.0.0.1:{http}"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start istiod");
    let start = Instant::now();
    let mut ready = false;
    while start.elapsed() < Duration::from_secs(20) {
        if answers_ready(http) {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready, "istiod did not become ready");
    assert!(
        state.path().join("root-cert.pem").is_file(),
        "root certificate published"
    );

    let pid = child.id().to_string();
    let kill = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(kill.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "istiod did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}
