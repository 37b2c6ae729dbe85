//! Model-level tests: indexes, IP conflicts, incremental cost, change log, snapshot API.

use mesh_api::{Kind, ObjectKey};
use mesh_proto::type_url;
use mesh_proto::workload::{address, Address, Workload};
use mesh_xds::XdsSnapshot;
use prost::Message;
use serde_json::json;

use super::testing::{authz, namespace, peer_auth, pod, service};
use super::*;

fn model() -> Model {
    Model::new(ModelConfig::default())
}

fn workload(s: &Snapshot, uid: &str) -> Option<Workload> {
    let r = s.addresses().get(uid)?;
    match Address::decode(r.body.value.as_slice())
        .expect("decodes")
        .r#type
    {
        Some(address::Type::Workload(w)) => Some(w),
        other => panic!("not a workload: {other:?}"),
    }
}

fn uid(ns: &str, name: &str) -> String {
    pod_uid("Kubernetes", ns, name)
}

fn pod_key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, ns, name)
}

#[test]
fn ip_conflict_first_keeps_it_and_recovers() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    m.apply(pod("ns", "b", "10.0.0.1", json!({})));
    let s = m.build();
    assert!(workload(&s, &uid("ns", "a")).is_some());
    assert!(
        workload(&s, &uid("ns", "b")).is_none(),
        "second pod left out"
    );
    assert_eq!(s.errors().len(), 1);
    let msg = s.errors()[0].to_string();
    assert!(
        msg.contains("Pod/ns/a") && msg.contains("Pod/ns/b"),
        "{msg}"
    );
    assert_eq!(
        s.resolve_alias(type_url::ADDRESS, "/10.0.0.1"),
        vec![uid("ns", "a")]
    );

    m.delete(&pod_key("ns", "a"));
    let s = m.build();
    assert!(workload(&s, &uid("ns", "a")).is_none());
    assert!(workload(&s, &uid("ns", "b")).is_some(), "conflict resolved");
    assert!(s.errors().is_empty(), "{:?}", s.errors());
    assert_eq!(
        s.resolve_alias(type_url::ADDRESS, "/10.0.0.1"),
        vec![uid("ns", "b")]
    );
}

#[test]
fn ip_change_frees_the_old_ip() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    m.apply(pod("ns", "b", "10.0.0.1", json!({})));
    m.build();
    m.apply(pod("ns", "a", "10.0.0.2", json!({})));
    let s = m.build();
    assert!(workload(&s, &uid("ns", "a")).is_some());
    assert!(workload(&s, &uid("ns", "b")).is_some());
    assert!(s.errors().is_empty());
}

#[test]
fn pending_and_terminated_pods_have_no_workload() {
    let mut m = model();
    let mut p = testing::pod_json("ns", "a", "10.0.0.1", json!({}));
    p["status"] = json!({"phase": "Pending"});
    m.apply(testing::obj(p.clone()));
    p["status"] = json!({"phase": "Succeeded", "podIP": "10.0.0.2"});
    p["metadata"]["name"] = json!("b");
    m.apply(testing::obj(p));
    let s = m.build();
    assert!(s.addresses().is_empty());
    assert!(s.errors().is_empty());
}

#[test]
fn one_pod_change_among_10000_recomputes_one_resource() {
    let mut m = model();
    for i in 0..10_000 {
        let ip = format!("10.0.{}.{}", i / 250, i % 250 + 1);
        let ns = format!("ns{}", i % 20);
        m.apply(pod(
            &ns,
            &format!("p{i}"),
            &ip,
            json!({"app": format!("a{}", i % 50)}),
        ));
    }
    for n in 0..20 {
        let ns = format!("ns{n}");
        m.apply(service(
            &ns,
            "svc",
            json!({"app": "a1"}),
            &format!("10.96.0.{}", n + 1),
        ));
        m.apply(authz(
            &ns,
            "pol",
            json!({"selector": {"matchLabels": {"app": "a2"}}, "rules": [{}]}),
        ));
    }
    let s = m.build();
    assert!(s.errors().is_empty(), "{:?}", s.errors().first());
    assert_eq!(s.addresses().len(), 10_020);
    let before = m.recomputed_total();

    m.apply(pod("ns3", "p3", "10.0.0.4", json!({"app": "a3-renamed"})));
    let s = m.build();
    assert_eq!(m.recomputed_total() - before, 1, "only the changed pod");
    assert_eq!(s.stats().recomputed, 1);
    assert_eq!(s.stats().changed, 1);
    let changes = s.changes_since(s.version - 1).expect("recent");
    assert_eq!(changes[type_url::ADDRESS].len(), 1);

    // A service change touches that service and the pods its selector matches (in its namespace).
    let before = m.recomputed_total();
    m.apply(service("ns1", "svc", json!({"app": "a7"}), "10.96.0.2"));
    m.build();
    let old_sel = (0..10_000).filter(|i| i % 20 == 1 && i % 50 == 1).count();
    let new_sel = (0..10_000).filter(|i| i % 20 == 1 && i % 50 == 7).count();
    assert_eq!(
        m.recomputed_total() - before,
        (1 + old_sel + new_sel) as u64
    );
}

#[test]
fn service_selection_fills_workload_services() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({"app": "web"})));
    m.apply(service("ns", "web", json!({"app": "web"}), "10.96.0.1"));
    let s = m.build();
    let w = workload(&s, &uid("ns", "a")).expect("workload");
    assert!(w.services.contains_key("ns/web.ns.svc.cluster.local"));
    assert!(s.addresses().contains_key("ns/web.ns.svc.cluster.local"));
    assert_eq!(
        s.resolve_alias(type_url::ADDRESS, "/10.96.0.1"),
        vec!["ns/web.ns.svc.cluster.local".to_string()]
    );
    m.delete(&ObjectKey::new(Kind::Service, "ns", "web"));
    let s = m.build();
    assert!(workload(&s, &uid("ns", "a"))
        .expect("workload")
        .services
        .is_empty());
    assert!(s.resolve_alias(type_url::ADDRESS, "/10.96.0.1").is_empty());
}

#[test]
fn namespace_label_change_recomputes_its_workloads_only() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    m.apply(pod("other", "b", "10.0.0.2", json!({})));
    m.apply(namespace("ns", json!({})));
    m.build();
    let before = m.recomputed_total();
    m.apply(namespace(
        "ns",
        json!({"istio.io/dataplane-mode": "ambient"}),
    ));
    let s = m.build();
    assert_eq!(m.recomputed_total() - before, 2, "namespace + its pod");
    let w = workload(&s, &uid("ns", "a")).expect("workload");
    assert_eq!(
        w.tunnel_protocol,
        mesh_proto::workload::TunnelProtocol::Hbone as i32
    );
}

#[test]
fn selector_policy_attaches_to_selected_workloads() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({"app": "a"})));
    m.apply(pod("ns", "b", "10.0.0.2", json!({"app": "b"})));
    m.apply(authz(
        "ns",
        "only-a",
        json!({"selector": {"matchLabels": {"app": "a"}}, "rules": [{}]}),
    ));
    m.apply(authz("ns", "ns-wide", json!({"rules": [{}]})));
    m.apply(authz(
        "istio-system",
        "mesh-a",
        json!({"selector": {"matchLabels": {"app": "a"}}}),
    ));
    let s = m.build();
    let a = workload(&s, &uid("ns", "a")).expect("a");
    assert_eq!(
        a.authorization_policies,
        vec!["istio-system/mesh-a", "ns/only-a"]
    );
    assert!(workload(&s, &uid("ns", "b"))
        .expect("b")
        .authorization_policies
        .is_empty());
    assert_eq!(s.authorizations().len(), 3);
    let before = m.recomputed_total();
    m.delete(&ObjectKey::new(Kind::AuthorizationPolicy, "ns", "only-a"));
    let s = m.build();
    assert_eq!(m.recomputed_total() - before, 2, "policy + pod a");
    let a = workload(&s, &uid("ns", "a")).expect("a");
    assert_eq!(a.authorization_policies, vec!["istio-system/mesh-a"]);
}

#[test]
fn strict_peer_authentication_adds_static_policy() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    m.apply(pod("other", "b", "10.0.0.2", json!({})));
    m.apply(peer_auth(
        "ns",
        "default",
        json!({"mtls": {"mode": "STRICT"}}),
    ));
    let s = m.build();
    assert!(s
        .authorizations()
        .contains_key("istio-system/istio_converted_static_strict"));
    let a = workload(&s, &uid("ns", "a")).expect("a");
    assert_eq!(
        a.authorization_policies,
        vec!["istio-system/istio_converted_static_strict"]
    );
    assert!(workload(&s, &uid("other", "b"))
        .expect("b")
        .authorization_policies
        .is_empty());
    m.delete(&ObjectKey::new(Kind::PeerAuthentication, "ns", "default"));
    let s = m.build();
    assert!(s.authorizations().is_empty());
    assert!(workload(&s, &uid("ns", "a"))
        .expect("a")
        .authorization_policies
        .is_empty());
}

#[test]
fn changes_since_across_versions_and_after_log_is_exhausted() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    let s1 = m.build();
    m.apply(pod("ns", "b", "10.0.0.2", json!({})));
    m.build();
    m.apply(authz("ns", "p", json!({})));
    let s3 = m.build();
    assert_eq!(s3.version(), 3);
    assert_eq!(s3.changes_since(3), Some(Default::default()));
    let c = s3.changes_since(1).expect("kept");
    assert_eq!(
        c[type_url::ADDRESS].iter().collect::<Vec<_>>(),
        vec![&uid("ns", "b")]
    );
    assert_eq!(
        c[type_url::AUTHORIZATION].iter().collect::<Vec<_>>(),
        vec!["ns/p"]
    );
    let all = s3.changes_since(0).expect("kept");
    assert_eq!(all[type_url::ADDRESS].len(), 2);
    assert_eq!(s1.changes_since(3), None, "future version");
    for i in 0..CHANGE_LOG_LEN {
        m.apply(pod(
            "ns",
            "c",
            &format!("10.1.0.{}", i % 200 + 1),
            json!({}),
        ));
        m.build();
    }
    let last = m.build();
    assert_eq!(last.changes_since(1), None, "history exhausted");
    assert!(last.changes_since(last.version - 5).is_some());
}

#[test]
fn identity_on_node_index() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    let s = m.build();
    assert!(s.identity_on_node("node-1", "ns", "sa"));
    assert!(!s.identity_on_node("node-2", "ns", "sa"));
    assert!(!s.identity_on_node("node-1", "ns", "other"));
    m.delete(&pod_key("ns", "a"));
    assert!(!m.build().identity_on_node("node-1", "ns", "sa"));
    assert!(
        s.identity_on_node("node-1", "ns", "sa"),
        "old snapshots are immutable"
    );
}

#[test]
fn debug_json_is_readable() {
    let mut m = model();
    m.apply(pod(
        "ns",
        "a",
        "10.0.0.1",
        json!({"istio.io/dataplane-mode": "ambient"}),
    ));
    m.apply(service("ns", "web", json!({"x": "y"}), "10.96.0.1"));
    m.apply(authz(
        "ns",
        "p",
        json!({"action": "DENY", "rules": [{"from": [{"source": {"ipBlocks": ["10.0.0.0/8"]}}]}]}),
    ));
    let v = m.build().debug_json();
    assert_eq!(v["workloads"][0]["addresses"][0], "10.0.0.1");
    assert_eq!(v["workloads"][0]["tunnelProtocol"], "HBONE");
    assert_eq!(v["services"][0]["addresses"][0]["address"], "10.96.0.1");
    assert_eq!(v["policies"][0]["action"], "DENY");
    assert_eq!(
        v["policies"][0]["groups"][0]["rules"][0][0]["sourceIps"][0],
        "10.0.0.0/8"
    );
}

#[test]
fn duplicate_service_entry_host_first_keeps_it() {
    let se = |name: &str| {
        testing::obj(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"hosts": ["x.example.com"], "ports": [{"number": 80, "name": "http"}]},
        }))
    };
    let mut m = model();
    m.apply(se("one"));
    m.apply(se("two"));
    let s = m.build();
    assert!(s.addresses().contains_key("ns/x.example.com"));
    assert_eq!(s.errors()[0].reason(), "duplicate_name");
    m.delete(&ObjectKey::new(Kind::ServiceEntry, "ns", "one"));
    let s = m.build();
    assert!(
        s.addresses().contains_key("ns/x.example.com"),
        "taken over by the second"
    );
    assert!(s.errors().is_empty());
}

fn node(labels: serde_json::Value, heartbeat: &str) -> mesh_api::Object {
    super::testing::obj(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]},
    }))
}

#[test]
fn a_pods_locality_is_its_nodes_topology_and_follows_it() {
    let mut m = model();
    m.apply(pod("ns", "a", "10.0.0.1", json!({})));
    m.apply(pod("ns", "b", "10.0.0.2", json!({})));
    let s = m.build();
    assert_eq!(
        workload(&s, &uid("ns", "a")).expect("a").locality,
        None,
        "no Node yet"
    );
    m.apply(node(
        json!({"topology.kubernetes.io/region": "eu-west1", "topology.kubernetes.io/zone": "eu-west1-b",
               "topology.istio.io/subzone": "rack7"}),
        "2026-12-01T00:00:00Z",
    ));
    let s = m.build();
    let loc = workload(&s, &uid("ns", "a"))
        .expect("a")
        .locality
        .expect("locality");
    assert_eq!(
        (loc.region.as_str(), loc.zone.as_str(), loc.subzone.as_str()),
        ("eu-west1", "eu-west1-b", "rack7")
    );
    assert!(workload(&s, &uid("ns", "b")).expect("b").locality.is_some());

    // A heartbeat (status only) recomputes nothing but the Node itself.
    let before = m.recomputed_total();
    m.apply(node(
        json!({"topology.kubernetes.io/region": "eu-west1", "topology.kubernetes.io/zone": "eu-west1-b",
               "topology.istio.io/subzone": "rack7"}),
        "2026-12-01T00:00:10Z",
    ));
    m.build();
    assert_eq!(m.recomputed_total() - before, 1, "only the Node");

    // New zone: both pods move; the Node gone: no locality.
    m.apply(node(
        json!({"topology.kubernetes.io/zone": "eu-west1-c"}),
        "2026-12-01T00:00:20Z",
    ));
    let s = m.build();
    let loc = workload(&s, &uid("ns", "b"))
        .expect("b")
        .locality
        .expect("locality");
    assert_eq!((loc.region.as_str(), loc.zone.as_str()), ("", "eu-west1-c"));
    m.delete(&ObjectKey::new(Kind::Node, "", "node-1"));
    let s = m.build();
    assert_eq!(workload(&s, &uid("ns", "a")).expect("a").locality, None);
}
