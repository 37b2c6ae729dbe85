use mesh_api::Object;
use serde_json::{json, Value};

use super::*;
use crate::model::testing::authz;

const ROOT: &str = "istio-system";

fn policy(ns: &str, spec: Value) -> AuthorizationPolicy {
    match authz(ns, "pol", spec) {
        Object::AuthorizationPolicy(p) => *p,
        other => panic!("not a policy: {other:?}"),
    }
}

fn convert(spec: Value) -> PolicyConversion {
    convert_authorization_policy(ROOT, &policy("ns", spec))
}

fn groups(spec: Value) -> Vec<Group> {
    let c = convert(spec);
    c.authorization.expect("policy must be served").groups
}

fn exact(s: &str) -> StringMatch {
    StringMatch {
        match_type: Some(string_match::MatchType::Exact(s.into())),
    }
}

fn addr(b: &[u8], length: u32) -> Address {
    Address {
        address: b.to_vec(),
        length,
    }
}

/// The single match of a rule with a single `from` / `to` / `when`.
fn only_match(spec: Value) -> Match {
    let g = groups(spec);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0].rules.len(), 1, "{g:?}");
    assert_eq!(g[0].rules[0].matches.len(), 1, "{g:?}");
    g[0].rules[0].matches[0].clone()
}

#[test]
fn scope_and_action_table() {
    let cases = [
        (ROOT, json!({}), Scope::Global, Action::Allow),
        ("ns", json!({}), Scope::Namespace, Action::Allow),
        (
            "ns",
            json!({"selector": {"matchLabels": {"app": "a"}}}),
            Scope::WorkloadSelector,
            Action::Allow,
        ),
        (
            ROOT,
            json!({"selector": {"matchLabels": {"app": "a"}}, "action": "DENY"}),
            Scope::WorkloadSelector,
            Action::Deny,
        ),
        (
            "ns",
            json!({"action": "DENY"}),
            Scope::Namespace,
            Action::Deny,
        ),
    ];
    for (ns, spec, scope, action) in cases {
        let a = convert_authorization_policy(ROOT, &policy(ns, spec.clone()))
            .authorization
            .expect("served");
        assert_eq!(
            (a.scope, a.action),
            (scope as i32, action as i32),
            "{ns} {spec}"
        );
        assert_eq!((a.name.as_str(), a.namespace.as_str()), ("pol", ns));
    }
}

#[test]
fn target_ref_policies_are_for_waypoints() {
    for spec in [
        json!({"targetRef": {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "wp"}}),
        json!({"targetRefs": [{"kind": "Service", "group": "", "name": "svc"}]}),
    ] {
        assert_eq!(convert(spec), PolicyConversion::default());
    }
}

#[test]
fn custom_and_audit_are_skipped_with_a_reason() {
    for action in ["CUSTOM", "AUDIT"] {
        let c = convert(json!({"action": action, "rules": [{}]}));
        assert!(c.authorization.is_none());
        assert_eq!(c.errors.len(), 1);
        assert_eq!(c.errors[0].reason(), "unsupported_action");
        assert!(c.errors[0].to_string().contains(action), "{}", c.errors[0]);
    }
}

#[test]
fn no_rules_matches_nothing_and_empty_rule_matches_all() {
    assert!(groups(json!({})).is_empty());
    assert!(groups(json!({"action": "DENY"})).is_empty());
    assert_eq!(
        groups(json!({"rules": [{}]})),
        vec![Group { rules: vec![] }]
    );
}

#[test]
fn from_fields() {
    let m = only_match(json!({"rules": [{"from": [{"source": {
        "principals": ["cluster.local/ns/a/sa/b", "*", "cluster.local/*", "*/sa/x"],
        "notPrincipals": ["cluster.local/ns/bad/sa/x"],
        "namespaces": ["a"], "notNamespaces": ["b*"],
        "ipBlocks": ["10.0.0.0/8", "1.2.3.4"], "notIpBlocks": ["10.1.0.0/16"],
        "remoteIpBlocks": ["fd00::/8"], "notRemoteIpBlocks": ["192.168.0.1"],
        "serviceAccounts": ["other/sa1", "local"], "notServiceAccounts": ["x/y"],
    }}]}]}));
    assert_eq!(
        m.principals,
        vec![
            exact("cluster.local/ns/a/sa/b"),
            StringMatch {
                match_type: Some(string_match::MatchType::Presence(()))
            },
            StringMatch {
                match_type: Some(string_match::MatchType::Prefix("cluster.local/".into()))
            },
            StringMatch {
                match_type: Some(string_match::MatchType::Suffix("/sa/x".into()))
            },
        ]
    );
    assert_eq!(m.not_principals, vec![exact("cluster.local/ns/bad/sa/x")]);
    assert_eq!(m.namespaces, vec![exact("a")]);
    assert_eq!(
        m.not_namespaces,
        vec![StringMatch {
            match_type: Some(string_match::MatchType::Prefix("b".into()))
        }]
    );
    let mut fd00 = vec![0u8; 16];
    fd00[0] = 0xfd;
    assert_eq!(
        m.source_ips,
        vec![
            addr(&[10, 0, 0, 0], 8),
            addr(&[1, 2, 3, 4], 32),
            addr(&fd00, 8)
        ]
    );
    assert_eq!(
        m.not_source_ips,
        vec![addr(&[10, 1, 0, 0], 16), addr(&[192, 168, 0, 1], 32)]
    );
    let sa = |ns: &str, sa: &str| ServiceAccountMatch {
        namespace: ns.into(),
        service_account: sa.into(),
    };
    assert_eq!(
        m.service_accounts,
        vec![sa("other", "sa1"), sa("ns", "local")]
    );
    assert_eq!(m.not_service_accounts, vec![sa("x", "y")]);
}

#[test]
fn to_ports() {
    let m = only_match(
        json!({"rules": [{"to": [{"operation": {"ports": ["80", "443"], "notPorts": ["8080"]}}]}]}),
    );
    assert_eq!(m.destination_ports, vec![80, 443]);
    assert_eq!(m.not_destination_ports, vec![8080]);
}

type Check = Box<dyn Fn(&Match) -> bool>;

#[test]
fn when_keys_table() {
    let cases: [(&str, Check); 6] = [
        (
            "source.ip",
            Box::new(|m: &Match| {
                m.source_ips == vec![addr(&[10, 0, 0, 1], 32)]
                    && m.not_source_ips == vec![addr(&[10, 0, 0, 2], 32)]
            }),
        ),
        (
            "remote.ip",
            Box::new(|m: &Match| {
                m.source_ips == vec![addr(&[10, 0, 0, 1], 32)]
                    && m.not_source_ips == vec![addr(&[10, 0, 0, 2], 32)]
            }),
        ),
        (
            "destination.ip",
            Box::new(|m: &Match| {
                m.destination_ips == vec![addr(&[10, 0, 0, 1], 32)]
                    && m.not_destination_ips == vec![addr(&[10, 0, 0, 2], 32)]
            }),
        ),
        (
            "source.namespace",
            Box::new(|m: &Match| {
                m.namespaces == vec![exact("10.0.0.1")]
                    && m.not_namespaces == vec![exact("10.0.0.2")]
            }),
        ),
        (
            "source.principal",
            Box::new(|m: &Match| {
                m.principals == vec![exact("10.0.0.1")]
                    && m.not_principals == vec![exact("10.0.0.2")]
            }),
        ),
        (
            "destination.port",
            Box::new(|m: &Match| m.destination_ports.is_empty()),
        ),
    ];
    for (key, check) in cases {
        let (values, not_values) = if key == "destination.port" {
            (json!(["80"]), json!(["81"]))
        } else {
            (json!(["10.0.0.1"]), json!(["10.0.0.2"]))
        };
        let spec =
            json!({"rules": [{"when": [{"key": key, "values": values, "notValues": not_values}]}]});
        let c = convert(spec);
        if key == "destination.port" {
            let m = c.authorization.as_ref().expect("served").groups[0].rules[0].matches[0].clone();
            assert_eq!(
                (m.destination_ports, m.not_destination_ports),
                (vec![80], vec![81])
            );
            continue;
        }
        let m = c.authorization.expect("served").groups[0].rules[0].matches[0].clone();
        assert!(check(&m), "when {key}: {m:?}");
    }
}

#[test]
fn from_to_when_are_and_ed_rules_and_rules_are_groups() {
    let g = groups(json!({"rules": [
        {"from": [{"source": {"namespaces": ["a"]}}, {"source": {"namespaces": ["b"]}}],
         "to": [{"operation": {"ports": ["80"]}}],
         "when": [{"key": "source.ip", "values": ["1.1.1.1"]}, {"key": "destination.port", "values": ["80"]}]},
        {"from": [{"source": {"principals": ["p"]}}]},
    ]}));
    assert_eq!(g.len(), 2);
    // to, from, when, when
    assert_eq!(g[0].rules.len(), 4);
    assert_eq!(g[0].rules[0].matches[0].destination_ports, vec![80]);
    assert_eq!(g[0].rules[1].matches.len(), 2, "two from entries are OR-ed");
    assert_eq!(g[1].rules.len(), 1);
}

#[test]
fn l7_allow_rules_are_dropped() {
    let cases = [
        json!({"to": [{"operation": {"methods": ["GET"]}}]}),
        json!({"to": [{"operation": {"paths": ["/x"], "ports": ["80"]}}]}),
        json!({"to": [{"operation": {"hosts": ["h"]}}]}),
        json!({"to": [{"operation": {"notMethods": ["GET"]}}]}),
        json!({"from": [{"source": {"requestPrincipals": ["*"]}}]}),
        json!({"when": [{"key": "request.headers[x]", "values": ["y"]}]}),
    ];
    for rule in cases {
        let c = convert(
            json!({"rules": [rule.clone(), {"from": [{"source": {"namespaces": ["ok"]}}]}]}),
        );
        let a = c.authorization.expect("served");
        assert_eq!(a.groups.len(), 1, "L7 rule must be dropped: {rule}");
        assert_eq!(
            a.groups[0].rules[0].matches[0].namespaces,
            vec![exact("ok")]
        );
        assert_eq!(c.errors.len(), 1, "{rule}");
        assert_eq!(c.errors[0].reason(), "http_attributes");
    }
}

#[test]
fn l7_deny_keeps_its_l4_part() {
    let g = groups(
        json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["80"], "methods": ["GET"]}}]}]}),
    );
    assert_eq!(g[0].rules[0].matches[0].destination_ports, vec![80]);
    // Only L7: the match is empty, which ztunnel never matches (no effect), as Istio does.
    let c = convert(
        json!({"action": "DENY", "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
    );
    let a = c.authorization.expect("served");
    assert_eq!(a.groups[0].rules[0].matches, vec![Match::default()]);
    assert!(
        c.errors[0].to_string().contains("no effect"),
        "{}",
        c.errors[0]
    );
}

#[test]
fn invalid_values_in_allow_drop_only_that_rule() {
    for bad in [
        json!({"from": [{"source": {"ipBlocks": ["10.0.0.0/33"]}}]}),
        json!({"from": [{"source": {"notIpBlocks": ["bogus"]}}]}),
        json!({"to": [{"operation": {"ports": ["http"]}}]}),
        json!({"to": [{"operation": {"notPorts": ["70000"]}}]}),
        json!({"when": [{"key": "destination.ip", "values": ["1.2.3"]}]}),
    ] {
        let c = convert(
            json!({"rules": [bad.clone(), {"from": [{"source": {"namespaces": ["ok"]}}]}]}),
        );
        let a = c.authorization.expect("served");
        assert_eq!(a.groups.len(), 1, "bad rule must be dropped: {bad}");
        assert_eq!(
            a.groups[0].rules[0].matches[0].namespaces,
            vec![exact("ok")]
        );
        assert_eq!(c.errors.len(), 1);
        assert_eq!(c.errors[0].reason(), "invalid_policy_value");
        let msg = c.errors[0].to_string();
        assert!(msg.contains("ns/pol") && msg.contains("rules[0]"), "{msg}");
    }
}

#[test]
fn invalid_values_in_deny_widen_the_deny() {
    // The bad field alone: the whole rule matches everything.
    let c = convert(
        json!({"action": "DENY", "rules": [{"from": [{"source": {"ipBlocks": ["nope"]}}], "to": [{"operation": {"ports": ["80"]}}]}]}),
    );
    let a = c.authorization.expect("served");
    assert_eq!(a.groups.len(), 1);
    assert_eq!(
        a.groups[0].rules.len(),
        1,
        "from part dropped (always true): {a:?}"
    );
    assert_eq!(a.groups[0].rules[0].matches[0].destination_ports, vec![80]);
    assert!(c.errors[0].field_is("rules[0].from[0].source.ipBlocks"));
    // The bad field beside others: only that field goes.
    let m = only_match(
        json!({"action": "DENY", "rules": [{"from": [{"source": {"ipBlocks": ["nope"], "namespaces": ["x"]}}]}]}),
    );
    assert_eq!(m.namespaces, vec![exact("x")]);
    assert!(m.source_ips.is_empty());
    // Nothing left at all: deny everything.
    assert_eq!(
        groups(json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["x"]}}]}]})),
        vec![Group { rules: vec![] }]
    );
}

#[test]
fn dry_run_annotation() {
    let mut p = policy("ns", json!({"rules": [{}]}));
    p.metadata.annotations = Some([("istio.io/dry-run".to_string(), "true".to_string())].into());
    let a = convert_authorization_policy(ROOT, &p)
        .authorization
        .expect("served");
    assert!(a.dry_run);
}

#[test]
fn workload_selector_only_for_enforced_selector_policies() {
    let sel = json!({"matchLabels": {"app": "a"}});
    assert!(workload_selector(&policy("ns", json!({"selector": sel}))).is_some());
    assert!(workload_selector(&policy("ns", json!({}))).is_none());
    assert!(
        workload_selector(&policy("ns", json!({"selector": sel, "action": "CUSTOM"}))).is_none()
    );
    assert!(workload_selector(&policy(
        "ns",
        json!({"selector": sel, "targetRefs": [{"kind": "Gateway", "name": "w"}]})
    ))
    .is_none());
}

impl ModelError {
    fn field_is(&self, want: &str) -> bool {
        matches!(self, ModelError::InvalidPolicyValue { field, .. } if field == want)
    }
}
