//! L7 AuthorizationPolicies on a waypoint (attached by `targetRefs`) -> Envoy RBAC HTTP filters.
//!
//! As Istio applies them: DENY policies first (a match answers 403), then, if any ALLOW policy
//! applies, a request must match one of them; AUDIT policies only mark requests (RBAC `LOG`).
//! A policy's rules are OR'ed; inside a rule `from`, `to` and `when` are AND'ed; inside a `from`
//! or `to` every field set must match (one of its values, none of its `not` values).
//! Principals are matched on the identity the source ztunnel presented (filter state
//! `io.istio.peer_principal`, recorded by `connect_terminate`).
//!
//! A field the waypoint cannot enforce is reported; it fails closed: an ALLOW rule using it
//! never matches, a DENY rule ignores it (denying more).

use std::collections::BTreeMap;

use mesh_api::{AuthorizationAction, Condition, Operation, Rule, Source};
use mesh_proto::envoy::pb::envoy::config::core::v3::CidrRange;
use mesh_proto::envoy::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action, Permission, Policy, Principal, Rbac,
};
use mesh_proto::envoy::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, HeaderMatcher,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::http::rbac::v3::Rbac as RbacFilter;
use mesh_proto::envoy::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use mesh_proto::envoy::pb::envoy::r#type::matcher::v3::{
    filter_state_matcher, path_matcher, string_matcher::MatchPattern, FilterStateMatcher,
    PathMatcher, RegexMatcher, StringMatcher,
};
use serde::Serialize;

use super::inputs::WaypointPolicy;
use super::{jwt, names};

/// A policy field the waypoint cannot enforce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum PolicyError {
    #[error("AuthorizationPolicy {policy}: {field} is not supported on this waypoint; {effect}")]
    Unsupported {
        policy: String,
        field: String,
        effect: String,
    },
    #[error("AuthorizationPolicy {policy}: {field} = {value:?} is invalid; {effect}")]
    Invalid {
        policy: String,
        field: String,
        value: String,
        effect: String,
    },
}

impl PolicyError {
    pub fn reason(&self) -> &'static str {
        match self {
            PolicyError::Unsupported { .. } => "unsupported_policy_field",
            PolicyError::Invalid { .. } => "invalid_policy_value",
        }
    }
}

/// Which chains the rules are for: HTTP chains check every field; TCP chains (Envoy's network
/// RBAC filter) see no requests, so HTTP fields there fail closed like unsupported ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Http,
    Tcp,
}

/// The RBAC rules (DENY, ALLOW, AUDIT, in that order, with their filter-name suffix) for a
/// chain with `policies`.
pub fn filters(
    policies: &[WaypointPolicy],
    layer: Layer,
    errors: &mut Vec<PolicyError>,
) -> Vec<(&'static str, Rbac)> {
    let mut by_action: BTreeMap<u8, BTreeMap<String, Policy>> = BTreeMap::new();
    for p in policies {
        let (order, allow) = match p.policy.spec.action {
            AuthorizationAction::Deny => (0, false),
            AuthorizationAction::Allow => (1, true),
            AuthorizationAction::Audit => (2, false),
            AuthorizationAction::Custom => {
                errors.push(PolicyError::Unsupported {
                    policy: p.key.clone(),
                    field: "action: CUSTOM".into(),
                    effect:
                        "no external authorizer is configured for waypoints; the policy is ignored"
                            .into(),
                });
                continue;
            }
        };
        let mut conv = Converter {
            policy: &p.key,
            allow,
            layer,
            errors: &mut *errors,
        };
        let rules = p.policy.spec.rules.as_deref().unwrap_or_default();
        for (i, rule) in rules.iter().enumerate() {
            if let Some(policy) = conv.rule(i, rule) {
                by_action.entry(order).or_default().insert(
                    format!(
                        "ns[{}]-policy[{}]-rule[{i}]",
                        namespace(&p.key),
                        name(&p.key)
                    ),
                    policy,
                );
            }
        }
        // An ALLOW policy with no usable rule still turns on "allow only what matches".
        if allow {
            by_action.entry(order).or_default();
        }
    }
    by_action
        .into_iter()
        .map(|(order, policies)| {
            let (action, label) = match order {
                0 => (Action::Deny, "deny"),
                1 => (Action::Allow, "allow"),
                _ => (Action::Log, "audit"),
            };
            let rules = Rbac {
                action: action as i32,
                policies: super::any::stable_map(policies),
                ..Rbac::default()
            };
            (label, rules)
        })
        .collect()
}

/// The HTTP RBAC filters of an HTTP chain: (filter name, config).
pub fn http_filters(
    policies: &[WaypointPolicy],
    errors: &mut Vec<PolicyError>,
) -> Vec<(String, RbacFilter)> {
    filters(policies, Layer::Http, errors)
        .into_iter()
        .map(|(label, rules)| {
            let filter = RbacFilter {
                rules: Some(rules),
                ..RbacFilter::default()
            };
            (format!("envoy.filters.http.rbac.{label}"), filter)
        })
        .collect()
}

/// The network RBAC filters of a TCP chain: (filter name, config).
pub fn tcp_filters(
    policies: &[WaypointPolicy],
    errors: &mut Vec<PolicyError>,
) -> Vec<(String, NetworkRbac)> {
    filters(policies, Layer::Tcp, errors)
        .into_iter()
        .map(|(label, rules)| {
            let filter = NetworkRbac {
                rules: Some(rules),
                stat_prefix: "tcp.".to_string(),
                ..NetworkRbac::default()
            };
            (format!("envoy.filters.network.rbac.{label}"), filter)
        })
        .collect()
}

fn namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

fn name(key: &str) -> &str {
    key.split_once('/').map_or(key, |(_, n)| n)
}

struct Converter<'a> {
    policy: &'a str,
    allow: bool,
    layer: Layer,
    errors: &'a mut Vec<PolicyError>,
}

/// What converting one field gave.
enum Part<T> {
    /// Constrains the match.
    Match(T),
    /// Nothing to add (field empty, or ignored in a DENY rule).
    Skip,
    /// The rule can never match (unsupported field in an ALLOW rule).
    Never,
}

impl Converter<'_> {
    fn effect(&self) -> String {
        if self.allow {
            "the ALLOW rule never matches".into()
        } else {
            "the DENY rule is applied without it (denying more)".into()
        }
    }

    fn unsupported<T>(&mut self, field: String) -> Part<T> {
        let effect = self.effect();
        self.errors.push(PolicyError::Unsupported {
            policy: self.policy.to_string(),
            field,
            effect,
        });
        if self.allow {
            Part::Never
        } else {
            Part::Skip
        }
    }

    /// Reports a malformed value; like [`Self::unsupported`], it fails closed.
    fn invalid<T>(&mut self, field: String, value: String) -> Part<T> {
        let effect = self.effect();
        self.errors.push(PolicyError::Invalid {
            policy: self.policy.to_string(),
            field,
            value,
            effect,
        });
        if self.allow {
            Part::Never
        } else {
            Part::Skip
        }
    }

    fn rule(&mut self, i: usize, rule: &Rule) -> Option<Policy> {
        let mut principals = Vec::new();
        for (j, from) in rule.from.iter().enumerate() {
            match self.source(&format!("rules[{i}].from[{j}].source"), &from.source) {
                Part::Match(p) => principals.push(p),
                Part::Skip => principals.push(any_principal()),
                Part::Never => {}
            }
        }
        if !rule.from.is_empty() && principals.is_empty() {
            return None;
        }
        let mut permissions = Vec::new();
        for (j, to) in rule.to.iter().enumerate() {
            match self.operation(&format!("rules[{i}].to[{j}].operation"), &to.operation) {
                Part::Match(p) => permissions.push(p),
                Part::Skip => permissions.push(any_permission()),
                Part::Never => {}
            }
        }
        if !rule.to.is_empty() && permissions.is_empty() {
            return None;
        }
        let mut when_principals = Vec::new();
        let mut when_permissions = Vec::new();
        for (j, cond) in rule.when.iter().enumerate() {
            match self.condition(&format!("rules[{i}].when[{j}]"), cond) {
                Part::Match(Cond::Principal(p)) => when_principals.push(p),
                Part::Match(Cond::Permission(p)) => when_permissions.push(p),
                Part::Skip => {}
                Part::Never => return None,
            }
        }
        let principal = and_principal(vec![
            or_principal(principals),
            and_principal(when_principals),
        ]);
        let permission = and_permission(vec![
            or_permission(permissions),
            and_permission(when_permissions),
        ]);
        Some(Policy {
            permissions: vec![permission],
            principals: vec![principal],
            ..Policy::default()
        })
    }

    fn source(&mut self, path: &str, s: &Source) -> Part<Principal> {
        let mut parts = Vec::new();
        let mut add = |values: &[String], not: bool, f: &dyn Fn(&str) -> Principal| {
            if values.is_empty() {
                return;
            }
            let any = or_principal(values.iter().map(|v| f(v)).collect());
            parts.push(if not { not_principal(any) } else { any });
        };
        add(&s.principals, false, &|v| {
            peer_principal(principal_pattern(v))
        });
        add(&s.not_principals, true, &|v| {
            peer_principal(principal_pattern(v))
        });
        add(&s.namespaces, false, &|v| {
            peer_principal(namespace_pattern(v))
        });
        add(&s.not_namespaces, true, &|v| {
            peer_principal(namespace_pattern(v))
        });
        add(&s.service_accounts, false, &|v| {
            peer_principal(service_account_pattern(v))
        });
        add(&s.not_service_accounts, true, &|v| {
            peer_principal(service_account_pattern(v))
        });
        for (field, values, not) in [
            ("ipBlocks", &s.ip_blocks, false),
            ("notIpBlocks", &s.not_ip_blocks, true),
            ("remoteIpBlocks", &s.remote_ip_blocks, false),
            ("notRemoteIpBlocks", &s.not_remote_ip_blocks, true),
        ] {
            if values.is_empty() {
                continue;
            }
            let mut ranges = Vec::new();
            for v in values {
                match cidr(v) {
                    Some(c) => ranges.push(Principal {
                        identifier: Some(principal::Identifier::DirectRemoteIp(c)),
                    }),
                    None => {
                        if let Part::Never =
                            self.invalid::<()>(format!("{path}.{field}"), v.clone())
                        {
                            return Part::Never;
                        }
                    }
                }
            }
            if !ranges.is_empty() {
                let any = or_principal(ranges);
                parts.push(if not { not_principal(any) } else { any });
            }
        }
        if !s.request_principals.is_empty() || !s.not_request_principals.is_empty() {
            if self.layer == Layer::Tcp {
                if let Part::Never = self.unsupported::<()>(format!(
                    "{path}.requestPrincipals on a TCP port (tokens are HTTP only)"
                )) {
                    return Part::Never;
                }
            } else {
                for (values, not) in [
                    (&s.request_principals, false),
                    (&s.not_request_principals, true),
                ] {
                    if !values.is_empty() {
                        let any = or_principal(
                            values.iter().map(|v| jwt::request_principal(v)).collect(),
                        );
                        parts.push(if not { not_principal(any) } else { any });
                    }
                }
            }
        }
        if parts.is_empty() {
            Part::Skip
        } else {
            Part::Match(and_principal(parts))
        }
    }

    fn operation(&mut self, path: &str, o: &Operation) -> Part<Permission> {
        if self.layer == Layer::Tcp {
            let http = [
                ("methods", &o.methods),
                ("notMethods", &o.not_methods),
                ("paths", &o.paths),
                ("notPaths", &o.not_paths),
                ("hosts", &o.hosts),
                ("notHosts", &o.not_hosts),
            ];
            for (field, values) in http {
                if !values.is_empty() {
                    if let Part::Never = self.unsupported::<()>(format!(
                        "{path}.{field} on a TCP port (HTTP attributes cannot be checked there)"
                    )) {
                        return Part::Never;
                    }
                }
            }
        }
        for (field, values) in [("ports", &o.ports), ("notPorts", &o.not_ports)] {
            for v in values.iter().filter(|v| v.parse::<u16>().is_err()) {
                if let Part::Never = self.invalid::<()>(format!("{path}.{field}"), v.clone()) {
                    return Part::Never;
                }
            }
        }
        let tcp = self.layer == Layer::Tcp;
        let mut parts = Vec::new();
        let mut add = |values: &[String], not: bool, f: &dyn Fn(&str) -> Option<Permission>| {
            let list: Vec<Permission> = values.iter().filter_map(|v| f(v)).collect();
            if list.is_empty() {
                return;
            }
            let any = or_permission(list);
            parts.push(if not { not_permission(any) } else { any });
        };
        let method = |v: &str| {
            Some(header_permission(
                ":method",
                MatchPattern::Exact(v.to_string()),
            ))
        };
        let url_path = |v: &str| {
            Some(Permission {
                rule: Some(permission::Rule::UrlPath(PathMatcher {
                    rule: Some(path_matcher::Rule::Path(string_matcher(glob(v)))),
                })),
            })
        };
        let host = |v: &str| {
            let pattern = glob(v);
            let regex = matches!(pattern, MatchPattern::SafeRegex(_));
            let mut m = string_matcher(pattern);
            // Envoy refuses ignore_case on a regex; `*` (any host) needs no case folding.
            m.ignore_case = !regex;
            Some(Permission {
                rule: Some(permission::Rule::Header(HeaderMatcher {
                    name: ":authority".into(),
                    header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(m)),
                    ..HeaderMatcher::default()
                })),
            })
        };
        let port = |v: &str| {
            v.parse::<u16>().ok().map(|p| Permission {
                rule: Some(permission::Rule::DestinationPort(u32::from(p))),
            })
        };
        if !tcp {
            add(&o.methods, false, &method);
            add(&o.not_methods, true, &method);
            add(&o.paths, false, &url_path);
            add(&o.not_paths, true, &url_path);
            add(&o.hosts, false, &host);
            add(&o.not_hosts, true, &host);
        }
        add(&o.ports, false, &port);
        add(&o.not_ports, true, &port);
        if parts.is_empty() {
            Part::Skip
        } else {
            Part::Match(and_permission(parts))
        }
    }

    fn condition(&mut self, path: &str, c: &Condition) -> Part<Cond> {
        let key = c.key.as_str();
        let values = |f: &dyn Fn(&str) -> Principal| {
            let mut p = Vec::new();
            if !c.values.is_empty() {
                p.push(or_principal(c.values.iter().map(|v| f(v)).collect()));
            }
            if !c.not_values.is_empty() {
                p.push(not_principal(or_principal(
                    c.not_values.iter().map(|v| f(v)).collect(),
                )));
            }
            and_principal(p)
        };
        if key == "source.principal" {
            return Part::Match(Cond::Principal(values(&|v| {
                peer_principal(principal_pattern(v))
            })));
        }
        if key == "source.namespace" {
            return Part::Match(Cond::Principal(values(&|v| {
                peer_principal(namespace_pattern(v))
            })));
        }
        if key.starts_with("request.") && self.layer == Layer::Tcp {
            return self.unsupported(format!(
                "{path}.key {key:?} on a TCP port (HTTP attributes cannot be checked there)"
            ));
        }
        // What the JWT filter verified (see `jwt.rs`).
        let claim = |claim_path: &[&str]| values(&|v| jwt::claim(claim_path, glob(v)));
        match key {
            "request.auth.principal" => {
                return Part::Match(Cond::Principal(values(&|v| jwt::request_principal(v))));
            }
            "request.auth.audiences" => return Part::Match(Cond::Principal(claim(&["aud"]))),
            "request.auth.presenter" => return Part::Match(Cond::Principal(claim(&["azp"]))),
            _ => {}
        }
        if key.starts_with("request.auth.claims") {
            return match jwt::claim_path(key) {
                Some(p) => Part::Match(Cond::Principal(claim(&p))),
                None => self.invalid(format!("{path}.key"), key.to_string()),
            };
        }
        if let Some(header) = key
            .strip_prefix("request.headers[")
            .and_then(|h| h.strip_suffix(']'))
        {
            let header = header.to_ascii_lowercase();
            let one = |v: &str| header_permission(&header, glob(v));
            let mut p = Vec::new();
            if !c.values.is_empty() {
                p.push(or_permission(c.values.iter().map(|v| one(v)).collect()));
            }
            if !c.not_values.is_empty() {
                p.push(not_permission(or_permission(
                    c.not_values.iter().map(|v| one(v)).collect(),
                )));
            }
            return Part::Match(Cond::Permission(and_permission(p)));
        }
        if key == "destination.port" {
            let mut ports = |values: &[String]| -> Option<Vec<Permission>> {
                let mut out = Vec::new();
                for v in values {
                    match v.parse::<u16>() {
                        Ok(p) => out.push(Permission {
                            rule: Some(permission::Rule::DestinationPort(u32::from(p))),
                        }),
                        Err(_) => {
                            if let Part::Never =
                                self.invalid::<()>(format!("{path}.values"), v.clone())
                            {
                                return None;
                            }
                        }
                    }
                }
                Some(out)
            };
            let (Some(yes), Some(no)) = (ports(&c.values), ports(&c.not_values)) else {
                return Part::Never;
            };
            let mut p = Vec::new();
            if !yes.is_empty() {
                p.push(or_permission(yes));
            }
            if !no.is_empty() {
                p.push(not_permission(or_permission(no)));
            }
            return Part::Match(Cond::Permission(and_permission(p)));
        }
        self.unsupported(format!("{path}.key {key:?}"))
    }
}

enum Cond {
    Principal(Principal),
    Permission(Permission),
}

/// Istio's value patterns: `*` (present), `prefix*`, `*suffix`, or exact.
pub(super) fn glob(v: &str) -> MatchPattern {
    if v == "*" {
        MatchPattern::SafeRegex(RegexMatcher {
            regex: ".+".into(),
            ..RegexMatcher::default()
        })
    } else if let Some(prefix) = v.strip_suffix('*') {
        MatchPattern::Prefix(prefix.to_string())
    } else if let Some(suffix) = v.strip_prefix('*') {
        MatchPattern::Suffix(suffix.to_string())
    } else {
        MatchPattern::Exact(v.to_string())
    }
}

/// A principal pattern (`cluster.local/ns/x/sa/y`, without `spiffe://`) against the peer's
/// SPIFFE URI.
fn principal_pattern(v: &str) -> MatchPattern {
    match glob(v) {
        MatchPattern::Exact(e) => MatchPattern::Exact(format!("spiffe://{e}")),
        MatchPattern::Prefix(p) => MatchPattern::Prefix(format!("spiffe://{p}")),
        other => other,
    }
}

fn namespace_pattern(v: &str) -> MatchPattern {
    if v == "*" {
        return glob(v);
    }
    let ns = match glob(v) {
        MatchPattern::Exact(e) => regex_escape(&e),
        MatchPattern::Prefix(p) => format!("{}[^/]*", regex_escape(&p)),
        MatchPattern::Suffix(s) => format!("[^/]*{}", regex_escape(&s)),
        _ => "[^/]*".into(),
    };
    MatchPattern::SafeRegex(RegexMatcher {
        regex: format!("spiffe://[^/]+/ns/{ns}/sa/[^/]+"),
        ..RegexMatcher::default()
    })
}

/// `serviceAccounts` entries are `namespace/name`.
fn service_account_pattern(v: &str) -> MatchPattern {
    let (ns, sa) = v.split_once('/').unwrap_or(("", v));
    MatchPattern::Suffix(format!("/ns/{ns}/sa/{sa}"))
}

fn regex_escape(s: &str) -> String {
    regex::escape(s)
}

pub(super) fn string_matcher(pattern: MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ..StringMatcher::default()
    }
}

fn peer_principal(pattern: MatchPattern) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::FilterState(FilterStateMatcher {
            key: names::FS_PEER_PRINCIPAL.to_string(),
            matcher: Some(filter_state_matcher::Matcher::StringMatch(string_matcher(
                pattern,
            ))),
        })),
    }
}

fn header_permission(name: &str, pattern: MatchPattern) -> Permission {
    Permission {
        rule: Some(permission::Rule::Header(HeaderMatcher {
            name: name.to_string(),
            header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(string_matcher(
                pattern,
            ))),
            ..HeaderMatcher::default()
        })),
    }
}

fn cidr(v: &str) -> Option<CidrRange> {
    let net: ipnet::IpNet = v
        .parse()
        .ok()
        .or_else(|| v.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))?;
    Some(CidrRange {
        address_prefix: net.network().to_string(),
        prefix_len: Some(mesh_proto::envoy::pb::google::protobuf::UInt32Value {
            value: u32::from(net.prefix_len()),
        }),
    })
}

fn any_principal() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Any(true)),
    }
}

fn any_permission() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn or_principal(mut ids: Vec<Principal>) -> Principal {
    match ids.len() {
        0 => any_principal(),
        1 => ids.remove(0),
        _ => Principal {
            identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
        },
    }
}

fn and_principal(ids: Vec<Principal>) -> Principal {
    let mut ids: Vec<Principal> = ids.into_iter().filter(|p| *p != any_principal()).collect();
    match ids.len() {
        0 => any_principal(),
        1 => ids.remove(0),
        _ => Principal {
            identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
        },
    }
}

fn not_principal(p: Principal) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(p))),
    }
}

fn or_permission(mut rules: Vec<Permission>) -> Permission {
    match rules.len() {
        0 => any_permission(),
        1 => rules.remove(0),
        _ => Permission {
            rule: Some(permission::Rule::OrRules(permission::Set { rules })),
        },
    }
}

fn and_permission(rules: Vec<Permission>) -> Permission {
    let mut rules: Vec<Permission> = rules
        .into_iter()
        .filter(|p| *p != any_permission())
        .collect();
    match rules.len() {
        0 => any_permission(),
        1 => rules.remove(0),
        _ => Permission {
            rule: Some(permission::Rule::AndRules(permission::Set { rules })),
        },
    }
}

fn not_permission(p: Permission) -> Permission {
    Permission {
        rule: Some(permission::Rule::NotRule(Box::new(p))),
    }
}
