//! Certificate client and manager against the fake CA of `mesh-testutil` (real gRPC on
//! loopback, real signing).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::prelude::{Engine, BASE64_STANDARD};
use mesh_identity::Identity;
use mesh_testutil::FakeCa;

use super::manager::{next_backoff, refresh_delay};
use super::*;

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa).expect("identity")
}

struct Setup {
    ca: FakeCa,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn new() -> Setup {
        let ca = FakeCa::start().await.expect("start fake CA");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("token"), "token-1\n").expect("write token");
        Setup { ca, dir }
    }

    fn token_path(&self) -> PathBuf {
        self.dir.path().join("token")
    }

    fn config(&self) -> CaClientConfig {
        CaClientConfig {
            address: self.ca.url(),
            root_cert_path: self.dir.path().join("missing-root.pem"),
            token_path: Some(self.token_path()),
            cluster_id: "cluster-7".to_string(),
            ..CaClientConfig::new(self.ca.url())
        }
    }

    fn client(&self) -> GrpcCaClient {
        GrpcCaClient::new(self.config()).expect("client")
    }

    fn manager(&self) -> CertManager {
        CertManager::new(Arc::new(self.client()), CertManagerOptions::default())
    }
}

/// Polls `check` every 50 ms until it holds or `limit` passes.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

#[tokio::test]
async fn client_sends_csr_token_cluster_and_impersonation() {
    let s = Setup::new().await;
    let cert = s.client().fetch(&id("app")).await.expect("issued");
    assert_eq!(cert.identity, id("app"));
    assert_eq!(cert.chain.len(), 2, "leaf then root");
    assert_eq!(cert.root_pem(), Some(s.ca.root_pem()));
    assert_eq!(cert.cert_key.chain.len(), 2);
    assert!(cert.is_valid_at(SystemTime::now()));
    let lifetime = cert
        .not_after
        .duration_since(SystemTime::now())
        .expect("in the future");
    assert!(lifetime > Duration::from_secs(23 * 3600), "{lifetime:?}");
    assert!(!format!("{cert:?}").contains("PRIVATE KEY"));
    let requests = s.ca.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.identity, Some(id("app")));
    assert_eq!(
        r.impersonated_identity.as_deref(),
        Some("spiffe://cluster.local/ns/default/sa/app")
    );
    assert_eq!(r.bearer_token.as_deref(), Some("token-1"));
    assert_eq!(r.cluster_id.as_deref(), Some("cluster-7"));
    assert_eq!(r.validity_duration, 86_400);
}

#[tokio::test]
async fn dedicated_mode_sends_no_impersonation() {
    let s = Setup::new().await;
    let config = CaClientConfig {
        impersonate: false,
        token_path: None,
        ..s.config()
    };
    let client = GrpcCaClient::new(config).expect("client");
    client.fetch(&id("app")).await.expect("issued");
    let r = &s.ca.requests()[0];
    assert_eq!(r.impersonated_identity, None);
    assert_eq!(r.bearer_token, None);
    assert_eq!(r.identity, Some(id("app")), "identity taken from the CSR");
}

#[tokio::test]
async fn token_file_is_read_on_every_request() {
    let s = Setup::new().await;
    let client = s.client();
    client.fetch(&id("a")).await.expect("first");
    std::fs::write(s.token_path(), "token-2").expect("rotate token");
    client.fetch(&id("a")).await.expect("second");
    let tokens: Vec<_> =
        s.ca.requests()
            .into_iter()
            .map(|r| r.bearer_token)
            .collect();
    assert_eq!(
        tokens,
        vec![Some("token-1".to_string()), Some("token-2".to_string())]
    );
    std::fs::remove_file(s.token_path()).expect("remove token");
    let err = client.fetch(&id("a")).await.expect_err("no token");
    assert_eq!(err.reason(), "token");
    assert!(err.to_string().contains("istio-ca"), "{err}");
}

#[tokio::test]
async fn response_for_another_identity_is_rejected() {
    let s = Setup::new().await;
    s.ca.set_issue_for(Some(id("intruder")));
    let err = s.client().fetch(&id("app")).await.expect_err("wrong SAN");
    assert_eq!(err.reason(), "wrong_identity", "{err}");
    assert!(err.to_string().contains("sa/intruder"), "{err}");
}

#[tokio::test]
async fn tls_to_the_ca_is_verified_with_the_root_file() {
    let ca = FakeCa::start_tls().await.expect("start TLS fake CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root-cert.pem");
    std::fs::write(&root, ca.root_pem()).expect("write root");
    let config = CaClientConfig {
        root_cert_path: root.clone(),
        token_path: None,
        ..CaClientConfig::new(ca.url())
    };
    let client = GrpcCaClient::new(config.clone()).expect("client");
    let cert = client.fetch(&id("app")).await.expect("issued over TLS");
    assert_eq!(cert.identity, id("app"));

    let other = FakeCa::start().await.expect("second CA");
    std::fs::write(&root, other.root_pem()).expect("write foreign root");
    let client = GrpcCaClient::new(config).expect("client");
    let err = client.fetch(&id("app")).await.expect_err("untrusted CA");
    assert_eq!(err.reason(), "rpc", "{err}");
    assert_eq!(
        ca.requests().len(),
        1,
        "the handshake fails before any request"
    );
}

#[test]
fn bad_configuration_is_reported() {
    let err = GrpcCaClient::new(CaClientConfig::new("istiod:15012")).expect_err("no scheme");
    assert_eq!(err.reason(), "bad_address");
    let mut config = CaClientConfig::new("https://localhost:15012");
    config.root_cert_path = PathBuf::from("/nonexistent/root-cert.pem");
    let err = GrpcCaClient::new(config).expect_err("no root");
    assert_eq!(err.reason(), "root_cert");
    assert!(err.to_string().contains("/nonexistent/root-cert.pem"));
}

#[tokio::test]
async fn manager_issues_and_caches() {
    let s = Setup::new().await;
    let manager = s.manager();
    let first = manager.fetch_certificate(&id("app")).await.expect("issued");
    let again = manager.fetch_certificate(&id("app")).await.expect("cached");
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(s.ca.requests_for(&id("app")), 1);
    assert_eq!(manager.identities(), vec![id("app")]);

    let dump = manager.snapshot();
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].identity, "spiffe://cluster.local/ns/default/sa/app");
    assert_eq!(dump[0].state, "Available");
    // Upstream's shape: the leaf in certChain, the root apart, PEM text in base64.
    assert_eq!(dump[0].cert_chain.len(), 1);
    assert_eq!(dump[0].root_certs.len(), 1);
    assert_eq!(dump[0].cert_chain[0].serial_number, first.serial);
    assert!(
        first.serial.bytes().all(|b| b.is_ascii_digit()),
        "{}",
        first.serial
    );
    assert_eq!(
        dump[0].cert_chain[0].expiration_time,
        rfc3339(first.not_after)
    );
    let root_pem = BASE64_STANDARD
        .decode(&dump[0].root_certs[0].pem)
        .expect("base64");
    assert_eq!(
        String::from_utf8(root_pem).expect("utf-8").trim(),
        s.ca.root_pem().trim()
    );
    assert!(dump[0].cert_chain[0]
        .pem
        .starts_with("LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t"));
    let json = serde_json::to_value(&dump).expect("json");
    assert!(json[0]["certChain"][0]["validFrom"].is_string(), "{json}");
    assert!(
        json[0]["rootCerts"][0]["serialNumber"].is_string(),
        "{json}"
    );

    assert!(manager.forget(&id("app")));
    assert!(!manager.forget(&id("app")));
    assert!(manager.snapshot().is_empty());
    manager.fetch_certificate(&id("app")).await.expect("again");
    assert_eq!(s.ca.requests_for(&id("app")), 2, "forgotten: fetched anew");
}

#[tokio::test]
async fn concurrent_callers_share_one_request() {
    let s = Setup::new().await;
    s.ca.set_delay(Some(Duration::from_millis(300)));
    let manager = s.manager();
    let calls = (0..10).map(|_| {
        let manager = manager.clone();
        tokio::spawn(async move { manager.fetch_certificate(&id("app")).await })
    });
    let certs: Vec<Arc<WorkloadCert>> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|joined| joined.expect("join").expect("issued"))
        .collect();
    assert!(certs.iter().all(|c| Arc::ptr_eq(c, &certs[0])));
    assert_eq!(s.ca.requests_for(&id("app")), 1);
}

#[tokio::test]
async fn failing_ca_is_retried_with_backoff() {
    let s = Setup::new().await;
    s.ca.fail_next(2);
    let manager = s.manager();
    let err = manager
        .fetch_certificate(&id("app"))
        .await
        .expect_err("first attempt fails");
    assert_eq!(err.reason(), "unavailable");
    assert!(err.to_string().contains("Unavailable"), "{err}");
    let dump = manager.snapshot();
    assert!(dump[0].state.starts_with("Unavailable"), "{dump:?}");

    let mut fetched = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while fetched.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        fetched = manager.fetch_certificate(&id("app")).await.ok();
    }
    assert!(
        fetched.is_some(),
        "the CA recovered but no certificate came"
    );
    let times: Vec<Instant> = s.ca.requests().iter().map(|r| r.received_at).collect();
    assert_eq!(times.len(), 3, "two failures then a success");
    assert!(
        times[1] - times[0] >= Duration::from_millis(450),
        "{times:?}"
    );
    assert!(
        times[2] - times[1] >= Duration::from_millis(950),
        "{times:?}"
    );
}

#[tokio::test]
async fn other_identities_are_served_while_one_fails() {
    let s = Setup::new().await;
    s.ca.fail_identity(&id("broken"));
    s.ca.set_delay(Some(Duration::from_millis(200)));
    let manager = s.manager();
    let broken = {
        let manager = manager.clone();
        tokio::spawn(async move { manager.fetch_certificate(&id("broken")).await })
    };
    let fine = tokio::time::timeout(
        Duration::from_secs(5),
        manager.fetch_certificate(&id("fine")),
    )
    .await
    .expect("not blocked by the failing identity")
    .expect("issued");
    assert_eq!(fine.identity, id("fine"));
    let err = broken.await.expect("join").expect_err("still failing");
    assert_eq!(err.reason(), "unavailable");

    s.ca.heal(&id("broken"));
    let recovered = eventually(Duration::from_secs(15), || {
        manager
            .snapshot()
            .iter()
            .any(|d| d.identity.ends_with("sa/broken") && d.state == "Available")
    })
    .await;
    assert!(recovered, "{:?}", manager.snapshot());
}

#[tokio::test]
async fn short_lived_certificate_is_refreshed_before_expiry() {
    let s = Setup::new().await;
    s.ca.set_ttl(Some(Duration::from_secs(4)));
    let manager = s.manager();
    let first = manager.fetch_certificate(&id("app")).await.expect("issued");
    let issued = Instant::now();
    let refreshed = eventually(Duration::from_secs(10), || {
        s.ca.requests_for(&id("app")) >= 2
    })
    .await;
    assert!(refreshed, "no refresh within 10 s of a 4 s certificate");
    let waited = issued.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "refreshed too early: {waited:?}"
    );
    let second_request = SystemTime::now();
    assert!(second_request < first.not_after + Duration::from_secs(1));
    let ok = eventually(Duration::from_secs(5), || {
        manager.snapshot()[0].cert_chain[0].serial_number != first.serial
    })
    .await;
    assert!(ok, "the refreshed certificate replaced the old one");
    let second = manager.fetch_certificate(&id("app")).await.expect("cached");
    assert!(second.not_after > first.not_after);
}

#[tokio::test]
async fn prefetch_fetches_in_the_background() {
    let s = Setup::new().await;
    let manager = s.manager();
    manager.prefetch(&id("a"));
    manager.prefetch(&id("a"));
    let done = eventually(Duration::from_secs(5), || {
        manager
            .snapshot()
            .first()
            .is_some_and(|d| d.state == "Available")
    })
    .await;
    assert!(done, "{:?}", manager.snapshot());
    manager.fetch_certificate(&id("a")).await.expect("cached");
    assert_eq!(s.ca.requests_for(&id("a")), 1);
}

#[test]
fn backoff_doubles_to_the_cap() {
    let mut delay = DEFAULT_INITIAL_BACKOFF;
    let mut seen = vec![delay];
    for _ in 0..12 {
        delay = next_backoff(delay, DEFAULT_MAX_BACKOFF);
        seen.push(delay);
    }
    assert_eq!(seen[1], Duration::from_secs(1));
    assert_eq!(seen[2], Duration::from_secs(2));
    assert_eq!(*seen.last().expect("last"), Duration::from_secs(150));
}

#[tokio::test]
async fn refresh_is_at_half_life() {
    let s = Setup::new().await;
    let cert = s.client().fetch(&id("app")).await.expect("issued");
    let now = SystemTime::now();
    let delay = refresh_delay(&cert, now);
    // 24 h certificate, backdated by a minute: refresh after ~12 h.
    assert!(delay > Duration::from_secs(11 * 3600), "{delay:?}");
    assert!(delay < Duration::from_secs(13 * 3600), "{delay:?}");
    let late = cert.not_after + Duration::from_secs(1);
    assert_eq!(refresh_delay(&cert, late), Duration::ZERO);
}

/// Delegates to the fake CA, except that requests for `sa/slow` wait for `gate`.
struct GatedClient {
    inner: GrpcCaClient,
    gate: Arc<tokio::sync::Notify>,
}

impl CaClient for GatedClient {
    fn fetch<'a>(
        &'a self,
        identity: &'a Identity,
    ) -> futures::future::BoxFuture<'a, Result<WorkloadCert, CertError>> {
        Box::pin(async move {
            if identity.service_account() == "slow" {
                self.gate.notified().await;
            }
            self.inner.fetch(identity).await
        })
    }
}

#[tokio::test]
async fn on_path_request_jumps_the_prefetch_queue() {
    let s = Setup::new().await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let client = GatedClient {
        inner: s.client(),
        gate: gate.clone(),
    };
    let options = CertManagerOptions {
        prefetch_concurrency: 1,
        ..CertManagerOptions::default()
    };
    let manager = CertManager::new(Arc::new(client), options);
    manager.prefetch(&id("slow"));
    let holds_slot = eventually(Duration::from_secs(5), || {
        manager.snapshot()[0].state == "Initializing"
    })
    .await;
    assert!(holds_slot);
    tokio::time::sleep(Duration::from_millis(100)).await;
    manager.prefetch(&id("queued"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        s.ca.requests_for(&id("queued")),
        0,
        "waits behind the prefetch"
    );
    let cert = tokio::time::timeout(
        Duration::from_secs(5),
        manager.fetch_certificate(&id("queued")),
    )
    .await
    .expect("the on-path request does not wait for the low-priority slot")
    .expect("issued");
    assert_eq!(cert.identity, id("queued"));
    gate.notify_one();
    let slow = tokio::time::timeout(
        Duration::from_secs(5),
        manager.fetch_certificate(&id("slow")),
    )
    .await
    .expect("released")
    .expect("issued");
    assert_eq!(slow.identity, id("slow"));
}
