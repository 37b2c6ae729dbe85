//! Table tests for L4 authorization: every `Match` field, the nesting and empty-case semantics,
//! the decision order, policy selection, and the policies istiod emits.

use std::net::IpAddr;

use mesh_identity::Identity;
use mesh_proto::security as xds;
use mesh_proto::security::string_match::MatchType;
use mesh_proto::workload::Workload;

use super::*;

// ---------- builders ----------

/// Groups (OR) of rules (AND) of matches (OR), as on the wire.
type Groups = Vec<Vec<Vec<xds::Match>>>;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn conn(identity: Option<(&str, &str, &str)>, src: &str, dst: &str, port: u16) -> Connection {
    Connection {
        src_identity: identity.map(|(td, ns, sa)| Identity::new(td, ns, sa).expect("identity")),
        src_ip: ip(src),
        dst_ip: ip(dst),
        dst_port: port,
        dst_network: String::new(),
    }
}

/// Plaintext peer 10.0.0.1 -> 10.0.0.2:8080.
fn plaintext() -> Connection {
    conn(None, "10.0.0.1", "10.0.0.2", 8080)
}

/// mTLS peer cluster.local/ns/default/sa/sleep, 10.0.0.1 -> 10.0.0.2:8080.
fn tls() -> Connection {
    conn(
        Some(("cluster.local", "default", "sleep")),
        "10.0.0.1",
        "10.0.0.2",
        8080,
    )
}

/// mTLS peer other.td/ns/other/sa/bar, 10.1.0.3 -> 10.0.0.4:9090.
fn tls_alt() -> Connection {
    conn(
        Some(("other.td", "other", "bar")),
        "10.1.0.3",
        "10.0.0.4",
        9090,
    )
}

fn exact(s: &str) -> xds::StringMatch {
    xds::StringMatch {
        match_type: Some(MatchType::Exact(s.into())),
    }
}

fn prefix(s: &str) -> xds::StringMatch {
    xds::StringMatch {
        match_type: Some(MatchType::Prefix(s.into())),
    }
}

fn suffix(s: &str) -> xds::StringMatch {
    xds::StringMatch {
        match_type: Some(MatchType::Suffix(s.into())),
    }
}

fn presence() -> xds::StringMatch {
    xds::StringMatch {
        match_type: Some(MatchType::Presence(())),
    }
}

/// `"10.0.0.0/8"` or a bare IP (full length, as istiod sends it).
fn cidr(s: &str) -> xds::Address {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (ip(a), l.parse().expect("length")),
        None => (ip(s), if ip(s).is_ipv4() { 32 } else { 128 }),
    };
    let address = match addr {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    xds::Address {
        address,
        length: len,
    }
}

fn sa(ns: &str, sa: &str) -> xds::ServiceAccountMatch {
    xds::ServiceAccountMatch {
        namespace: ns.into(),
        service_account: sa.into(),
    }
}

/// A wire policy from groups of rules of matches.
fn wire(
    ns: &str,
    name: &str,
    scope: xds::Scope,
    action: xds::Action,
    groups: Groups,
) -> xds::Authorization {
    xds::Authorization {
        name: name.into(),
        namespace: ns.into(),
        scope: scope as i32,
        action: action as i32,
        groups: groups
            .into_iter()
            .map(|rules| xds::Group {
                rules: rules
                    .into_iter()
                    .map(|matches| xds::Rules { matches })
                    .collect(),
            })
            .collect(),
        dry_run: false,
        extensions: vec![],
    }
}

fn compile(a: &xds::Authorization) -> Policy {
    Policy::try_from(a).expect("valid policy")
}

fn policy(ns: &str, name: &str, action: xds::Action, m: Vec<xds::Match>) -> Policy {
    compile(&wire(
        ns,
        name,
        xds::Scope::Namespace,
        action,
        vec![vec![m]],
    ))
}

fn allow(name: &str, m: xds::Match) -> Policy {
    policy("default", name, xds::Action::Allow, vec![m])
}

fn deny(name: &str, m: xds::Match) -> Policy {
    policy("default", name, xds::Action::Deny, vec![m])
}

fn dry(mut p: Policy) -> Policy {
    p.dry_run = true;
    p
}

// ---------- one Match field at a time ----------

/// A `Match` with the fields `f` sets.
fn m(f: impl FnOnce(&mut xds::Match)) -> xds::Match {
    let mut m = xds::Match::default();
    f(&mut m);
    m
}

/// (case, match, expected for [plaintext, tls, tls_alt])
#[rustfmt::skip]
fn field_cases() -> Vec<(&'static str, xds::Match, [bool; 3])> {
    vec![
        ("namespaces exact", m(|m| m.namespaces = vec![exact("default")]), [false, true, false]),
        ("namespaces prefix", m(|m| m.namespaces = vec![prefix("oth")]), [false, false, true]),
        ("namespaces suffix", m(|m| m.namespaces = vec![suffix("ault")]), [false, true, false]),
        ("namespaces presence", m(|m| m.namespaces = vec![presence()]), [false, true, true]),
        ("namespaces any-of", m(|m| m.namespaces = vec![exact("x"), exact("other")]), [false, false, true]),
        ("not_namespaces exact", m(|m| m.not_namespaces = vec![exact("default")]), [true, false, true]),
        ("not_namespaces none-of", m(|m| m.not_namespaces = vec![exact("default"), exact("other")]), [true, false, false]),
        ("not_namespaces presence", m(|m| m.not_namespaces = vec![presence()]), [true, false, false]),
        ("principals exact", m(|m| m.principals = vec![exact("cluster.local/ns/default/sa/sleep")]), [false, true, false]),
        ("principals with scheme never match", m(|m| m.principals = vec![exact("spiffe://cluster.local/ns/default/sa/sleep")]), [false, false, false]),
        ("principals prefix", m(|m| m.principals = vec![prefix("cluster.local/ns/default/")]), [false, true, false]),
        ("principals suffix", m(|m| m.principals = vec![suffix("/sa/bar")]), [false, false, true]),
        ("principals presence", m(|m| m.principals = vec![presence()]), [false, true, true]),
        ("principals empty prefix (*)", m(|m| m.principals = vec![prefix("")]), [false, true, true]),
        ("not_principals exact", m(|m| m.not_principals = vec![exact("cluster.local/ns/default/sa/sleep")]), [true, false, true]),
        ("not_principals presence", m(|m| m.not_principals = vec![presence()]), [true, false, false]),
        ("service_accounts", m(|m| m.service_accounts = vec![sa("default", "sleep")]), [false, true, false]),
        ("service_accounts wrong ns", m(|m| m.service_accounts = vec![sa("other", "sleep")]), [false, false, false]),
        ("not_service_accounts", m(|m| m.not_service_accounts = vec![sa("default", "sleep")]), [true, false, true]),
        ("source_ips host", m(|m| m.source_ips = vec![cidr("10.0.0.1")]), [true, true, false]),
        ("source_ips /16", m(|m| m.source_ips = vec![cidr("10.0.0.0/16")]), [true, true, false]),
        ("source_ips /8", m(|m| m.source_ips = vec![cidr("10.0.0.0/8")]), [true, true, true]),
        ("source_ips /0", m(|m| m.source_ips = vec![cidr("0.0.0.0/0")]), [true, true, true]),
        ("source_ips v6 only", m(|m| m.source_ips = vec![cidr("::/0")]), [false, false, false]),
        ("not_source_ips host", m(|m| m.not_source_ips = vec![cidr("10.0.0.1")]), [false, false, true]),
        ("destination_ips host", m(|m| m.destination_ips = vec![cidr("10.0.0.2")]), [true, true, false]),
        ("destination_ips /30", m(|m| m.destination_ips = vec![cidr("10.0.0.4/30")]), [false, false, true]),
        ("not_destination_ips host", m(|m| m.not_destination_ips = vec![cidr("10.0.0.2")]), [false, false, true]),
        ("destination_ports", m(|m| m.destination_ports = vec![8080]), [true, true, false]),
        ("destination_ports any-of", m(|m| m.destination_ports = vec![80, 9090]), [false, false, true]),
        ("not_destination_ports", m(|m| m.not_destination_ports = vec![8080]), [false, false, true]),
        ("fields are AND-ed", m(|m| { m.namespaces = vec![exact("default")]; m.destination_ports = vec![9090] }), [false, false, false]),
        ("positive and negative of one field", m(|m| { m.principals = vec![presence()]; m.not_principals = vec![suffix("/sa/bar")] }), [false, true, false]),
    ]
}

#[test]
fn every_match_field_positive_and_negative() {
    let conns = [
        ("plaintext", plaintext()),
        ("tls", tls()),
        ("tls_alt", tls_alt()),
    ];
    for (case, m, expected) in field_cases() {
        let p = allow(case, m);
        for ((who, c), want) in conns.iter().zip(expected) {
            assert_eq!(p.matches(c), want, "case {case:?}, connection {who} ({c})");
        }
    }
}

#[test]
#[rustfmt::skip]
fn ipv6_cidrs() {
    let c6 = conn(Some(("td", "ns", "sa")), "2001:db8::1", "fd00::2", 80);
    let cases = [
        (m(|m| m.source_ips = vec![cidr("2001:db8::/32")]), true),
        (m(|m| m.source_ips = vec![cidr("2001:db8::1")]), true),
        (m(|m| m.source_ips = vec![cidr("2001:db8::2")]), false),
        (m(|m| m.source_ips = vec![cidr("2001:db9::/32")]), false),
        (m(|m| m.source_ips = vec![cidr("0.0.0.0/0")]), false),
        (m(|m| m.source_ips = vec![cidr("::/0")]), true),
        (m(|m| m.not_source_ips = vec![cidr("2001:db8::/64")]), false),
        (m(|m| m.destination_ips = vec![cidr("fd00::/8")]), true),
        (m(|m| m.not_destination_ips = vec![cidr("fd00::2")]), false),
        (m(|m| m.not_destination_ips = vec![cidr("fd00::3")]), true),
    ];
    for (i, (m, want)) in cases.into_iter().enumerate() {
        assert_eq!(allow("v6", m).matches(&c6), want, "case {i}");
    }
}

#[test]
fn ipv4_mapped_connection_addresses_match_ipv4_cidrs() {
    let c = conn(None, "::ffff:10.0.0.1", "::ffff:10.0.0.2", 80);
    let cases = [
        (m(|m| m.source_ips = vec![cidr("10.0.0.0/8")]), true),
        (m(|m| m.destination_ips = vec![cidr("10.0.0.2")]), true),
        (m(|m| m.source_ips = vec![cidr("::/0")]), false),
    ];
    for (i, (m, want)) in cases.into_iter().enumerate() {
        assert_eq!(allow("mapped", m).matches(&c), want, "case {i}");
    }
}

#[test]
fn invalid_addresses_and_ports_are_dropped() {
    let bad_len = xds::Address {
        address: vec![10, 0, 0],
        length: 24,
    };
    let bad_prefix = xds::Address {
        address: vec![10, 0, 0, 1],
        length: 33,
    };
    let p = allow(
        "bad",
        xds::Match {
            source_ips: vec![bad_len, bad_prefix, cidr("10.1.0.0/16")],
            destination_ports: vec![70_000, 9090],
            ..Default::default()
        },
    );
    let rule = &p.groups[0][0][0];
    assert_eq!(rule.source_ips.len(), 1);
    assert_eq!(rule.destination_ports, vec![9090]);
    assert!(p.matches(&tls_alt()));
    assert!(!p.matches(&tls()));
}

#[test]
fn string_matcher_edge_cases() {
    let cases = [
        (StringMatch::Exact("a".into()), "a", true),
        (StringMatch::Exact("a".into()), "", false),
        (StringMatch::Prefix("a".into()), "ab", true),
        (StringMatch::Prefix("a".into()), "", false),
        (StringMatch::Suffix("b".into()), "ab", true),
        (StringMatch::Suffix("b".into()), "ba", false),
        (StringMatch::Presence, "x", true),
        (StringMatch::Presence, "", false),
    ];
    for (m, v, want) in cases {
        assert_eq!(m.matches(v), want, "{m:?} on {v:?}");
    }
    assert!(StringMatch::Presence.matches_principal("spiffe://td/ns/a/sa/b"));
    assert!(!StringMatch::Presence.matches_principal("td/ns/a/sa/b"));
    assert!(!StringMatch::Presence.matches_principal(""));
}

// ---------- nesting and empty cases ----------

fn ns_match(ns: &str) -> xds::Match {
    xds::Match {
        namespaces: vec![exact(ns)],
        ..Default::default()
    }
}

fn port_match(port: u32) -> xds::Match {
    xds::Match {
        destination_ports: vec![port],
        ..Default::default()
    }
}

fn allow_groups(groups: Groups) -> Policy {
    compile(&wire(
        "default",
        "p",
        xds::Scope::Namespace,
        xds::Action::Allow,
        groups,
    ))
}

#[test]
fn empty_structures_follow_upstream() {
    let only_ext = xds::Match {
        extensions: vec![Default::default()],
        ..Default::default()
    };
    let cases: Vec<(&str, Groups, bool)> = vec![
        ("no groups never matches", vec![], false),
        ("group without rules matches", vec![vec![]], true),
        ("rule without matches matches", vec![vec![vec![]]], true),
        (
            "rule of one empty match never matches",
            vec![vec![vec![xds::Match::default()]]],
            false,
        ),
        (
            "extension-only match is empty",
            vec![vec![vec![only_ext]]],
            false,
        ),
        (
            "empty match is skipped, not fatal",
            vec![vec![vec![xds::Match::default(), port_match(8080)]]],
            true,
        ),
        (
            "empty group beside a failing one",
            vec![vec![vec![port_match(1)]], vec![]],
            true,
        ),
    ];
    for (case, groups, want) in cases {
        assert_eq!(allow_groups(groups).matches(&tls()), want, "{case}");
    }
    assert!(!allow_groups(vec![vec![vec![xds::Match::default()]]]).matches(&plaintext()));
}

#[test]
fn groups_or_rules_and_matches_or() {
    // One group: (ns default OR ns other) AND port 8080.
    let and = allow_groups(vec![vec![
        vec![ns_match("default"), ns_match("other")],
        vec![port_match(8080)],
    ]]);
    assert!(and.matches(&tls()));
    assert!(!and.matches(&tls_alt()), "other ns but port 9090");
    assert!(!and.matches(&plaintext()), "no namespace");
    let mut other_8080 = tls_alt();
    other_8080.dst_port = 8080;
    assert!(and.matches(&other_8080));
    other_8080.dst_network = "remote".into();
    assert!(
        and.matches(&other_8080),
        "policies apply whatever the network"
    );

    // Two groups: ns default OR ns other.
    let or = allow_groups(vec![
        vec![vec![ns_match("default")]],
        vec![vec![ns_match("other")]],
    ]);
    assert!(or.matches(&tls()));
    assert!(or.matches(&tls_alt()));
    assert!(!or.matches(&plaintext()));
}

// ---------- conversion ----------

#[test]
fn conversion_rejects_unknown_enums() {
    let mut a = wire("ns", "p", xds::Scope::Global, xds::Action::Deny, vec![]);
    a.scope = 7;
    let err = Policy::try_from(&a).expect_err("bad scope");
    assert_eq!(
        err,
        RbacError::UnknownScope {
            policy: "ns/p".into(),
            value: 7
        }
    );
    assert_eq!(err.reason(), "unknown_scope");
    assert!(err.to_string().contains("ns/p"));

    let mut a = wire("ns", "p", xds::Scope::Global, xds::Action::Deny, vec![]);
    a.action = 9;
    let err = Policy::try_from(&a).expect_err("bad action");
    assert_eq!(
        err,
        RbacError::UnknownAction {
            policy: "ns/p".into(),
            value: 9
        }
    );
    assert_eq!(err.reason(), "unknown_action");
}

#[test]
fn conversion_keeps_identity_fields() {
    let mut a = wire(
        "ns",
        "p",
        xds::Scope::WorkloadSelector,
        xds::Action::Deny,
        vec![],
    );
    a.dry_run = true;
    let p = compile(&a);
    assert_eq!(
        (p.scope, p.action, p.dry_run),
        (Scope::WorkloadSelector, Action::Deny, true)
    );
    assert_eq!(p.key(), "ns/p");
    assert_eq!(p.to_string(), "ns/p");
}

// ---------- decision ----------

#[test]
fn decision_table() {
    let deny_tls = deny(
        "deny-tls",
        xds::Match {
            principals: vec![presence()],
            ..Default::default()
        },
    );
    let deny_9090 = deny("deny-9090", port_match(9090));
    let allow_default = allow("allow-default", ns_match("default"));
    let allow_8080 = allow("allow-8080", port_match(8080));
    let allow_other = allow("allow-other", ns_match("other"));
    let allowed = |p: &str| Decision::Allowed {
        policy: format!("default/{p}"),
    };
    let denied = |p: &str| Decision::Denied {
        policy: format!("default/{p}"),
    };

    let cases: Vec<(&str, Vec<&Policy>, Connection, Decision)> = vec![
        ("no policies", vec![], tls(), Decision::NoAllowPolicies),
        (
            "only non-matching deny",
            vec![&deny_9090],
            tls(),
            Decision::NoAllowPolicies,
        ),
        (
            "matching deny",
            vec![&deny_9090],
            tls_alt(),
            denied("deny-9090"),
        ),
        (
            "deny before allow",
            vec![&allow_default, &deny_tls],
            tls(),
            denied("deny-tls"),
        ),
        (
            "allow matches",
            vec![&allow_default, &deny_9090],
            tls(),
            allowed("allow-default"),
        ),
        (
            "first matching allow decides",
            vec![&allow_other, &allow_8080, &allow_default],
            tls(),
            allowed("allow-8080"),
        ),
        (
            "no allow matches",
            vec![&allow_other],
            tls(),
            Decision::NotAllowed,
        ),
        (
            "plaintext vs namespace allow",
            vec![&allow_default],
            plaintext(),
            Decision::NotAllowed,
        ),
        (
            "plaintext vs port allow",
            vec![&allow_8080],
            plaintext(),
            allowed("allow-8080"),
        ),
    ];
    for (case, policies, c, want) in cases {
        assert_eq!(authorize(&c, policies), want, "{case}");
    }
}

#[test]
fn dry_run_is_never_enforced() {
    let dry_deny = dry(deny("dry-deny", port_match(8080)));
    let dry_allow = dry(allow("dry-allow", port_match(1)));
    let allow_tls = allow(
        "allow-tls",
        xds::Match {
            principals: vec![presence()],
            ..Default::default()
        },
    );

    // A matching dry-run DENY does not deny.
    assert_eq!(authorize(&tls(), [&dry_deny]), Decision::NoAllowPolicies);
    // A dry-run ALLOW does not make "ALLOW policies exist".
    assert_eq!(authorize(&tls(), [&dry_allow]), Decision::NoAllowPolicies);
    assert_eq!(
        authorize(&tls(), [&dry_deny, &allow_tls]),
        Decision::Allowed {
            policy: "default/allow-tls".into()
        }
    );
    assert_eq!(
        authorize(&plaintext(), [&dry_deny, &allow_tls]),
        Decision::NotAllowed
    );

    let all = [&dry_deny, &dry_allow, &allow_tls];
    let hits: Vec<String> = dry_run_matches(&tls(), all)
        .iter()
        .map(|p| p.key())
        .collect();
    assert_eq!(hits, vec!["default/dry-deny".to_string()]);
}

#[test]
fn decision_accessors() {
    let cases = [
        (
            Decision::Allowed {
                policy: "a/b".into(),
            },
            true,
            Some("a/b"),
            "allow_policy_matched",
        ),
        (Decision::NoAllowPolicies, true, None, "no_allow_policies"),
        (
            Decision::Denied {
                policy: "a/c".into(),
            },
            false,
            Some("a/c"),
            "explicitly_denied",
        ),
        (Decision::NotAllowed, false, None, "not_allowed"),
    ];
    for (d, allowed, policy, reason) in cases {
        assert_eq!(d.is_allowed(), allowed, "{d}");
        assert_eq!(d.policy(), policy, "{d}");
        assert_eq!(d.reason(), reason, "{d}");
    }
    assert_eq!(
        Decision::Denied {
            policy: "a/c".into()
        }
        .to_string(),
        "explicitly denied by policy a/c"
    );
}

#[test]
fn connection_display() {
    assert_eq!(
        plaintext().to_string(),
        "10.0.0.1(plaintext)->10.0.0.2:8080"
    );
    assert_eq!(
        tls().to_string(),
        "10.0.0.1(spiffe://cluster.local/ns/default/sa/sleep)->10.0.0.2:8080"
    );
    let c6 = conn(None, "2001:db8::1", "fd00::2", 80);
    assert_eq!(c6.to_string(), "2001:db8::1(plaintext)->[fd00::2]:80");
}

// ---------- istiod's static STRICT policy ----------

fn static_strict() -> xds::Authorization {
    let m = xds::Match {
        not_principals: vec![presence()],
        ..Default::default()
    };
    wire(
        "istio-system",
        "istio_converted_static_strict",
        xds::Scope::WorkloadSelector,
        xds::Action::Deny,
        vec![vec![vec![m]]],
    )
}

fn workload(ns: &str, policies: &[&str]) -> Workload {
    Workload {
        name: "app".into(),
        namespace: ns.into(),
        authorization_policies: policies.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn static_strict_denies_plaintext_and_allows_mtls() {
    let mut set = PolicySet::new();
    set.insert(compile(&static_strict()));
    let strict = workload("default", &["istio-system/istio_converted_static_strict"]);
    let permissive = workload("default", &[]);

    let applied = set.for_workload(&strict);
    assert_eq!(
        authorize(&plaintext(), applied.iter().copied()),
        Decision::Denied {
            policy: "istio-system/istio_converted_static_strict".into()
        }
    );
    assert_eq!(
        authorize(&tls(), applied.iter().copied()),
        Decision::NoAllowPolicies
    );
    assert_eq!(authorize(&tls_alt(), applied), Decision::NoAllowPolicies);
    // Not listed by the workload: not applied.
    assert_eq!(
        authorize(&plaintext(), set.for_workload(&permissive)),
        Decision::NoAllowPolicies
    );
}

// ---------- policy selection ----------

fn scoped(ns: &str, name: &str, scope: xds::Scope) -> Policy {
    compile(&wire(ns, name, scope, xds::Action::Allow, vec![]))
}

fn keys(v: Vec<&Policy>) -> Vec<String> {
    v.into_iter().map(Policy::key).collect()
}

#[test]
fn selection_by_scope() {
    let mut set = PolicySet::new();
    set.insert(scoped("istio-system", "global", xds::Scope::Global));
    set.insert(scoped("default", "ns-wide", xds::Scope::Namespace));
    set.insert(scoped("other", "ns-wide", xds::Scope::Namespace));
    set.insert(scoped("default", "selected", xds::Scope::WorkloadSelector));
    set.insert(scoped(
        "default",
        "unselected",
        xds::Scope::WorkloadSelector,
    ));
    assert_eq!(set.len(), 5);

    let cases: Vec<(&str, Workload, Vec<&str>)> = vec![
        (
            "plain",
            workload("default", &[]),
            vec!["default/ns-wide", "istio-system/global"],
        ),
        (
            "selected",
            workload("default", &["default/selected"]),
            vec!["default/ns-wide", "istio-system/global", "default/selected"],
        ),
        (
            "other ns",
            workload("other", &[]),
            vec!["other/ns-wide", "istio-system/global"],
        ),
        (
            "no ns policy",
            workload("third", &[]),
            vec!["istio-system/global"],
        ),
        (
            "duplicates and unknown keys",
            workload(
                "other",
                &["other/ns-wide", "gone/policy", "istio-system/global"],
            ),
            vec!["other/ns-wide", "istio-system/global"],
        ),
    ];
    for (case, wl, want) in cases {
        assert_eq!(keys(set.for_workload(&wl)), want, "{case}");
    }
}

#[test]
fn insert_replace_and_remove_keep_the_index() {
    let mut set = PolicySet::new();
    assert!(set.is_empty());
    assert!(set
        .insert(scoped("default", "p", xds::Scope::Namespace))
        .is_none());
    assert_eq!(keys(set.applicable("default", &[])), vec!["default/p"]);

    // Replaced by a selector policy: no longer namespace-wide.
    let old = set.insert(scoped("default", "p", xds::Scope::WorkloadSelector));
    assert_eq!(old.map(|p| p.scope), Some(Scope::Namespace));
    assert!(set.applicable("default", &[]).is_empty());
    assert_eq!(
        keys(set.applicable("default", &["default/p".into()])),
        vec!["default/p"]
    );

    set.insert(scoped("istio-system", "g", xds::Scope::Global));
    assert_eq!(set.iter().count(), 2);
    assert!(set.remove("istio-system/g").is_some());
    assert!(set.remove("istio-system/g").is_none());
    assert!(set.applicable("x", &[]).is_empty());
    assert!(set.get("default/p").is_some());
    assert!(set.remove("default/p").is_some());
    assert!(set.is_empty());
}
