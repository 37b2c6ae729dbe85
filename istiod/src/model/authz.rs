//! AuthorizationPolicy -> `istio.security.Authorization` (docs/compatibility.md, L4 authorization; Istio's ambient
//! conversion).
//!
//! Structure: each rule becomes one `Group`; its `to`, `from` and each `when` become one
//! `Rules` each (AND-ed), whose `Match`es are OR-ed. No rules: no groups (matches nothing);
//! `rules: [{}]`: one empty group (matches everything).
//!
//! HTTP (L7) attributes: an ALLOW rule that mentions one is dropped (never matches); a DENY rule
//! keeps its L4 part, as Istio does (more restrictive; a part left empty never matches).
//!
//! Invalid values (a CIDR or port that does not parse) fail closed:
//! - ALLOW: the whole rule is dropped (it never matches), other rules still apply;
//! - DENY: the field holding the bad value is left out of its match, which only widens the deny;
//!   a match left with no field at all then matches everything, so its `Rules` is dropped from
//!   the group (AND with "true"); a group with nothing left denies every connection.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use mesh_api::{AuthorizationAction, AuthorizationPolicy, Condition, Rule, RuleFrom, RuleTo};
use mesh_proto::security::{
    string_match, Action, Address, Authorization, Group, Match, Rules, Scope, ServiceAccountMatch,
    StringMatch,
};

use super::ModelError;

/// Istio's dry-run annotation.
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Result of converting one policy: the resource (if ztunnel enforces it) and the problems.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyConversion {
    pub authorization: Option<Authorization>,
    pub errors: Vec<ModelError>,
}

/// The selector of a policy that ztunnel attaches to workloads (`ns/name` in their
/// `authorization_policies`): one with a `selector`, no `targetRef(s)`, action ALLOW or DENY.
pub(crate) fn workload_selector(pol: &AuthorizationPolicy) -> Option<&BTreeMap<String, String>> {
    let spec = &pol.spec;
    let enforced = matches!(
        spec.action,
        AuthorizationAction::Allow | AuthorizationAction::Deny
    );
    let targeted = spec.target_ref.is_some() || !spec.target_refs.is_empty();
    spec.selector
        .as_ref()
        .filter(|_| enforced && !targeted)
        .map(|s| &s.match_labels)
}

/// Converts one AuthorizationPolicy. `targetRef(s)` policies are for waypoints (no resource,
/// no error); CUSTOM and AUDIT are not enforceable by ztunnel (no resource, an error).
pub fn convert_authorization_policy(root_ns: &str, pol: &AuthorizationPolicy) -> PolicyConversion {
    let ns = pol.metadata.namespace.as_deref().unwrap_or("default");
    let name = pol.metadata.name.as_deref().unwrap_or_default();
    let policy = format!("{ns}/{name}");
    let spec = &pol.spec;
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        tracing::debug!(%policy, "AuthorizationPolicy with targetRefs is for waypoints, not ztunnel");
        return PolicyConversion::default();
    }
    let action = match spec.action {
        AuthorizationAction::Allow => Action::Allow,
        AuthorizationAction::Deny => Action::Deny,
        other => {
            let action = format!("{other:?}").to_ascii_uppercase();
            return PolicyConversion {
                authorization: None,
                errors: vec![ModelError::UnsupportedAction { policy, action }],
            };
        }
    };
    let scope = match (&spec.selector, ns == root_ns) {
        (Some(_), _) => Scope::WorkloadSelector,
        (None, true) => Scope::Global,
        (None, false) => Scope::Namespace,
    };
    let mut conv = RuleConverter {
        action,
        ns,
        policy: policy.clone(),
        errors: Vec::new(),
        l7: BTreeSet::new(),
        rule_l7: false,
    };
    let groups: Vec<Group> = spec
        .rules
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, rule)| conv.rule(i, rule))
        .collect();
    let mut errors = conv.errors;
    if !conv.l7.is_empty() {
        errors.push(ModelError::HttpAttributes {
            policy,
            fields: conv.l7.into_iter().collect::<Vec<_>>().join(", "),
            effect: l7_effect(action, &groups).into(),
        });
    }
    let dry_run = pol
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRY_RUN_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    PolicyConversion {
        authorization: Some(Authorization {
            name: name.to_string(),
            namespace: ns.to_string(),
            scope: scope as i32,
            action: action as i32,
            groups,
            dry_run,
            extensions: Vec::new(),
        }),
        errors,
    }
}

fn l7_effect(action: Action, groups: &[Group]) -> &'static str {
    match action {
        Action::Allow => {
            "rules using them are left out of this ALLOW policy (they never match), \
             which is more restrictive than requested"
        }
        Action::Deny if has_effective_group(groups) => {
            "this DENY policy is enforced without the HTTP parts, \
             which is more restrictive than requested"
        }
        Action::Deny => {
            "after leaving them out this DENY policy has no enforceable rule at ztunnel \
             and has no effect; attach it to a waypoint with targetRefs"
        }
    }
}

/// Whether some group can match at ztunnel (empty matches never do).
fn has_effective_group(groups: &[Group]) -> bool {
    groups.iter().any(|g| {
        g.rules
            .iter()
            .all(|r| r.matches.iter().any(|m| *m != Match::default()))
    })
}

/// A match under construction: `widened` when a field was left out for an invalid value.
struct Built {
    m: Match,
    widened: bool,
}

struct RuleConverter<'a> {
    action: Action,
    ns: &'a str,
    policy: String,
    errors: Vec<ModelError>,
    l7: BTreeSet<String>,
    rule_l7: bool,
}

impl RuleConverter<'_> {
    fn mark_l7(&mut self, field: &str) {
        self.l7.insert(field.to_string());
        self.rule_l7 = true;
    }

    /// One rule -> one group, or `None` when the rule can never match (see the module docs).
    fn rule(&mut self, i: usize, rule: &Rule) -> Option<Group> {
        self.rule_l7 = false;
        let errors_before = self.errors.len();
        let mut parts: Vec<Vec<Built>> = Vec::new();
        if !rule.to.is_empty() {
            let to = rule.to.iter().enumerate();
            parts.push(
                to.map(|(j, t)| self.to(&format!("rules[{i}].to[{j}]"), t))
                    .collect(),
            );
        }
        if !rule.from.is_empty() {
            let from = rule.from.iter().enumerate();
            parts.push(
                from.map(|(j, f)| self.from(&format!("rules[{i}].from[{j}]"), f))
                    .collect(),
            );
        }
        for (j, when) in rule.when.iter().enumerate() {
            parts.push(vec![self.when(&format!("rules[{i}].when[{j}]"), when)]);
        }
        let has_l7 = self.rule_l7;
        let invalid = self.errors.len() > errors_before;
        if self.action == Action::Allow && (has_l7 || invalid) {
            return None;
        }
        let rules = parts
            .into_iter()
            .filter(|p| !p.iter().any(|b| b.widened && b.m == Match::default()))
            .map(|p| Rules {
                matches: p.into_iter().map(|b| b.m).collect(),
            })
            .collect();
        Some(Group { rules })
    }

    fn to(&mut self, path: &str, to: &RuleTo) -> Built {
        let op = &to.operation;
        for (field, values) in [
            ("hosts", &op.hosts),
            ("notHosts", &op.not_hosts),
            ("methods", &op.methods),
            ("notMethods", &op.not_methods),
            ("paths", &op.paths),
            ("notPaths", &op.not_paths),
        ] {
            if !values.is_empty() {
                self.mark_l7(field);
            }
        }
        let mut b = Built {
            m: Match::default(),
            widened: false,
        };
        let p = format!("{path}.operation");
        b.m.destination_ports = self.ports(&mut b, &format!("{p}.ports"), &op.ports);
        b.m.not_destination_ports = self.ports(&mut b, &format!("{p}.notPorts"), &op.not_ports);
        b
    }

    fn from(&mut self, path: &str, from: &RuleFrom) -> Built {
        let s = &from.source;
        if !s.request_principals.is_empty() {
            self.mark_l7("requestPrincipals");
        }
        if !s.not_request_principals.is_empty() {
            self.mark_l7("notRequestPrincipals");
        }
        let p = format!("{path}.source");
        let mut b = Built {
            m: Match::default(),
            widened: false,
        };
        let ips: Vec<String> = s
            .ip_blocks
            .iter()
            .chain(&s.remote_ip_blocks)
            .cloned()
            .collect();
        let not_ips: Vec<String> = (s.not_ip_blocks.iter().chain(&s.not_remote_ip_blocks))
            .cloned()
            .collect();
        b.m.source_ips = self.addresses(&mut b, &format!("{p}.ipBlocks"), &ips);
        b.m.not_source_ips = self.addresses(&mut b, &format!("{p}.notIpBlocks"), &not_ips);
        b.m.namespaces = string_matches(&s.namespaces);
        b.m.not_namespaces = string_matches(&s.not_namespaces);
        b.m.principals = string_matches(&s.principals);
        b.m.not_principals = string_matches(&s.not_principals);
        b.m.service_accounts = service_accounts(&s.service_accounts, self.ns);
        b.m.not_service_accounts = service_accounts(&s.not_service_accounts, self.ns);
        b
    }

    fn when(&mut self, path: &str, when: &Condition) -> Built {
        let mut b = Built {
            m: Match::default(),
            widened: false,
        };
        let (vals, nots) = (&when.values, &when.not_values);
        let (vp, np) = (format!("{path}.values"), format!("{path}.notValues"));
        match when.key.as_str() {
            "source.ip" | "remote.ip" => {
                b.m.source_ips = self.addresses(&mut b, &vp, vals);
                b.m.not_source_ips = self.addresses(&mut b, &np, nots);
            }
            "destination.ip" => {
                b.m.destination_ips = self.addresses(&mut b, &vp, vals);
                b.m.not_destination_ips = self.addresses(&mut b, &np, nots);
            }
            "destination.port" => {
                b.m.destination_ports = self.ports(&mut b, &vp, vals);
                b.m.not_destination_ports = self.ports(&mut b, &np, nots);
            }
            "source.namespace" => {
                b.m.namespaces = string_matches(vals);
                b.m.not_namespaces = string_matches(nots);
            }
            "source.principal" => {
                b.m.principals = string_matches(vals);
                b.m.not_principals = string_matches(nots);
            }
            key => self.mark_l7(key),
        }
        b
    }

    fn ports(&mut self, b: &mut Built, field: &str, values: &[String]) -> Vec<u32> {
        let parsed: Option<Vec<u32>> = values
            .iter()
            .map(|v| self.parse(field, v, parse_port))
            .collect();
        parsed.unwrap_or_else(|| {
            b.widened = true;
            Vec::new()
        })
    }

    fn addresses(&mut self, b: &mut Built, field: &str, values: &[String]) -> Vec<Address> {
        let parsed: Option<Vec<Address>> = values
            .iter()
            .map(|v| self.parse(field, v, parse_address))
            .collect();
        parsed.unwrap_or_else(|| {
            b.widened = true;
            Vec::new()
        })
    }

    fn parse<T>(&mut self, field: &str, value: &str, f: fn(&str) -> Option<T>) -> Option<T> {
        let parsed = f(value.trim());
        if parsed.is_none() {
            let effect = match self.action {
                Action::Allow => "the rule is left out of this ALLOW policy (it never matches)",
                Action::Deny => {
                    "the field is left out of this DENY rule, which denies more, not less"
                }
            };
            self.errors.push(ModelError::InvalidPolicyValue {
                policy: self.policy.clone(),
                field: field.to_string(),
                value: value.to_string(),
                effect: effect.into(),
            });
        }
        parsed
    }
}

fn parse_port(v: &str) -> Option<u32> {
    v.parse::<u16>().ok().map(u32::from)
}

/// A single IP (full length) or a CIDR.
fn parse_address(v: &str) -> Option<Address> {
    if let Ok(ip) = v.parse::<IpAddr>() {
        let length = if ip.is_ipv4() { 32 } else { 128 };
        return Some(Address {
            address: super::workload::ip_bytes(ip),
            length,
        });
    }
    let net = v.parse::<ipnet::IpNet>().ok()?;
    Some(Address {
        address: super::workload::ip_bytes(net.addr()),
        length: u32::from(net.prefix_len()),
    })
}

/// Istio's string patterns: `*` presence, `*x` suffix, `x*` prefix, else exact.
pub(crate) fn string_matches(values: &[String]) -> Vec<StringMatch> {
    values
        .iter()
        .map(|v| {
            let t = if v == "*" {
                string_match::MatchType::Presence(())
            } else if let Some(suffix) = v.strip_prefix('*') {
                string_match::MatchType::Suffix(suffix.to_string())
            } else if let Some(prefix) = v.strip_suffix('*') {
                string_match::MatchType::Prefix(prefix.to_string())
            } else {
                string_match::MatchType::Exact(v.clone())
            };
            StringMatch {
                match_type: Some(t),
            }
        })
        .collect()
}

/// `ns/sa`, or `sa` in the policy's namespace.
fn service_accounts(values: &[String], policy_ns: &str) -> Vec<ServiceAccountMatch> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) => ServiceAccountMatch {
                namespace: ns.to_string(),
                service_account: sa.to_string(),
            },
            None => ServiceAccountMatch {
                namespace: policy_ns.to_string(),
                service_account: v.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests;
