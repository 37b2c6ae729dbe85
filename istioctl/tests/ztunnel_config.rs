//! The built `istioctl ztunnel-config` against a tiny HTTP server serving a real ztunnel
//! `/config_dump` (tests/fixtures/ztunnel-config-dump.json).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output};

const FIXTURE: &str = include_str!("fixtures/ztunnel-config-dump.json");

/// Serves `body` for `GET /config_dump` (chunked, as HTTP/1.1 servers may) and 404 for
/// anything else, to `n` connections.
fn serve(n: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(n) {
            let mut stream = stream.expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            reader.read_line(&mut request_line).expect("read");
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).expect("read");
                if header == "\r\n" || header.is_empty() {
                    break;
                }
            }
            let response = if request_line.starts_with("GET /config_dump ") {
                let (a, b) = FIXTURE.split_at(FIXTURE.len() / 2);
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                    a.len(),
                    b.len()
                )
            } else {
                "HTTP/1.0 404 Not Found\r\ncontent-length: 10\r\n\r\nnot found\n".to_string()
            };
            stream.write_all(response.as_bytes()).expect("write");
        }
    });
    addr
}

fn istioctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_istioctl"))
        .args(args)
        .env_remove("ZTUNNEL_ADMIN")
        .output()
        .expect("run istioctl")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "istioctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tables_from_a_live_admin_endpoint() {
    let addr = serve(4);
    let admin = format!("http://{addr}");
    let out = stdout(&istioctl(&[
        "ztunnel-config",
        "workloads",
        "--ztunnel-admin",
        &admin,
        "--node",
        "node1",
    ]));
    assert_eq!(
        out,
        "NAMESPACE POD NAME                  ADDRESS     NODE  WAYPOINT PROTOCOL\n\
         demo      client                    10.244.1.11 node1 None     HBONE\n\
         demo      server-v1-7d9c6b5f4-abcde 10.244.1.10 node1 waypoint HBONE\n\
         demo      waypoint-6d8f9c7b5-xyz12  10.244.1.30 node1 None     NONE\n"
    );
    let out = stdout(&istioctl(&["zc", "services", "--ztunnel-admin", &admin]));
    assert!(
        out.starts_with("NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS\n"),
        "{out}"
    );
    assert!(
        out.contains("demo      server       10.96.0.10  waypoint 1/2\n"),
        "{out}"
    );
    let out = stdout(&istioctl(&[
        "zc",
        "policies",
        "--ztunnel-admin",
        &admin,
        "--workload-namespace",
        "demo",
    ]));
    assert_eq!(
        out,
        "NAMESPACE POLICY NAME         ACTION SCOPE\ndemo      server-allow-client Allow  WorkloadSelector\n"
    );
    let out = stdout(&istioctl(&[
        "zc",
        "certificates",
        "--ztunnel-admin",
        &admin,
    ]));
    assert!(
        out.starts_with("CERTIFICATE NAME                                TYPE     STATUS           VALID CERT     SERIAL NUMBER                        NOT AFTER                NOT BEFORE\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "spiffe://cluster.local/ns/demo/sa/waypoint      NA       Initializing     false"
        ),
        "{out}"
    );
}

#[test]
fn all_from_a_saved_dump_and_raw_output() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ztunnel-config-dump.json"
    );
    let out = stdout(&istioctl(&["zc", "all", "--ztunnel-config-dump", path]));
    let headers: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("NAMESPACE") || l.starts_with("CERTIFICATE"))
        .map(|l| l.split("  ").next().unwrap_or(l))
        .collect();
    assert_eq!(headers.len(), 4, "{out}");
    assert!(out.starts_with("\nNAMESPACE POD NAME"), "{out}");
    let json = stdout(&istioctl(&["zc", "all", "-f", path, "-o", "json"]));
    let back: serde_json::Value = serde_json::from_str(&json).expect("json");
    let fixture: serde_json::Value = serde_json::from_str(FIXTURE).expect("json");
    assert_eq!(back, fixture);
    let yaml = stdout(&istioctl(&["zc", "policy", "-f", path, "-o", "yaml"]));
    assert!(yaml.starts_with("- action: Allow\n"), "{yaml}");
}

#[test]
fn unreachable_admin_says_what_to_check() {
    // A port nothing listens on: bind, note it, drop.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let out = istioctl(&[
        "zc",
        "workloads",
        "--ztunnel-admin",
        &format!("http://127.0.0.1:{port}"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to 127.0.0.1:") && err.contains("is the process running"),
        "{err}"
    );
    let out = istioctl(&[
        "zc",
        "workloads",
        "--ztunnel-admin",
        "https://localhost:15000",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("plain HTTP"), "{err}");
}
