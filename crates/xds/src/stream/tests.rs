use std::collections::{BTreeSet, HashMap};

use mesh_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

use super::*;
use crate::testing::{res, TestSnapshot, T};
use crate::XdsSnapshot;

fn req(sub: &[&str], unsub: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: T.to_string(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
        ..DeltaDiscoveryRequest::default()
    }
}

fn ack(resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    crate::ack(resp)
}

fn names(resp: &DeltaDiscoveryResponse) -> Vec<&str> {
    resp.resources.iter().map(|r| r.name.as_str()).collect()
}

fn base() -> TestSnapshot {
    TestSnapshot::new(&[
        res("a", "a1", &["net/10.0.0.1"]),
        res("b", "b1", &["net/10.0.0.2"]),
        res("c", "c1", &[]),
    ])
}

/// Opens a stream with `first` and returns it with the first response.
fn open(
    first: &DeltaDiscoveryRequest,
    snap: &TestSnapshot,
) -> (DeltaStream, DeltaDiscoveryResponse) {
    let mut s = DeltaStream::new();
    let out = s.handle_request(first).expect("valid request");
    assert!(out.respond, "first request must be answered");
    let resp = s.respond(T, snap, None).expect("first response");
    (s, resp)
}

#[test]
fn wildcard_first_request_gets_everything() {
    let (_, resp) = open(&req(&[], &[]), &base());
    assert_eq!(names(&resp), ["a", "b", "c"]);
    assert!(resp.removed_resources.is_empty());
    assert_eq!(resp.system_version_info, "1");
    assert!(!resp.nonce.is_empty());
    let (_, star) = open(&req(&["*"], &[]), &base());
    assert_eq!(names(&star), ["a", "b", "c"]);
}

#[test]
fn push_sends_only_changed_and_removed() {
    let snap = base();
    let (mut s, resp) = open(&req(&[], &[]), &snap);
    assert_eq!(
        s.handle_request(&ack(&resp)).expect("ack").kind,
        RequestKind::Ack
    );
    let next = snap.next(&[res("b", "b2", &[])], &["c"]);
    let changes = next.changes_since(1);
    let out = s.push(&next, changes.as_ref());
    assert_eq!(out.len(), 1);
    assert_eq!(names(&out[0]), ["b"]);
    assert_eq!(out[0].removed_resources, ["c"]);
    assert_ne!(out[0].nonce, resp.nonce, "each response gets a fresh nonce");
    // The same snapshot again changes nothing.
    assert!(s.push(&next, Some(&ChangeSet::new())).is_empty());
    // A full compare (no history) finds nothing new either.
    assert!(s.push(&next, None).is_empty());
}

#[test]
fn full_compare_without_history_finds_differences() {
    let snap = base();
    let (mut s, _) = open(&req(&[], &[]), &snap);
    let next = snap.next(&[res("a", "a2", &[]), res("d", "d1", &[])], &["b"]);
    let out = s.push(&next, None);
    assert_eq!(names(&out[0]), ["a", "d"]);
    assert_eq!(out[0].removed_resources, ["b"]);
}

#[test]
fn full_compare_resends_a_name_asked_for_again() {
    let snap = base();
    let (mut s, resp) = open(&req(&[], &[]), &snap);
    s.handle_request(&ack(&resp)).expect("ack");
    // A wildcard client asks for "b" by name (as after losing it): it gets it again, alone.
    s.handle_request(&req(&["b"], &[])).expect("subscribe");
    let next = snap.next(&[res("c", "c2", &[])], &[]);
    let resp = s.respond(T, &next, None).expect("response");
    assert_eq!(names(&resp), ["c", "b"]);
    assert!(resp.removed_resources.is_empty());
    // Nothing is pending afterwards.
    assert!(s.push(&next, None).is_empty());
}

#[test]
fn nack_is_kept_until_next_ack_with_history() {
    let snap = base();
    let (mut s, resp) = open(&req(&[], &[]), &snap);
    let mut nack = ack(&resp);
    nack.error_detail = Some(mesh_proto::envoy::pb::google::rpc::Status {
        code: 3,
        message: "bad workload".into(),
        details: vec![],
    });
    let out = s.handle_request(&nack).expect("nack");
    assert!(!out.respond);
    assert!(matches!(out.kind, RequestKind::Nack { code: 3, .. }));
    let st = &s.status()[0];
    assert_eq!(
        st.nack.as_ref().map(|n| n.message.as_str()),
        Some("bad workload")
    );
    assert_eq!(st.nonce_acked, None);

    let next = snap.next(&[res("a", "a2", &[])], &[]);
    let resp2 = s.push(&next, next.changes_since(1).as_ref()).remove(0);
    s.handle_request(&ack(&resp2)).expect("ack");
    let st = &s.status()[0];
    assert!(st.nack.is_none(), "ACK clears the current NACK");
    assert_eq!(st.nack_history.len(), 1, "history keeps it");
    assert_eq!(st.nonce_acked.as_deref(), Some(resp2.nonce.as_str()));
    assert_eq!(st.version_acked, Some(2));
}

#[test]
fn stale_nonce_is_ignored() {
    let snap = base();
    let (mut s, resp1) = open(&req(&[], &[]), &snap);
    let next = snap.next(&[res("a", "a2", &[])], &[]);
    let resp2 = s.push(&next, next.changes_since(1).as_ref()).remove(0);
    let out = s.handle_request(&ack(&resp1)).expect("stale");
    assert_eq!(
        out.kind,
        RequestKind::StaleNonce {
            nonce: resp1.nonce.clone()
        }
    );
    assert_eq!(s.status()[0].nonce_acked, None);
    s.handle_request(&ack(&resp2)).expect("ack");
    assert_eq!(s.status()[0].nonce_acked, Some(resp2.nonce));
}

#[test]
fn reconnect_sends_only_differences() {
    let snap = base();
    let mut first = req(&[], &[]);
    first.initial_resource_versions = HashMap::from([
        ("a".to_string(), snap.maps[T]["a"].version.clone()),
        ("b".to_string(), "old".to_string()),
        ("gone".to_string(), "v".to_string()),
    ]);
    let mut s = DeltaStream::new();
    let out = s.handle_request(&first).expect("reconnect");
    assert_eq!(out.kind, RequestKind::Reconnect { known: 3 });
    let resp = s.respond(T, &snap, None).expect("response");
    assert_eq!(names(&resp), ["b", "c"]);
    assert_eq!(resp.removed_resources, ["gone"]);
}

#[test]
fn explicit_subscription_and_unsubscribe() {
    let snap = base();
    let (mut s, resp) = open(&req(&["a", "missing"], &[]), &snap);
    assert_eq!(names(&resp), ["a"]);
    assert_eq!(
        resp.removed_resources,
        ["missing"],
        "never-existing name reported removed"
    );
    s.handle_request(&ack(&resp)).expect("ack");

    // A change to an unsubscribed resource is not sent.
    let next = snap.next(&[res("b", "b2", &[])], &[]);
    assert!(s.push(&next, next.changes_since(1).as_ref()).is_empty());

    let out = s.handle_request(&req(&["b"], &[])).expect("subscribe");
    assert_eq!(
        out,
        RequestOutcome {
            kind: RequestKind::Subscription,
            respond: true
        }
    );
    let resp = s.respond(T, &next, None).expect("response");
    assert_eq!(names(&resp), ["b"]);
    assert!(resp.removed_resources.is_empty());

    s.handle_request(&req(&[], &["a"])).expect("unsubscribe");
    let resp = s.respond(T, &next, None).expect("response");
    assert!(resp.resources.is_empty());
    assert_eq!(resp.removed_resources, ["a"]);
    assert_eq!(s.status()[0].names, ["b", "missing"]);
}

#[test]
fn missing_name_appearing_later_is_sent() {
    let snap = base();
    let (mut s, _) = open(&req(&["later"], &[]), &snap);
    let next = snap.next(&[res("later", "l1", &[])], &[]);
    let out = s.push(&next, next.changes_since(1).as_ref());
    assert_eq!(names(&out[0]), ["later"]);
}

#[test]
fn alias_subscription_resolves() {
    let snap = base();
    let (mut s, resp) = open(&req(&["net/10.0.0.2", "net/10.9.9.9"], &[]), &snap);
    assert_eq!(names(&resp), ["b"]);
    assert_eq!(resp.resources[0].aliases, ["net/10.0.0.2"]);
    assert_eq!(resp.removed_resources, ["net/10.9.9.9"]);
    // The pod behind the alias changes: pushed.
    let next = snap.next(&[res("b", "b2", &["net/10.0.0.2"])], &[]);
    let out = s.push(&next, next.changes_since(1).as_ref());
    assert_eq!(names(&out[0]), ["b"]);
    // The alias moves to another pod: the new one is sent, the old one removed.
    let next2 = next.next(
        &[res("b", "b3", &[]), res("e", "e1", &["net/10.0.0.2"])],
        &[],
    );
    let out = s.push(&next2, next2.changes_since(2).as_ref());
    assert_eq!(names(&out[0]), ["e"]);
    assert_eq!(out[0].removed_resources, ["b"]);
}

#[test]
fn wildcard_toggles_with_star() {
    let snap = base();
    // On-demand start: subscribe and unsubscribe `*` in the first request.
    let (mut s, resp) = open(&req(&["*"], &["*"]), &snap);
    assert!(resp.resources.is_empty() && resp.removed_resources.is_empty());
    assert!(!s.status()[0].wildcard);
    s.handle_request(&req(&["*"], &[])).expect("wildcard on");
    let resp = s.respond(T, &snap, None).expect("response");
    assert_eq!(names(&resp), ["a", "b", "c"]);
    s.handle_request(&req(&["c"], &["*"]))
        .expect("wildcard off");
    let resp = s.respond(T, &snap, None).expect("response");
    assert_eq!(names(&resp), ["c"], "re-requested name is sent again");
    assert_eq!(resp.removed_resources, ["a", "b"]);
}

#[test]
fn ack_without_changes_is_not_answered() {
    let snap = base();
    let (mut s, resp) = open(&req(&[], &[]), &snap);
    let out = s.handle_request(&ack(&resp)).expect("ack");
    assert!(!out.respond);
    assert!(s.respond(T, &snap, Some(&BTreeSet::new())).is_none());
}

#[test]
fn missing_type_url_is_an_error() {
    let mut s = DeltaStream::new();
    let err = s
        .handle_request(&DeltaDiscoveryRequest::default())
        .expect_err("must fail");
    assert_eq!(err.reason(), "missing_type_url");
    assert!(err.to_string().contains("type_url"));
}

#[test]
fn nack_history_is_bounded() {
    let snap = base();
    let (mut s, resp) = open(&req(&[], &[]), &snap);
    for i in 0..(NACK_HISTORY + 3) {
        let mut n = ack(&resp);
        n.error_detail = Some(mesh_proto::envoy::pb::google::rpc::Status {
            code: 3,
            message: format!("e{i}"),
            details: vec![],
        });
        s.handle_request(&n).expect("nack");
    }
    let st = &s.status()[0];
    assert_eq!(st.nack_history.len(), NACK_HISTORY);
    assert_eq!(st.nack_history[0].message, "e3");
}

#[test]
fn a_subscription_change_with_a_stale_nonce_still_counts() {
    let snap = base();
    let (mut s, resp1) = open(&req(&["a"], &[]), &snap);
    let next = snap.next(&[res("a", "a2", &[])], &[]);
    let _in_flight = s.push(&next, next.changes_since(1).as_ref());
    // The client asks for "b" before it has seen the second response.
    let mut change = req(&["b"], &[]);
    change.response_nonce = resp1.nonce.clone();
    let out = s.handle_request(&change).expect("stale");
    assert!(matches!(out.kind, RequestKind::StaleNonce { .. }));
    assert!(out.respond, "the new name is answered");
    let resp = s.respond(T, &next, None).expect("response");
    assert!(names(&resp).contains(&"b"), "{:?}", names(&resp));
}

/// A snapshot of one EDS cluster `c` (its `lb` setting varies) and its assignment.
fn cluster_snapshot(version: u64, lb_policy: i32) -> TestSnapshot {
    use mesh_proto::envoy::pb::envoy::config::cluster::v3::{
        cluster::{ClusterDiscoveryType, DiscoveryType},
        Cluster,
    };
    use mesh_proto::envoy::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    let cluster = Cluster {
        name: "c".into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        lb_policy,
        ..Cluster::default()
    };
    let cla = ClusterLoadAssignment {
        cluster_name: "c".into(),
        ..ClusterLoadAssignment::default()
    };
    let (cds, eds) = (
        mesh_proto::type_url::CLUSTER,
        mesh_proto::type_url::ENDPOINT,
    );
    let mut s = TestSnapshot {
        version,
        ..TestSnapshot::default()
    };
    let one = |r: Resource| {
        let mut m = ResourceMap::new();
        m.insert(r.name.clone(), Arc::new(r));
        m
    };
    s.maps.insert(
        cds.into(),
        one(Resource::new(cds, "c", Vec::new(), &cluster)),
    );
    s.maps
        .insert(eds.into(), one(Resource::new(eds, "c", Vec::new(), &cla)));
    s
}

#[test]
fn a_changed_eds_cluster_gets_its_assignment_again() {
    let (cds, eds) = (
        mesh_proto::type_url::CLUSTER,
        mesh_proto::type_url::ENDPOINT,
    );
    let typed = |t: &str, sub: &[&str]| DeltaDiscoveryRequest {
        type_url: t.to_string(),
        ..req(sub, &[])
    };
    let snap = cluster_snapshot(1, 0);
    let mut s = DeltaStream::new();
    s.handle_request(&typed(cds, &[])).expect("cds");
    let first = s.respond(cds, &snap, None).expect("cds response");
    s.handle_request(&typed(eds, &["c"])).expect("eds");
    let first_eds = s.respond(eds, &snap, None).expect("eds response");
    for r in [&first, &first_eds] {
        s.handle_request(&ack(r)).expect("ack");
    }
    // The cluster changes, its assignment does not: both go out, clusters first.
    let next = cluster_snapshot(2, 1);
    let pushed = s.push(&next, None);
    let types: Vec<(&str, Vec<&str>)> = pushed
        .iter()
        .map(|r| (r.type_url.as_str(), names(r)))
        .collect();
    assert_eq!(types, vec![(cds, vec!["c"]), (eds, vec!["c"])]);
    for r in &pushed {
        s.handle_request(&ack(r)).expect("ack");
    }
    // Nothing changed: nothing is sent.
    assert!(s.push(&next, None).is_empty());
}
