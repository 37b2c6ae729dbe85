use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};
use mesh_testutil::{FakeAds, RecordedDeltaRequest};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::*;

const WAIT: Duration = Duration::from_secs(10);

type State = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

/// Holds resources by type; rejects any body equal to `bad`, keeping the previous value.
#[derive(Default)]
struct TestHandler {
    state: Mutex<State>,
    /// Types in the order of calls.
    calls: Mutex<Vec<String>>,
}

impl Handler for TestHandler {
    fn apply(
        &self,
        type_url: &str,
        updated: &[(String, Vec<u8>)],
        removed: &[String],
    ) -> Result<(), Vec<(String, String)>> {
        self.calls.lock().expect("lock").push(type_url.to_string());
        let mut state = self.state.lock().expect("lock");
        let map = state.entry(type_url.to_string()).or_default();
        let mut rejected = Vec::new();
        for (name, body) in updated {
            if body == b"bad" {
                rejected.push((name.clone(), "body is bad".to_string()));
            } else {
                map.insert(name.clone(), body.clone());
            }
        }
        for name in removed {
            map.remove(name);
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(rejected)
        }
    }
}

impl TestHandler {
    fn names(&self, type_url: &str) -> Vec<String> {
        let state = self.state.lock().expect("lock");
        state
            .get(type_url)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn get(&self, type_url: &str, name: &str) -> Option<Vec<u8>> {
        let state = self.state.lock().expect("lock");
        state.get(type_url).and_then(|m| m.get(name).cloned())
    }

    fn snapshot(&self) -> State {
        self.state.lock().expect("lock").clone()
    }

    async fn wait_names(&self, type_url: &str, want: &[&str]) {
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.names(type_url) != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "handler has {:?} of {type_url}, want {want:?}",
                self.names(type_url)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

struct Running {
    ads: FakeAds,
    handler: Arc<TestHandler>,
    ready: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl Running {
    fn token_path(&self) -> std::path::PathBuf {
        self.dir.path().join("token")
    }

    async fn wait_ready(&mut self) {
        tokio::time::timeout(WAIT, self.ready.wait_for(|r| *r))
            .await
            .expect("ready in time")
            .expect("client alive");
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).expect("client still running");
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("client stops on shutdown")
            .expect("client task");
    }
}

fn node() -> NodeIdentity {
    NodeIdentity {
        ip: "10.0.0.7".to_string(),
        pod_name: "ztunnel-abc".to_string(),
        pod_namespace: "istio-system".to_string(),
        cluster_domain: "cluster.local".to_string(),
    }
}

/// Starts a client against `ads` with a token file holding `token-1`.
fn start(ads: FakeAds) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("token"), "token-1\n").expect("write token");
    let mut config = XdsConfig::new(ads.url(), node());
    config.token_path = Some(dir.path().join("token"));
    config.cluster_id = "Kubernetes".to_string();
    config.istio_version = "1.99.0".to_string();
    let handler = Arc::new(TestHandler::default());
    let client = XdsClient::new(config, handler.clone()).expect("client");
    let ready = client.ready();
    assert!(!*ready.borrow(), "not ready before any response");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(client.run(async {
        let _ = stopped.await;
    }));
    Running {
        ads,
        handler,
        ready,
        stop: Some(stop),
        task,
        dir,
    }
}

fn acks(requests: &[RecordedDeltaRequest], type_url: &str) -> usize {
    let acked = |r: &&RecordedDeltaRequest| r.type_url == type_url && r.is_ack();
    requests.iter().filter(acked).count()
}

/// Waits until every response of `type_url` sent so far has been ACKed.
async fn wait_all_acked(ads: &FakeAds, type_url: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let sent = ads
            .responses()
            .iter()
            .filter(|r| r.type_url == type_url)
            .count();
        let acked = acks(&ads.requests(), type_url);
        if sent > 0 && sent == acked {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{acked} ACKs for {sent} responses of {type_url}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn node_id_and_nack_message_follow_istio() {
    assert_eq!(
        node().node_id(),
        "ztunnel~10.0.0.7~ztunnel-abc.istio-system~istio-system.svc.cluster.local"
    );
    let rejected = [("a".to_string(), "x".to_string())];
    let message = rejection_message(ADDRESS, &rejected);
    assert!(
        message.contains("a: x") && message.contains("wds"),
        "{message}"
    );
}

#[test]
fn bad_addresses_are_reported() {
    let handler: Arc<dyn Handler> = Arc::new(TestHandler::default());
    let err = XdsClient::new(XdsConfig::new("ftp://x:1", node()), handler.clone())
        .expect_err("bad scheme");
    assert_eq!(err.reason(), "bad_address");
    let mut config = XdsConfig::new("https://istiod:15012", node());
    config.root_cert_path = "/nonexistent/root.pem".into();
    let err = XdsClient::new(config, handler).expect_err("no root");
    assert_eq!(err.reason(), "root_cert");
}

#[tokio::test]
async fn initial_state_is_applied_acked_and_ready_after_both_types() {
    let ads = FakeAds::start().await.expect("fake ADS");
    ads.require_token(Some("token-1"));
    ads.set(ADDRESS, "w1", b"one".to_vec());
    ads.set(ADDRESS, "w2", b"two".to_vec());
    ads.set(AUTHORIZATION, "ns/p", b"policy".to_vec());
    let mut run = start(ads);
    run.wait_ready().await;
    let calls = run.handler.calls.lock().expect("lock").clone();
    assert!(calls.iter().any(|t| t == ADDRESS) && calls.iter().any(|t| t == AUTHORIZATION));
    assert_eq!(run.handler.names(ADDRESS), vec!["w1", "w2"]);
    assert_eq!(run.handler.names(AUTHORIZATION), vec!["ns/p"]);
    run.ads
        .wait_for("ACKs of both types", |r| {
            acks(r, ADDRESS) == 1 && acks(r, AUTHORIZATION) == 1
        })
        .await;
    let requests = run.ads.requests();
    let first = &requests[0];
    assert_eq!(first.node_id.as_deref(), Some(node().node_id().as_str()));
    assert_eq!(first.node_metadata["CLUSTER_ID"], "Kubernetes");
    assert_eq!(first.node_metadata["ISTIO_VERSION"], "1.99.0");
    assert!(
        first.subscribe.is_empty() && first.unsubscribe.is_empty(),
        "wildcard"
    );
    assert!(requests
        .iter()
        .all(|r| r.bearer_token.as_deref() == Some("token-1")));
    assert!(requests.iter().all(|r| !r.is_nack()));
    run.shutdown().await;
}

#[tokio::test]
async fn a_first_response_of_many_megabytes_is_applied() {
    // A large mesh's first Address response is far past gRPC's usual 4 MiB limit: 12 MB here,
    // in one response, over many HTTP/2 windows.
    let ads = FakeAds::start().await.expect("fake ADS");
    let body = vec![b'w'; 200_000];
    let names: Vec<String> = (0..60).map(|i| format!("w{i:02}")).collect();
    for name in &names {
        ads.set(ADDRESS, name, body.clone());
    }
    ads.set(AUTHORIZATION, "ns/p", b"policy".to_vec());
    let mut run = start(ads);
    run.wait_ready().await;
    assert_eq!(run.handler.names(ADDRESS), names);
    assert_eq!(run.handler.get(ADDRESS, "w59"), Some(body));
    let first = run
        .ads
        .responses()
        .into_iter()
        .find(|r| r.type_url == ADDRESS)
        .expect("an Address response");
    assert_eq!(first.resources.len(), 60, "all in one response");
    wait_all_acked(&run.ads, ADDRESS).await;
    assert_eq!(run.ads.connections(), 1, "no reconnect");
    run.shutdown().await;
}

#[tokio::test]
async fn updates_and_removals_flow() {
    let ads = FakeAds::start().await.expect("fake ADS");
    ads.set(ADDRESS, "w1", b"one".to_vec());
    let run = start(ads);
    run.handler.wait_names(ADDRESS, &["w1"]).await;
    run.ads.set(ADDRESS, "w1", b"one-v2".to_vec());
    run.ads.set(ADDRESS, "w2", b"two".to_vec());
    run.handler.wait_names(ADDRESS, &["w1", "w2"]).await;
    assert_eq!(run.handler.get(ADDRESS, "w1"), Some(b"one-v2".to_vec()));
    run.ads.remove(ADDRESS, "w1");
    run.handler.wait_names(ADDRESS, &["w2"]).await;
    wait_all_acked(&run.ads, ADDRESS).await;
    assert!(run.ads.requests().iter().all(|r| !r.is_nack()));
    run.shutdown().await;
}

#[tokio::test]
async fn rejected_resources_are_nacked_by_name_and_later_updates_flow() {
    let ads = FakeAds::start().await.expect("fake ADS");
    ads.set(ADDRESS, "w1", b"good".to_vec());
    let run = start(ads);
    run.handler.wait_names(ADDRESS, &["w1"]).await;
    run.ads.set(ADDRESS, "w1", b"bad".to_vec());
    run.ads
        .wait_for("the NACK", |r| r.iter().any(RecordedDeltaRequest::is_nack))
        .await;
    let requests = run.ads.requests();
    let nack = requests.iter().find(|r| r.is_nack()).expect("nack");
    let (code, message) = nack.error_detail.clone().expect("detail");
    assert_eq!(code, 3);
    assert!(
        message.contains("w1") && message.contains("body is bad"),
        "{message}"
    );
    assert_eq!(run.handler.get(ADDRESS, "w1"), Some(b"good".to_vec()));

    run.ads.set(ADDRESS, "w2", b"fine".to_vec());
    run.handler.wait_names(ADDRESS, &["w1", "w2"]).await;
    run.ads
        .wait_for("the ACK after the NACK", |r| {
            r.last().is_some_and(RecordedDeltaRequest::is_ack)
        })
        .await;
    assert_eq!(run.handler.get(ADDRESS, "w1"), Some(b"good".to_vec()));
    run.shutdown().await;
}

#[tokio::test]
async fn reconnects_with_what_it_holds_and_gets_only_differences() {
    let ads = FakeAds::start().await.expect("fake ADS");
    ads.set(ADDRESS, "keep", b"k".to_vec());
    ads.set(ADDRESS, "change", b"c1".to_vec());
    ads.set(ADDRESS, "gone", b"g".to_vec());
    ads.set(AUTHORIZATION, "ns/p", b"p".to_vec());
    let mut run = start(ads);
    run.handler
        .wait_names(ADDRESS, &["change", "gone", "keep"])
        .await;
    run.ads
        .wait_for("ACKs", |r| {
            acks(r, ADDRESS) == 1 && acks(r, AUTHORIZATION) == 1
        })
        .await;
    let held_addresses = run.ads.versions(ADDRESS);
    let held_policies = run.ads.versions(AUTHORIZATION);

    run.ads.stop().await;
    run.ads.set(ADDRESS, "change", b"c2".to_vec());
    run.ads.remove(ADDRESS, "gone");
    run.ads.set(ADDRESS, "new", b"n".to_vec());
    let before = run.handler.snapshot();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        run.handler.snapshot(),
        before,
        "untouched while istiod is away"
    );

    std::fs::write(run.token_path(), "token-2").expect("rotate token");
    run.ads.require_token(Some("token-2"));
    run.ads.restart().await.expect("restart on the same port");
    run.handler
        .wait_names(ADDRESS, &["change", "keep", "new"])
        .await;
    assert_eq!(run.handler.get(ADDRESS, "change"), Some(b"c2".to_vec()));

    let requests = run.ads.requests();
    let second = run.ads.connections();
    let initial = |type_url: &str| {
        requests
            .iter()
            .find(|r| r.connection == second && r.type_url == type_url)
            .map(|r| r.initial_resource_versions.clone())
            .expect("initial request on the new stream")
    };
    assert_eq!(initial(ADDRESS), held_addresses);
    assert_eq!(initial(AUTHORIZATION), held_policies);
    assert!(requests
        .iter()
        .filter(|r| r.connection == second)
        .all(|r| r.bearer_token.as_deref() == Some("token-2")));
    let responses = run.ads.responses();
    let diff = responses
        .iter()
        .find(|r| r.connection == second && r.type_url == ADDRESS)
        .expect("address response on the new stream");
    let names: BTreeSet<&str> = diff.resources.iter().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["change", "new"]));
    assert_eq!(diff.removed, vec!["gone".to_string()]);
    let policies = responses
        .iter()
        .find(|r| r.connection == second && r.type_url == AUTHORIZATION)
        .expect("authorization response on the new stream");
    assert!(policies.resources.is_empty() && policies.removed.is_empty());
    run.shutdown().await;
}
