//! The agent's ZDS server against a ztunnel-side client over a real SOCK_SEQPACKET socket.

mod agent_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_support::{netns_id_of_fd, netns_id_of_path, TestZtunnel, WAIT};
use cni_node::zds_server::{ZdsError, ZdsHandle, ZdsServer};
use mesh_proto::workload::zds::{workload_request::Payload, WorkloadInfo};
use mesh_testutil::{netns::have_root, TestNet};

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.to_string(),
        namespace: "apps".to_string(),
        service_account: "sa".to_string(),
    }
}

struct Server {
    _dir: tempfile::TempDir,
    path: PathBuf,
    handle: ZdsHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ztunnel/ztunnel.sock");
        let server = ZdsServer::bind(&path).expect("bind");
        let handle = server.handle();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Server {
            _dir: dir,
            path,
            handle,
            stop: Some(stop),
            task,
        }
    }

    /// A file standing in for a netns (the server only opens and passes it).
    fn fake_netns(&self, name: &str) -> PathBuf {
        let path = self._dir.path().join(name);
        std::fs::write(&path, "").expect("fake netns");
        path
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("server stopped in time")
            .expect("server task");
        assert!(!self.path.exists(), "socket file removed on stop");
    }
}

async fn wait_connected(handle: &ZdsHandle, want: bool) {
    let mut rx = handle.connected();
    tokio::time::timeout(WAIT, rx.wait_for(|c| *c == want))
        .await
        .expect("connected state in time")
        .expect("server alive");
}

fn uid_of(payload: &Payload) -> String {
    match payload {
        Payload::Add(a) => a.uid.clone(),
        Payload::Keep(k) => k.uid.clone(),
        Payload::Del(d) => d.uid.clone(),
        Payload::SnapshotSent(_) => String::new(),
    }
}

#[tokio::test]
async fn add_without_ztunnel_fails_and_the_pod_waits_for_the_snapshot() {
    let server = Server::start();
    let netns = server.fake_netns("p1");
    let err = server
        .handle
        .add("uid-1", info("p1"), &netns)
        .await
        .expect_err("no ztunnel");
    assert!(matches!(err, ZdsError::NoConnection), "{err}");
    assert!(err.to_string().contains("no ztunnel connection"), "{err}");
    assert_eq!(server.handle.cached(), vec!["uid-1".to_string()]);

    let zt = TestZtunnel::hello(&server.path).await;
    let snapshot = zt.take_snapshot().await;
    let names: Vec<String> = snapshot.iter().map(|r| r.describe()).collect();
    assert_eq!(names, vec!["add uid-1"]);
    wait_connected(&server.handle, true).await;

    // Del with ztunnel gone only updates the cache.
    drop(zt);
    wait_connected(&server.handle, false).await;
    server
        .handle
        .del("uid-1")
        .await
        .expect("del without ztunnel");
    assert!(server.handle.cached().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn missing_netns_fails_the_add() {
    let server = Server::start();
    let err = server
        .handle
        .add("uid-1", info("p1"), Path::new("/nonexistent/netns"))
        .await
        .expect_err("netns missing");
    assert_eq!(err.reason(), "netns", "{err}");
    assert!(server.handle.cached().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn snapshot_passes_real_netns_fds_and_keeps_pods_whose_netns_is_gone() {
    if !have_root("snapshot_passes_real_netns_fds_and_keeps_pods_whose_netns_is_gone") {
        return;
    }
    let mut net = TestNet::new("zds").expect("test net");
    let a = net.add_bare_netns("a").expect("netns a");
    let b = net.add_bare_netns("b").expect("netns b");
    let server = Server::start();
    server.handle.remember("uid-a", info("a"), &a.path());
    server.handle.remember("uid-b", info("b"), &b.path());
    server.handle.remember(
        "uid-gone",
        info("gone"),
        Path::new("/var/run/netns/no-such-netns"),
    );

    let zt = TestZtunnel::hello(&server.path).await;
    let mut snapshot = zt.take_snapshot().await;
    snapshot.sort_by_key(|r| uid_of(&r.payload));
    let names: Vec<String> = snapshot.iter().map(|r| r.describe()).collect();
    assert_eq!(names, vec!["add uid-a", "add uid-b", "keep uid-gone"]);
    let mut items = snapshot.into_iter();
    for expected in [&a, &b] {
        let item = items.next().expect("item");
        let Payload::Add(add) = &item.payload else {
            panic!("not an add")
        };
        assert_eq!(
            add.workload_info,
            Some(info(expected.name().rsplit('-').next().unwrap_or("")))
        );
        let fd = item.fd.expect("netns fd with the add");
        assert_eq!(netns_id_of_fd(fd), netns_id_of_path(&expected.path()));
    }
    assert!(
        items.next().expect("keep").fd.is_none(),
        "keep carries no fd"
    );
    wait_connected(&server.handle, true).await;
    server.stop().await;
    assert!(zt.closed().await, "connection closed on stop");
}

#[tokio::test]
async fn live_add_and_del_are_acked_and_a_nack_is_surfaced() {
    let server = Server::start();
    let zt = TestZtunnel::hello(&server.path).await;
    assert!(zt.take_snapshot().await.is_empty());
    wait_connected(&server.handle, true).await;
    let netns = server.fake_netns("p1");

    let handle = server.handle.clone();
    let path = netns.clone();
    let add = tokio::spawn(async move { handle.add("uid-1", info("p1"), &path).await });
    let request = zt.recv().await.expect("add");
    assert_eq!(request.describe(), "add uid-1");
    assert_eq!(
        netns_id_of_fd(request.fd.expect("fd")),
        netns_id_of_path(&netns)
    );
    zt.ack().await;
    add.await.expect("task").expect("acked");

    let handle = server.handle.clone();
    let path = netns.clone();
    let add = tokio::spawn(async move { handle.add("uid-2", info("p2"), &path).await });
    assert_eq!(zt.recv().await.expect("add").describe(), "add uid-2");
    zt.nack("cannot enter netns: bad fd").await;
    let err = add.await.expect("task").expect_err("nacked");
    assert!(matches!(err, ZdsError::Nack { .. }), "{err}");
    assert!(
        err.to_string().contains("cannot enter netns: bad fd"),
        "{err}"
    );

    let handle = server.handle.clone();
    let del = tokio::spawn(async move { handle.del("uid-1").await });
    let request = zt.recv().await.expect("del");
    assert_eq!(request.describe(), "del uid-1");
    assert!(request.fd.is_none());
    zt.ack().await;
    del.await.expect("task").expect("del acked");
    server.stop().await;
}

#[tokio::test]
async fn newest_connection_gets_adds_and_every_connection_gets_dels() {
    let server = Server::start();
    let old = TestZtunnel::hello(&server.path).await;
    old.take_snapshot().await;
    let new = TestZtunnel::hello(&server.path).await;
    new.take_snapshot().await;
    let netns = server.fake_netns("p1");

    let handle = server.handle.clone();
    let path = netns.clone();
    let add = tokio::spawn(async move { handle.add("uid-1", info("p1"), &path).await });
    assert_eq!(new.recv().await.expect("add").describe(), "add uid-1");
    new.ack().await;
    add.await.expect("task").expect("acked");
    assert!(
        old.try_recv(Duration::from_millis(300)).await.is_none(),
        "the older ztunnel gets no add (and is not closed)"
    );

    let handle = server.handle.clone();
    let del = tokio::spawn(async move { handle.del("uid-1").await });
    for zt in [&old, &new] {
        assert_eq!(zt.recv().await.expect("del").describe(), "del uid-1");
        zt.ack().await;
    }
    del.await.expect("task").expect("both acked");

    // The newest leaving makes the older one the target again.
    drop(new);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let handle = server.handle.clone();
    let add = tokio::spawn(async move { handle.add("uid-2", info("p2"), &netns).await });
    assert_eq!(old.recv().await.expect("add").describe(), "add uid-2");
    old.ack().await;
    add.await
        .expect("task")
        .expect("acked by the older ztunnel");
    server.stop().await;
}

#[tokio::test]
async fn bad_hellos_are_rejected_without_affecting_the_next_connection() {
    let server = Server::start();
    server
        .handle
        .remember("uid-1", info("p1"), &server.fake_netns("p1"));

    let garbage = TestZtunnel::connect(&server.path).expect("connect");
    garbage
        .send_raw(b"\xff\xff\xff\xff not a protobuf")
        .await
        .expect("send");
    assert!(
        garbage.closed().await,
        "garbage hello closes that connection"
    );

    let wrong_version = TestZtunnel::connect(&server.path).expect("connect");
    wrong_version.send_raw(&[0x08, 0x02]).await.expect("send"); // version = 2
    assert!(
        wrong_version.closed().await,
        "unknown version closes that connection"
    );

    let good = TestZtunnel::hello(&server.path).await;
    let names: Vec<String> = good
        .take_snapshot()
        .await
        .iter()
        .map(|r| r.describe())
        .collect();
    assert_eq!(names, vec!["add uid-1"]);
    wait_connected(&server.handle, true).await;
    server.stop().await;
}

#[tokio::test]
async fn unexpected_message_from_ztunnel_closes_the_connection() {
    let server = Server::start();
    let zt = TestZtunnel::hello(&server.path).await;
    zt.take_snapshot().await;
    wait_connected(&server.handle, true).await;
    zt.send_raw(b"unasked").await.expect("send");
    assert!(zt.closed().await);
    wait_connected(&server.handle, false).await;
    server.stop().await;
}
