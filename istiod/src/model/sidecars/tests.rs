//! The sidecar index through the model: which pods get a configuration, their inbound ports
//! and modes, and regeneration that pushes only what changed.

use mesh_api::{Kind, ObjectKey};
use mesh_proto::envoy::pb::envoy::config::listener::v3::Listener;
use mesh_proto::type_url;
use mesh_xds::XdsSnapshot;
use prost::Message;
use serde_json::json;

use crate::envoy::WaypointKey;
use crate::model::testing::{authz, namespace, obj, peer_auth, pod_json, service};
use crate::model::{Model, ModelConfig, Snapshot};

fn key(name: &str) -> WaypointKey {
    WaypointKey {
        namespace: "legacy".into(),
        name: name.into(),
    }
}

/// A pod the injector gave a sidecar.
fn injected(name: &str, ip: &str) -> mesh_api::Object {
    let mut v = pod_json(
        "legacy",
        name,
        ip,
        json!({"app": "echo", "security.istio.io/tlsMode": "istio"}),
    );
    v["metadata"]["annotations"] = json!({"sidecar.istio.io/status": "{}"});
    obj(v)
}

fn legacy() -> Model {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("legacy", json!({"istio-injection": "enabled"})));
    m.apply(service(
        "legacy",
        "echo",
        json!({"app": "echo"}),
        "10.96.0.10",
    ));
    m.apply(injected("echo-1", "10.1.0.5"));
    m
}

fn names(s: &Snapshot, pod: &str, type_url: &str) -> Vec<String> {
    s.sidecar(&key(pod))
        .get(type_url)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// `(chain name, destination port)` of the pod's `virtualInbound`.
fn inbound_chains(s: &Snapshot, pod: &str) -> Vec<(String, Option<u32>)> {
    let lds = s.sidecar(&key(pod)).get(type_url::LISTENER).expect("lds");
    let l = Listener::decode(lds["virtualInbound"].body.value.as_slice()).expect("listener");
    l.filter_chains
        .iter()
        .map(|c| {
            let port = c
                .filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port);
            (c.name.clone(), port.map(|p| p.value))
        })
        .collect()
}

#[test]
fn injected_pods_get_a_sidecar_configuration_others_do_not() {
    let mut m = legacy();
    let plain = pod_json("legacy", "plain", "10.1.0.6", json!({"app": "echo"}));
    m.apply(obj(plain));
    let s = m.build();
    let clusters = names(&s, "echo-1", type_url::CLUSTER);
    for c in [
        "outbound|80||echo.legacy.svc.cluster.local",
        "outbound|9000||echo.legacy.svc.cluster.local",
        "inbound|8080||",
        "inbound|9001||",
        "PassthroughCluster",
    ] {
        assert!(clusters.contains(&c.to_string()), "{c} in {clusters:?}");
    }
    assert!(s
        .sidecar(&key("plain"))
        .get(type_url::CLUSTER)
        .expect("cds")
        .is_empty());
    assert_eq!(s.sidecars().count(), 1);
    // The node id of the pod's proxy picks its scope.
    let node = mesh_proto::envoy::pb::envoy::config::core::v3::Node {
        id: "sidecar~10.1.0.5~echo-1.legacy~legacy.svc.cluster.local".into(),
        ..Default::default()
    };
    let scope = s.scope_of(&node);
    let lds = s.scoped_resources(&scope, type_url::LISTENER).expect("lds");
    assert!(lds.contains_key("virtualOutbound") && lds.contains_key("virtualInbound"));
    // Removing the annotation (or the pod) takes the configuration away.
    m.delete(&ObjectKey::new(Kind::Pod, "legacy", "echo-1"));
    let s = m.build();
    assert_eq!(s.sidecars().count(), 0);
}

#[test]
fn peer_authentication_modes_reach_the_inbound_chains() {
    let mut m = legacy();
    let s = m.build();
    let chains = inbound_chains(&s, "echo-1");
    assert!(
        chains.contains(&("0.0.0.0_8080".into(), Some(8080))),
        "{chains:?}"
    );
    m.apply(peer_auth(
        "legacy",
        "default",
        json!({"mtls": {"mode": "STRICT"}}),
    ));
    m.apply(peer_auth(
        "legacy",
        "echo",
        json!({"selector": {"matchLabels": {"app": "echo"}},
               "portLevelMtls": {"9001": {"mode": "DISABLE"}, "7777": {"mode": "STRICT"}}}),
    ));
    let s = m.build();
    let chains = inbound_chains(&s, "echo-1");
    assert!(
        chains.contains(&("0.0.0.0_8080-refused".into(), Some(8080))),
        "{chains:?}"
    );
    assert!(
        chains.contains(&("0.0.0.0_9001".into(), Some(9001))),
        "{chains:?}"
    );
    let errors: Vec<String> = (s.sidecar(&key("echo-1")).errors.iter())
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("legacy/echo") && e.contains("7777")),
        "{errors:?}"
    );
}

#[test]
fn unrelated_changes_push_nothing_and_policies_reach_only_selected_pods() {
    let mut m = legacy();
    m.apply(injected("echo-2", "10.1.0.7"));
    let s1 = m.build();
    let before = s1.sidecar(&key("echo-1")).changed_in;
    // A pod without a sidecar in another namespace changes nothing the sidecars get.
    m.apply(obj(pod_json("other", "x", "10.1.0.9", json!({"app": "x"}))));
    let s2 = m.build();
    assert_eq!(s2.sidecar(&key("echo-1")).changed_in, before);
    // A policy selecting echo-2 only.
    let mut v = pod_json(
        "legacy",
        "echo-2",
        "10.1.0.7",
        json!({"app": "echo", "tier": "gold", "security.istio.io/tlsMode": "istio"}),
    );
    v["metadata"]["annotations"] = json!({"sidecar.istio.io/status": "{}"});
    m.apply(obj(v));
    m.apply(authz(
        "legacy",
        "deny-v2",
        json!({"selector": {"matchLabels": {"tier": "gold"}}, "action": "DENY",
               "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"]}}]}]}),
    ));
    let s3 = m.build();
    assert_eq!(s3.sidecar(&key("echo-1")).changed_in, before);
    assert!(s3.sidecar(&key("echo-2")).changed_in > before);
}
