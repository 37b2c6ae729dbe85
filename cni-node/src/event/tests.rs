use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::*;

fn event() -> CniAddEvent {
    CniAddEvent {
        netns: "/var/run/netns/cni-1".to_owned(),
        pod_name: "app-1".to_owned(),
        pod_namespace: "default".to_owned(),
        pod_uid: "uid-1".to_owned(),
        ips: vec!["10.1.0.5/24".to_owned(), "fd00::5/64".to_owned()],
    }
}

#[test]
fn wire_json_is_upstreams_go_shape() {
    let value = serde_json::to_value(event()).expect("encode");
    assert_eq!(
        value,
        json!({
            "Netns": "/var/run/netns/cni-1",
            "PodName": "app-1",
            "PodNamespace": "default",
            "PodUID": "uid-1",
            "IPs": [
                {"Address": {"IP": "10.1.0.5", "Mask": "////AA=="}},
                {"Address": {"IP": "fd00::5", "Mask": "//////////8AAAAAAAAAAA=="}},
            ],
        })
    );
    let back: CniAddEvent = serde_json::from_value(value).expect("decode");
    assert_eq!(back, event());
}

#[test]
fn decodes_what_upstreams_go_plugin_sends() {
    // As Go's encoding/json writes nodeagent.CNIPluginAddEvent (no PodUID, 16-byte v4 mask).
    let body = br#"{"Netns":"/proc/1/ns/net","PodName":"p","PodNamespace":"ns","IPs":[
        {"Interface":0,"Address":{"IP":"10.244.1.7","Mask":"////////////////////AA=="},"Gateway":"10.244.1.1"},
        {"Interface":null,"Address":{"IP":"10.0.0.1","Mask":"/////w=="},"Gateway":""}]}"#;
    let decoded = decode_event(body).expect("decode");
    assert_eq!(decoded.ips, vec!["10.244.1.7/24", "10.0.0.1/32"]);
    assert_eq!(decoded.pod_uid, "");
    let via_serde: CniAddEvent = serde_json::from_slice(body).expect("serde decode");
    assert_eq!(via_serde, decoded);
    // Plain strings are accepted too.
    let plain =
        decode_event(br#"{"Netns":"/n","PodName":"p","PodNamespace":"ns","IPs":["10.0.0.1/8"]}"#)
            .expect("decode");
    assert_eq!(plain.ips, vec!["10.0.0.1/8"]);
}

#[test]
fn decode_errors_name_the_field() {
    let cases: &[(&[u8], &str)] = &[
        (b"not json", "(body)"),
        (br#"{"PodName":"p","PodNamespace":"ns"}"#, "Netns"),
        (br#"{"Netns":"/n","PodName":1,"PodNamespace":"ns"}"#, "PodName"),
        (br#"{"Netns":"/n","PodName":"p"}"#, "PodNamespace"),
        (br#"{"Netns":"/n","PodName":"p","PodNamespace":"ns","IPs":{}}"#, "IPs"),
        (
            br#"{"Netns":"/n","PodName":"p","PodNamespace":"ns","IPs":["10.0.0.1/8","x"]}"#,
            "IPs[1]",
        ),
        (
            br#"{"Netns":"/n","PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"10.0.0.1","Mask":"/wD/AA=="}}]}"#,
            "IPs[0]",
        ),
    ];
    for (body, field) in cases {
        let error = decode_event(body).expect_err("must fail");
        assert_eq!(error.field, *field, "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn masks_are_go_base64_bytes() {
    for (cidr, mask) in [
        ("10.1.0.5/24", "////AA=="),
        ("10.1.0.5/32", "/////w=="),
        ("10.1.0.5/0", "AAAAAA=="),
        ("fd00::5/64", "//////////8AAAAAAAAAAA=="),
    ] {
        let value = wire::ip_config(cidr).expect("valid");
        assert_eq!(value["Address"]["Mask"], mask, "{cidr}");
        assert_eq!(wire::decode_ip(&value).expect("round trip"), cidr);
    }
    let error = wire::decode_ip(&json!({"Address": {"IP": "10.0.0.1", "Mask": "*"}}))
        .expect_err("not base64");
    assert_eq!(error.to_string(), "Address.Mask: not base64");
    let error = parse_cidr("10.0.0.1/33").expect_err("prefix");
    assert_eq!(error.to_string(), "prefix in \"10.0.0.1/33\" is not 0..=32");
}

/// Records events; fails those whose pod name starts with "fail".
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<CniAddEvent>>,
}

impl CniAddHandler for Recorder {
    fn cni_add(&self, event: CniAddEvent) -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            let fail = event.pod_name.starts_with("fail");
            self.seen.lock().expect("lock").push(event);
            if fail {
                Err("partial add error: no ztunnel connection".into())
            } else {
                Ok(())
            }
        })
    }
}

struct Agent {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    recorder: Arc<Recorder>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("run/istio-cni/pluginevent.sock");
        let recorder = Arc::new(Recorder::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (path, handler) = (socket.clone(), recorder.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = bind(&path).expect("bind");
                ready_tx.send(()).expect("ready");
                serve(listener, handler, async {
                    let _ = stopped.await;
                })
                .await;
            });
        });
        ready.recv().expect("agent started");
        Agent {
            _dir: dir,
            socket,
            recorder,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<CniAddEvent> {
        self.recorder.seen.lock().expect("lock").clone()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A raw request, returning the status code and body.
fn raw(socket: &Path, request: &[u8]) -> (u16, String) {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.write_all(request).expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn post_add_reaches_the_handler() {
    let agent = Agent::start();
    post_add(&agent.socket, &event(), Duration::from_secs(5)).expect("post");
    assert_eq!(agent.seen(), vec![event()]);
}

#[test]
fn handler_error_is_500_with_its_text() {
    let agent = Agent::start();
    let mut failing = event();
    failing.pod_name = "fail-1".to_owned();
    let error = post_add(&agent.socket, &failing, Duration::from_secs(5)).expect_err("must fail");
    match &error {
        EventError::AgentFailed { status, body, .. } => {
            assert_eq!(*status, 500);
            assert_eq!(body, "partial add error: no ztunnel connection");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(error.is_retryable());
}

#[test]
fn absent_agent_is_a_retryable_connect_error_naming_the_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("pluginevent.sock");
    let error = post_add(&socket, &event(), Duration::from_secs(1)).expect_err("must fail");
    assert!(matches!(error, EventError::Connect { .. }), "{error:?}");
    assert!(error.is_retryable());
    assert!(error.to_string().contains(&socket.display().to_string()));
}

#[test]
fn silent_agent_times_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("pluginevent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let started = std::time::Instant::now();
    let error = post_add(&socket, &event(), Duration::from_millis(300)).expect_err("must fail");
    assert!(matches!(error, EventError::Timeout { .. }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// An "agent" that reads the request and answers `reply` raw, then closes.
fn one_shot_agent(socket: &Path, reply: &'static [u8]) -> std::thread::JoinHandle<Vec<u8>> {
    let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind");
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut request = vec![0u8; 64 * 1024];
        let read = stream.read(&mut request).expect("read");
        request.truncate(read);
        let _ = stream.write_all(reply);
        request
    })
}

#[test]
fn agent_answers_that_are_not_ok_are_errors_not_hangs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: &[(&[u8], &str)] = &[
        (b"", "io"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "bad_response"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            "bad_response",
        ),
        (
            b"HTTP/1.1 503 Busy\r\nConnection: close\r\n\r\nagent busy",
            "agent_failed",
        ),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", "ok"),
    ];
    for (index, (reply, want)) in cases.iter().enumerate() {
        let socket = dir.path().join(format!("agent-{index}.sock"));
        let agent = one_shot_agent(&socket, reply);
        let started = std::time::Instant::now();
        let result = post_add(&socket, &event(), Duration::from_secs(5));
        let got = result.as_ref().map_or_else(|e| e.reason(), |()| "ok");
        assert_eq!(
            got,
            *want,
            "{:?}: {result:?}",
            String::from_utf8_lossy(reply)
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "no waiting for the deadline"
        );
        let request = agent.join().expect("agent");
        let request = String::from_utf8_lossy(&request);
        assert!(
            request.starts_with("POST /cmdadd HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.ends_with('}'),
            "the whole event in one write: {request}"
        );
    }
}

#[test]
fn server_rejects_bad_requests() {
    let agent = Agent::start();
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: unix\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let (status, body) = raw(
        &agent.socket,
        post("/cmdadd", r#"{"PodName":"p"}"#).as_bytes(),
    );
    assert_eq!(status, 400);
    assert!(body.contains("Netns"), "{body}");
    let (status, _) = raw(&agent.socket, post("/other", "{}").as_bytes());
    assert_eq!(status, 404);
    let (status, _) = raw(&agent.socket, b"GET /cmdadd HTTP/1.1\r\nHost: unix\r\n\r\n");
    assert_eq!(status, 405);
    let (status, _) = raw(
        &agent.socket,
        b"POST /cmdadd HTTP/1.1\r\nHost: unix\r\n\r\n",
    );
    assert_eq!(status, 411);
    let big = format!(
        "POST /cmdadd HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY + 1
    );
    let (status, _) = raw(&agent.socket, big.as_bytes());
    assert_eq!(status, 413);
    assert!(agent.seen().is_empty());
    // Still serving after all that.
    post_add(&agent.socket, &event(), Duration::from_secs(5)).expect("post");
}

#[test]
fn bind_replaces_a_stale_socket_but_not_other_files() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("a/b/pluginevent.sock");
    drop(bind(&socket).expect("first bind creates the directories"));
    assert!(
        socket.exists(),
        "socket file stays after the listener is gone"
    );
    let listener = bind(&socket).expect("stale socket replaced");
    drop(listener);
    let file = dir.path().join("plain");
    std::fs::write(&file, "x").expect("write");
    assert!(matches!(bind(&file), Err(EventError::NotASocket(_))));
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "x");
}
