//! In-pod mode against a fake node agent, with real network namespaces (root needed).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_proto::workload::zds::{workload_request::Payload, AddWorkload, WorkloadRequest};
use mesh_runtime::metrics::Metrics;
use mesh_testutil::{workload_info, FakeZds, SnapshotItem};
use nix::sys::socket::MsgFlags;
use prost::Message;
use socket2::SockRef;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::*;
use crate::config::{self, Config};
use crate::proxy::{PodInfo, PodListeners, PodProxy, PodProxyStarter, StartError};
use crate::socket::SharedSocketFactory;

const DRAIN_DEADLINE: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(5);

/// Root is needed for unshare/setns; in CI a missing privilege is a failure, not a skip.
fn privileged() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the effective uid.
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("in-pod tests need root (CAP_SYS_ADMIN) and CI is set");
    }
    eprintln!("SKIPPED: in-pod tests need root");
    false
}

/// A throwaway network namespace with `lo` up, alive while the fd is open.
fn new_netns() -> OwnedFd {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
        // A child forked from this thread starts in its netns.
        let status = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("run ip");
        assert!(status.success(), "ip link set lo up: {status}");
        OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").expect("open netns"))
    })
    .join()
    .expect("netns thread")
}

fn dup(fd: &OwnedFd) -> OwnedFd {
    fd.try_clone().expect("dup fd")
}

/// Runs `f` (blocking socket work) inside the netns `ns`.
async fn in_netns<R, F>(ns: &OwnedFd, f: F) -> R
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let netns = Netns::from_fd(dup(ns)).expect("netns");
    tokio::task::spawn_blocking(move || netns.run(f).expect("run in netns"))
        .await
        .expect("blocking task")
}

fn outbound() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 15001))
}

/// Connects to 127.0.0.1:15001 and reads the proxy's greeting line.
fn dial_blocking() -> io::Result<(TcpStream, String)> {
    let stream = TcpStream::connect_timeout(&outbound(), Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    Ok((stream, line.trim().to_string()))
}

/// The greeting of the proxy listening on 15001 inside `ns`.
async fn greeting(ns: &OwnedFd) -> io::Result<String> {
    in_netns(ns, || dial_blocking().map(|(_, line)| line)).await
}

/// Waits until nothing listens on 15001 inside `ns` any more.
async fn wait_refused(ns: &OwnedFd) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match greeting(ns).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "15001 still answers: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A pod proxy for tests: on 15001 it greets with
/// `<tag> <uid> start=<n> mark=<accepted SO_MARK> listener_mark=<listener SO_MARK>`, then
/// echoes one line. Draining closes the listeners and waits for open connections.
struct EchoStarter {
    tag: &'static str,
    starts: Mutex<HashMap<String, usize>>,
}

impl EchoStarter {
    fn new(tag: &'static str) -> Arc<EchoStarter> {
        Arc::new(EchoStarter {
            tag,
            starts: Mutex::new(HashMap::new()),
        })
    }

    fn starts(&self, uid: &str) -> usize {
        self.starts
            .lock()
            .expect("lock")
            .get(uid)
            .copied()
            .unwrap_or(0)
    }
}

impl PodProxyStarter for EchoStarter {
    fn start(
        &self,
        pod: PodInfo,
        _sockets: SharedSocketFactory,
        listeners: PodListeners,
    ) -> Result<PodProxy, StartError> {
        let n = {
            let mut starts = self.starts.lock().expect("lock");
            let n = starts.entry(pod.uid.clone()).or_default();
            *n += 1;
            *n
        };
        let listener_mark = SockRef::from(&listeners.outbound).mark().unwrap_or(0);
        let PodListeners {
            outbound,
            inbound_plaintext,
            hbone,
            dns_udp,
            dns_tcp,
        } = listeners;
        let outbound =
            tokio::net::TcpListener::from_std(outbound).map_err(|source| StartError::Listener {
                pod: pod.to_string(),
                source,
            })?;
        let prefix = format!("{} {} start={n}", self.tag, pod.uid);
        let (drain_tx, mut drain_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let others = (inbound_plaintext, hbone, dns_udp, dns_tcp);
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    _ = drain_rx.wait_for(|d| *d) => break,
                    accepted = outbound.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let mark = SockRef::from(&stream).mark().unwrap_or(0);
                        let hello = format!("{prefix} mark={mark} listener_mark={listener_mark}\n");
                        conns.spawn(echo_one_line(stream, hello));
                    }
                }
            }
            drop((outbound, others));
            while conns.join_next().await.is_some() {}
        });
        Ok(PodProxy::new(drain_tx, task))
    }
}

async fn echo_one_line(mut stream: tokio::net::TcpStream, hello: String) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    if stream.write_all(hello.as_bytes()).await.is_err() {
        return;
    }
    let (r, mut w) = stream.split();
    let mut line = String::new();
    if tokio::io::BufReader::new(r)
        .read_line(&mut line)
        .await
        .is_ok()
    {
        let _ = w.write_all(line.as_bytes()).await;
    }
}

/// A running manager.
struct Harness {
    status: InPodStatus,
    starter: Arc<EchoStarter>,
    metrics: Metrics,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

fn start_manager(uds: &Path, tag: &'static str, port_reuse: bool) -> Harness {
    let vars = [
        (config::INPOD_UDS, uds.display().to_string()),
        (config::INPOD_PORT_REUSE, port_reuse.to_string()),
    ];
    let mut config = Config::from_vars(vars.map(|(k, v)| (k.to_string(), v))).expect("config");
    assert_eq!(config.packet_mark, Some(1337), "shared mode marks 1337");
    config.termination_deadline = DRAIN_DEADLINE;
    let starter = EchoStarter::new(tag);
    let metrics = Metrics::new();
    let manager = InPodManager::new(Arc::new(config), starter.clone(), &metrics);
    let status = manager.status();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(manager.run(async move {
        let _ = rx.await;
    }));
    Harness {
        status,
        starter,
        metrics,
        shutdown: Some(tx),
        task,
    }
}

impl Harness {
    async fn wait_ready(&self, ready: bool) {
        let mut rx = self.status.snapshot_received();
        tokio::time::timeout(WAIT, rx.wait_for(|r| *r == ready))
            .await
            .unwrap_or_else(|_| panic!("readiness never became {ready}"))
            .expect("status alive");
    }

    fn states(&self) -> Vec<(String, ProxyState)> {
        self.status
            .pods()
            .into_iter()
            .map(|p| (p.uid, p.state))
            .collect()
    }

    async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("manager drained in time")
            .expect("manager task");
    }
}

fn pod(name: &str) -> mesh_proto::workload::zds::WorkloadInfo {
    workload_info(name, "default", "sa-")
}

fn add(uid: &str, ns: &OwnedFd) -> SnapshotItem {
    SnapshotItem::add(uid, pod(uid), ns).expect("snapshot item")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_live_in_the_pod_netns_marked_and_drained_on_shutdown() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("ztunnel.sock");
    let ns = new_netns();
    let zds = FakeZds::start(&uds, vec![add("p1", &ns)]).expect("fake zds");
    let h = start_manager(&uds, "a", true);
    zds.wait_snapshots(1).await.expect("snapshot taken");
    assert_eq!(zds.snapshot_acks(), vec![Ok(()), Ok(())]);
    h.wait_ready(true).await;

    let hello = greeting(&ns)
        .await
        .expect("15001 answers inside the pod netns");
    assert_eq!(hello, "a p1 start=1 mark=1337 listener_mark=1337");
    let from_host = TcpStream::connect_timeout(&outbound(), Duration::from_millis(500));
    assert_eq!(
        from_host.expect_err("nothing on the host's 15001").kind(),
        io::ErrorKind::ConnectionRefused
    );
    // The other listeners are inside the pod too.
    let others = in_netns(&ns, || {
        let hbone = TcpStream::connect("127.0.0.1:15008").is_ok();
        let plain = TcpStream::connect("127.0.0.1:15006").is_ok();
        let dns = TcpStream::connect("127.0.0.1:15053").is_ok();
        (hbone, plain, dns)
    })
    .await;
    assert_eq!(others, (true, true, true));

    assert_eq!(h.states(), vec![("p1".to_string(), ProxyState::Up)]);
    let dump = serde_json::to_value(h.status.dump()).expect("json");
    assert_eq!(
        dump,
        serde_json::json!({"p1": {"state": "Up",
            "info": {"name": "p1", "namespace": "default", "serviceAccount": "sa-"}}})
    );
    let text = h.metrics.render();
    assert!(text.contains("istio_active_proxy_count 1"), "{text}");
    assert!(text.contains("istio_pending_proxy_count 0"), "{text}");
    assert!(text.contains("istio_proxies_started_total 1"), "{text}");

    h.stop().await;
    wait_refused(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_drains_open_connections_until_the_deadline_then_closes() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("ztunnel.sock");
    let ns = new_netns();
    let zds = FakeZds::start(&uds, vec![]).expect("fake zds");
    let h = start_manager(&uds, "a", true);
    h.wait_ready(true).await;

    assert_eq!(zds.add("p1", pod("p1"), &ns).await.expect("ack"), Ok(()));
    let (mut held, hello) = in_netns(&ns, dial_blocking).await.expect("dial");
    assert!(hello.starts_with("a p1 start=1"), "{hello}");

    assert_eq!(zds.del("p1").await.expect("ack"), Ok(()));
    wait_refused(&ns).await;
    // The open connection is cut at the drain deadline.
    let started = std::time::Instant::now();
    let cut = tokio::task::spawn_blocking(move || held.read(&mut [0u8; 16]))
        .await
        .expect("read task");
    assert!(matches!(cut, Ok(0) | Err(_)), "{cut:?}");
    assert!(started.elapsed() < DRAIN_DEADLINE + Duration::from_secs(2));

    let deadline = tokio::time::Instant::now() + WAIT;
    while !h.states().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", h.states());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = h.metrics.render();
    assert!(text.contains("istio_proxies_stopped_total 1"), "{text}");
    assert!(text.contains("istio_active_proxy_count 0"), "{text}");
    // Deleting an unknown pod is not an error (idempotent).
    assert_eq!(zds.del("p1").await.expect("ack"), Ok(()));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_nacked_and_the_connection_kept() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("ztunnel.sock");
    let zds = FakeZds::start(&uds, vec![]).expect("fake zds");
    let h = start_manager(&uds, "a", true);
    h.wait_ready(true).await;

    let nack = zds.send_raw(b"\xff\xff\xff garbage", None).await;
    let nack = nack.expect("ack").expect_err("garbage NACKed").0;
    assert!(nack.contains("cannot decode WorkloadRequest"), "{nack}");

    let long = vec![0u8; 2000];
    let nack = zds
        .send_raw(&long, None)
        .await
        .expect("ack")
        .expect_err("NACK")
        .0;
    assert!(nack.contains("truncated"), "{nack}");

    let file = tempfile::NamedTempFile::new().expect("temp file");
    let nack = zds.add("p1", pod("p1"), file.as_file()).await;
    let nack = nack.expect("ack").expect_err("regular file NACKed").0;
    assert!(nack.contains("not a network namespace"), "{nack}");
    assert!(nack.contains("a regular file"), "{nack}");
    assert!(nack.contains("p1"), "{nack}");

    let no_fd = WorkloadRequest {
        payload: Some(Payload::Add(AddWorkload {
            uid: "p1".into(),
            workload_info: None,
        })),
    };
    let nack = zds.send_raw(&no_fd.encode_to_vec(), None).await;
    let nack = nack.expect("ack").expect_err("Add without fd NACKed").0;
    assert!(nack.contains("carries no netns fd"), "{nack}");

    let keep = WorkloadRequest {
        payload: Some(Payload::Keep(mesh_proto::workload::zds::KeepWorkload {
            uid: "p1".into(),
        })),
    };
    let nack = zds.send_raw(&keep.encode_to_vec(), None).await;
    let nack = nack
        .expect("ack")
        .expect_err("Keep after snapshot NACKed")
        .0;
    assert!(nack.contains("only valid in a snapshot"), "{nack}");

    // The connection still works.
    let ns = new_netns();
    assert_eq!(zds.add("p1", pod("p1"), &ns).await.expect("ack"), Ok(()));
    let hello = greeting(&ns).await.expect("dial");
    assert!(hello.starts_with("a p1 start=1"), "{hello}");
    assert!(h.states().iter().all(|(_, s)| *s == ProxyState::Up));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_resends_snapshot_keeping_named_pods_and_draining_the_rest() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("ztunnel.sock");
    let (ns1, ns2, ns3) = (new_netns(), new_netns(), new_netns());
    let snapshot = vec![add("p1", &ns1), add("p2", &ns2), add("p3", &ns3)];
    let zds = FakeZds::start(&uds, snapshot).expect("fake zds");
    let h = start_manager(&uds, "a", true);
    zds.wait_snapshots(1).await.expect("snapshot");
    h.wait_ready(true).await;
    for ns in [&ns1, &ns2, &ns3] {
        assert!(greeting(ns).await.expect("dial").contains("start=1"));
    }

    zds.stop().await;
    h.wait_ready(false).await;
    // The node agent restarted: p1 re-added with the same netns, p2 kept, p3 gone.
    let zds = FakeZds::start(&uds, vec![add("p1", &ns1), SnapshotItem::keep("p2")])
        .expect("fake zds again");
    zds.wait_snapshots(1)
        .await
        .expect("snapshot after reconnect");
    assert_eq!(zds.snapshot_acks(), vec![Ok(()), Ok(()), Ok(())]);
    h.wait_ready(true).await;

    wait_refused(&ns3).await;
    assert_eq!(
        greeting(&ns1).await.expect("p1 still up"),
        "a p1 start=1 mark=1337 listener_mark=1337"
    );
    assert!(greeting(&ns2).await.expect("p2 kept").contains("start=1"));
    assert_eq!(
        (h.starter.starts("p1"), h.starter.starts("p2")),
        (1, 1),
        "kept pods are not restarted"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_with_a_new_netns_replaces_the_proxy() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("ztunnel.sock");
    let (old, new) = (new_netns(), new_netns());
    let zds = FakeZds::start(&uds, vec![add("p1", &old)]).expect("fake zds");
    let h = start_manager(&uds, "a", true);
    h.wait_ready(true).await;
    // Same netns again (another fd of it): idempotent.
    assert_eq!(zds.add("p1", pod("p1"), &old).await.expect("ack"), Ok(()));
    assert_eq!(h.starter.starts("p1"), 1);

    assert_eq!(zds.add("p1", pod("p1"), &new).await.expect("ack"), Ok(()));
    assert!(greeting(&new).await.expect("dial").contains("start=2"));
    wait_refused(&old).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_bind_the_same_pod_with_reuse_port() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = new_netns();
    let (uds_a, uds_b, uds_c) = (
        dir.path().join("a.sock"),
        dir.path().join("b.sock"),
        dir.path().join("c.sock"),
    );
    let zds_a = FakeZds::start(&uds_a, vec![add("p1", &ns)]).expect("fake a");
    let zds_b = FakeZds::start(&uds_b, vec![add("p1", &ns)]).expect("fake b");
    let a = start_manager(&uds_a, "a", true);
    let b = start_manager(&uds_b, "b", true);
    zds_a.wait_snapshots(1).await.expect("snapshot a");
    zds_b.wait_snapshots(1).await.expect("snapshot b");
    assert_eq!(zds_a.snapshot_acks(), vec![Ok(()), Ok(())]);
    assert_eq!(zds_b.snapshot_acks(), vec![Ok(()), Ok(())]);
    let hello = greeting(&ns).await.expect("dial");
    assert!(
        hello.starts_with("a p1") || hello.starts_with("b p1"),
        "{hello}"
    );

    // Without SO_REUSEPORT the port is taken: NACK, pod pending, not ready.
    let zds_c = FakeZds::start(&uds_c, vec![add("p1", &ns)]).expect("fake c");
    let c = start_manager(&uds_c, "c", false);
    zds_c.wait_snapshots(1).await.expect("snapshot c");
    let acks = zds_c.snapshot_acks();
    let nack = &acks[0]
        .as_ref()
        .expect_err("bind without SO_REUSEPORT fails")
        .0;
    assert!(nack.contains("binding port 15001"), "{nack}");
    assert_eq!(c.states(), vec![("p1".to_string(), ProxyState::Pending)]);
    assert!(!*c.status.snapshot_received().borrow());
    assert!(c.metrics.render().contains("istio_pending_proxy_count 1"));

    // Once the others have drained, the pending pod starts on its retry.
    a.stop().await;
    b.stop().await;
    let mut ready = c.status.snapshot_received();
    tokio::time::timeout(RETRY_PENDING + WAIT, ready.wait_for(|r| *r))
        .await
        .expect("pending pod retried")
        .expect("status");
    assert!(greeting(&ns).await.expect("dial").starts_with("c p1"));
    c.stop().await;
}

#[test]
fn sockets_are_made_in_the_pod_netns_and_the_thread_returns_home() {
    if !privileged() {
        return;
    }
    let ns = new_netns();
    let netns = Netns::from_fd(dup(&ns)).expect("netns");
    let sockets =
        InPodSockets::new(netns.clone(), crate::socket::SocketOptions::default()).expect("sockets");
    let link = || {
        std::fs::read_link("/proc/thread-self/ns/net")
            .expect("readlink")
            .display()
            .to_string()
    };
    let home = link();
    let inside = sockets.run(link).expect("run");
    assert_eq!(inside, format!("net:[{}]", netns.id().inode));
    assert_eq!(
        link(),
        home,
        "the calling thread is back in ztunnel's netns"
    );
    // A listener made through the factory lives in the pod: reachable from there only.
    use crate::socket::SocketFactory;
    let listener = sockets
        .tcp_listener("127.0.0.1:0".parse().expect("addr"))
        .expect("listener in the pod");
    let addr = listener.local_addr().expect("addr");
    let from_pod = sockets
        .run(move || std::net::TcpStream::connect(addr).map(|_| ()))
        .expect("run");
    assert!(from_pod.is_ok(), "{from_pod:?}");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "not in ztunnel's netns"
    );
    assert_eq!(link(), home);
}

#[test]
fn a_regular_file_is_not_a_netns() {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let err = Netns::open(file.path()).expect_err("not a netns");
    assert_eq!(err.reason(), "not_netns");
    let text = err.to_string();
    assert!(text.contains("a regular file"), "{text}");
    assert!(text.contains(&file.path().display().to_string()), "{text}");
    let err = Netns::open(Path::new("/proc/self/ns/uts")).expect_err("uts");
    assert!(
        err.to_string()
            .contains("uts namespace, not a network namespace"),
        "{err}"
    );
}

#[test]
fn parse_rejects_bad_datagrams() {
    let del = WorkloadRequest {
        payload: Some(Payload::Del(mesh_proto::workload::zds::DelWorkload {
            uid: "p1".into(),
        })),
    }
    .encode_to_vec();
    let ok = protocol::parse(&del, vec![], MsgFlags::empty()).expect("valid Del");
    assert!(matches!(ok, WorkloadMessage::Del { uid } if uid == "p1"));

    let file = || OwnedFd::from(tempfile::tempfile().expect("temp file"));
    let err = protocol::parse(&del, vec![file()], MsgFlags::empty()).expect_err("fd on Del");
    assert_eq!(err.reason(), "unexpected_fd");
    let err = protocol::parse(&del, vec![file(), file()], MsgFlags::empty()).expect_err("2 fds");
    assert_eq!(err.to_string(), "expected at most 1 file descriptor, got 2");
    let err = protocol::parse(&del, vec![], MsgFlags::MSG_TRUNC).expect_err("truncated");
    assert_eq!(err.reason(), "truncated");
    let err = protocol::parse(&[], vec![], MsgFlags::empty()).expect_err("empty");
    assert_eq!(err.reason(), "no_payload");
    let empty_uid = WorkloadRequest {
        payload: Some(Payload::Del(mesh_proto::workload::zds::DelWorkload {
            uid: String::new(),
        })),
    }
    .encode_to_vec();
    let err = protocol::parse(&empty_uid, vec![], MsgFlags::empty()).expect_err("no uid");
    assert_eq!(err.reason(), "empty_uid");
}

#[test]
fn workload_state_is_keyed_by_uid_and_a_successor_hides_its_draining_predecessor() {
    let status = InPodStatus::new();
    let pod = |uid: &str| PodInfo {
        uid: uid.to_string(),
        name: format!("{uid}-name"),
        namespace: "ns".to_string(),
        service_account: "sa".to_string(),
    };
    status.set(1, &pod("a"), ProxyState::Draining);
    status.set(2, &pod("a"), ProxyState::Pending);
    status.set(3, &pod("b"), ProxyState::Up);
    status.set(4, &pod("c"), ProxyState::Draining);
    let dump = serde_json::to_value(status.dump()).expect("json");
    assert_eq!(
        dump,
        serde_json::json!({
            "a": {"state": "Pending", "info": {"name": "a-name", "namespace": "ns", "serviceAccount": "sa"}},
            "b": {"state": "Up", "info": {"name": "b-name", "namespace": "ns", "serviceAccount": "sa"}},
            "c": {"state": "Draining", "info": {"name": "c-name", "namespace": "ns", "serviceAccount": "sa"}},
        })
    );
    // The order proxies were registered in does not matter.
    let status = InPodStatus::new();
    status.set(1, &pod("a"), ProxyState::Up);
    status.set(2, &pod("a"), ProxyState::Draining);
    assert_eq!(status.dump()["a"].state, ProxyState::Up);
}
