//! The xDS client feeding the proxy state: resources from a delta ADS server become lookups by
//! IP; a bad resource is NACKed by name and the state keeps its previous value.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use mesh_proto::type_url::{ADDRESS, AUTHORIZATION};
use mesh_proto::workload::{address, Address, TunnelProtocol, Workload};
use mesh_testutil::FakeAds;
use prost::Message;
use ztunnel::state::SharedState;
use ztunnel::xds::{NodeIdentity, XdsClient, XdsConfig};

const WAIT: Duration = Duration::from_secs(10);

fn workload(name: &str, ip: [u8; 4], sa: &str) -> Vec<u8> {
    Address {
        r#type: Some(address::Type::Workload(Workload {
            uid: format!("Kubernetes//Pod/demo/{name}"),
            name: name.into(),
            namespace: "demo".into(),
            addresses: vec![ip.to_vec()],
            service_account: sa.into(),
            tunnel_protocol: TunnelProtocol::Hbone as i32,
            node: "node1".into(),
            ..Default::default()
        })),
    }
    .encode_to_vec()
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn resources_become_lookups_and_bad_ones_are_nacked_without_losing_state() {
    let ads = FakeAds::start().await.expect("fake ADS");
    let uid = "Kubernetes//Pod/demo/server";
    ads.set(ADDRESS, uid, workload("server", [10, 244, 1, 10], "server"));
    let state = SharedState::default();
    let node = NodeIdentity {
        ip: "10.0.0.1".into(),
        pod_name: "ztunnel-x".into(),
        pod_namespace: "istio-system".into(),
        cluster_domain: "cluster.local".into(),
    };
    let mut config = XdsConfig::new(ads.url(), node);
    config.token_path = None; // plaintext fake: no token
    let client = XdsClient::new(config, Arc::new(state.clone())).expect("client");
    let mut ready = client.ready();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(client.run(async {
        let _ = stopped.await;
    }));
    if tokio::time::timeout(WAIT, ready.wait_for(|r| *r))
        .await
        .is_err()
    {
        panic!("not ready; requests: {:#?}", ads.requests());
    }
    let ip: IpAddr = "10.244.1.10".parse().expect("ip");
    let found = state
        .read()
        .workload_by_ip("", ip)
        .map(|w| w.service_account.clone());
    assert_eq!(found.as_deref(), Some("server"));

    // Garbage for the same name: NACKed naming it; the state keeps the previous workload.
    ads.set(ADDRESS, uid, vec![0xff, 0xff, 0x01]);
    eventually("a NACK naming the workload", || {
        ads.requests().iter().any(|r| {
            r.type_url == ADDRESS
                && r.error_detail
                    .as_ref()
                    .is_some_and(|(_, m)| m.contains(uid))
        })
    })
    .await;
    assert!(
        state.read().workload_by_ip("", ip).is_some(),
        "previous state kept"
    );

    // A good update afterwards still flows: the workload moves to a new IP.
    ads.set(ADDRESS, uid, workload("server", [10, 244, 1, 99], "server"));
    let moved: IpAddr = "10.244.1.99".parse().expect("ip");
    eventually("the new IP", || {
        state.read().workload_by_ip("", moved).is_some()
    })
    .await;
    assert!(
        state.read().workload_by_ip("", ip).is_none(),
        "old IP released"
    );
    assert!(ads.requests().iter().any(|r| r.type_url == AUTHORIZATION));

    let _ = stop.send(());
    tokio::time::timeout(WAIT, task)
        .await
        .expect("client stops")
        .expect("client task");
}
