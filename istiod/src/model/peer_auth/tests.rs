use mesh_api::Object;
use serde_json::{json, Value};

use super::*;
use crate::model::testing::peer_auth;

const ROOT: &str = "istio-system";

fn pa(ns: &str, name: &str, spec: Value) -> PeerAuthentication {
    match peer_auth(ns, name, spec) {
        Object::PeerAuthentication(p) => *p,
        other => panic!("not a PeerAuthentication: {other:?}"),
    }
}

fn strict() -> Value {
    json!({"mtls": {"mode": "STRICT"}})
}

const STATIC: &str = "istio-system/istio_converted_static_strict";

#[test]
fn static_policy_denies_plaintext() {
    let p = static_strict_policy(ROOT);
    assert_eq!(p.name, "istio_converted_static_strict");
    assert_eq!(p.namespace, ROOT);
    assert_eq!(p.scope, Scope::WorkloadSelector as i32);
    assert_eq!(p.action, Action::Deny as i32);
    let m = &p.groups[0].rules[0].matches[0];
    assert_eq!(
        m.not_principals,
        vec![StringMatch {
            match_type: Some(string_match::MatchType::Presence(()))
        }]
    );
}

#[test]
fn effective_mode_table() {
    let mesh_strict = pa(ROOT, "m", strict());
    let ns_perm = pa("ns", "n", json!({"mtls": {"mode": "PERMISSIVE"}}));
    let ns_unset = pa("ns", "n", json!({}));
    let ns_strict = pa("ns", "n", strict());
    let wl_perm = pa(
        "ns",
        "w",
        json!({"selector": {"matchLabels": {"a": "b"}}, "mtls": {"mode": "PERMISSIVE"}}),
    );
    let wl_strict = pa(
        "ns",
        "w",
        json!({"selector": {"matchLabels": {"a": "b"}}, "mtls": {"mode": "STRICT"}}),
    );
    let none: Vec<String> = vec![];
    let st = vec![STATIC.to_string()];
    let cases = [
        ("mesh strict", Some(&mesh_strict), None, None, st.clone()),
        (
            "ns permissive overrides",
            Some(&mesh_strict),
            Some(&ns_perm),
            None,
            none.clone(),
        ),
        (
            "ns unset inherits",
            Some(&mesh_strict),
            Some(&ns_unset),
            None,
            st.clone(),
        ),
        ("ns strict", None, Some(&ns_strict), None, st.clone()),
        (
            "workload permissive",
            None,
            Some(&ns_strict),
            Some(&wl_perm),
            none.clone(),
        ),
        (
            "workload strict",
            None,
            Some(&ns_perm),
            Some(&wl_strict),
            st.clone(),
        ),
        ("nothing", None, None, None, none),
    ];
    for (name, mesh, ns, wl, want) in cases {
        assert_eq!(effective_keys(ROOT, mesh, ns, wl), want, "case {name}");
    }
}

#[test]
fn port_level_exception_becomes_converted_policy() {
    let wl = pa(
        "ns",
        "w",
        json!({
            "selector": {"matchLabels": {"a": "b"}},
            "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}},
        }),
    );
    assert_eq!(
        effective_keys(ROOT, None, None, Some(&wl)),
        vec!["ns/converted_peer_authentication_w".to_string()]
    );
    let p = convert_peer_authentication(ROOT, &wl, None, None).expect("converted");
    assert_eq!(p.name, "converted_peer_authentication_w");
    assert_eq!(p.action, Action::Deny as i32);
    let rules = &p.groups[0].rules;
    assert_eq!(rules.len(), 2);
    assert!(!rules[0].matches[0].not_principals.is_empty());
    assert_eq!(rules[1].matches[0].not_destination_ports, vec![8080]);
}

#[test]
fn strict_port_under_permissive_workload() {
    let wl = pa(
        "ns",
        "w",
        json!({
            "selector": {"matchLabels": {"a": "b"}},
            "mtls": {"mode": "PERMISSIVE"},
            "portLevelMtls": {"9000": {"mode": "STRICT"}},
        }),
    );
    let p = convert_peer_authentication(ROOT, &wl, None, None).expect("converted");
    assert_eq!(p.groups.len(), 1);
    assert_eq!(
        p.groups[0].rules[0].matches[0].destination_ports,
        vec![9000]
    );
    // Namespace-level and all-STRICT policies are covered by the static policy.
    assert!(convert_peer_authentication(ROOT, &pa("ns", "n", strict()), None, None).is_none());
}
