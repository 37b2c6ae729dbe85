//! PeerAuthentication -> L4 DENY policies, as Istio's ambient control plane converts them.
//!
//! - While any PeerAuthentication exists, the static policy `istio_converted_static_strict`
//!   (root namespace, WORKLOAD_SELECTOR, DENY when the peer has no principal) is served, and
//!   each workload whose effective mode is STRICT lists it in `authorization_policies`.
//! - The effective mode: mesh (root namespace, no selector), overridden by the namespace policy
//!   (unless UNSET), overridden by the workload policy (oldest of each wins).
//! - A workload policy with `portLevelMtls` exceptions becomes its own DENY policy
//!   `converted_peer_authentication_<name>`, listed instead of the static one.

use std::collections::BTreeMap;

use mesh_api::{MtlsMode, PeerAuthentication, PeerAuthenticationMtls};
use mesh_proto::security::{
    string_match, Action, Authorization, Group, Match, Rules, Scope, StringMatch,
};

/// Name of the static STRICT policy (underscores cannot clash with Kubernetes names).
pub const STATIC_STRICT_POLICY_NAME: &str = "istio_converted_static_strict";
/// Prefix of converted workload PeerAuthentications.
pub(crate) const CONVERTED_PREFIX: &str = "converted_peer_authentication_";

/// The static STRICT policy in `root_ns`.
pub fn static_strict_policy(root_ns: &str) -> Authorization {
    Authorization {
        name: STATIC_STRICT_POLICY_NAME.into(),
        namespace: root_ns.into(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        groups: vec![Group {
            rules: vec![Rules {
                matches: vec![no_principal(None)],
            }],
        }],
        ..Default::default()
    }
}

/// A match of plaintext peers (no principal), optionally on one port.
fn no_principal(port: Option<u32>) -> Match {
    Match {
        not_principals: vec![StringMatch {
            match_type: Some(string_match::MatchType::Presence(())),
        }],
        destination_ports: port.into_iter().collect(),
        ..Default::default()
    }
}

fn mode(m: Option<&PeerAuthenticationMtls>) -> MtlsMode {
    m.map(|m| m.mode).unwrap_or_default()
}

fn lax(m: MtlsMode) -> bool {
    matches!(m, MtlsMode::Permissive | MtlsMode::Disable)
}

/// Port-level modes sorted by port number (unparsable ports are ignored).
fn port_modes(pa: &PeerAuthentication) -> Vec<(u32, MtlsMode)> {
    let mut ports: Vec<(u32, MtlsMode)> = (pa.spec.port_level_mtls.iter())
        .filter_map(|(p, m)| p.parse::<u16>().ok().map(|p| (u32::from(p), m.mode)))
        .collect();
    ports.sort_unstable_by_key(|(p, _)| *p);
    ports
}

/// The oldest policy (creation time, then name) of a set, as Istio picks among conflicting ones.
pub(crate) fn oldest<'a>(
    it: impl Iterator<Item = &'a PeerAuthentication>,
) -> Option<&'a PeerAuthentication> {
    it.min_by(|a, b| {
        let key = |p: &'a PeerAuthentication| {
            (
                p.metadata.creation_timestamp.clone(),
                p.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    })
}

/// The policy keys (`ns/name`) a workload lists because of PeerAuthentications: the static
/// STRICT one and/or its converted workload policy.
pub(crate) fn effective_keys(
    root_ns: &str,
    mesh: Option<&PeerAuthentication>,
    namespace: Option<&PeerAuthentication>,
    workload: Option<&PeerAuthentication>,
) -> Vec<String> {
    let mut strict = mesh.is_some_and(|p| mode(p.spec.mtls.as_ref()) == MtlsMode::Strict);
    if let Some(m) = namespace.map(|p| mode(p.spec.mtls.as_ref())) {
        if m != MtlsMode::Unset {
            strict = m == MtlsMode::Strict;
        }
    }
    let mut converted = None;
    if let Some(w) = workload {
        let wmode = mode(w.spec.mtls.as_ref());
        match wmode {
            MtlsMode::Strict => strict = true,
            m if lax(m) => strict = false,
            _ => {}
        }
        let ports = port_modes(w);
        let any = |f: fn(MtlsMode) -> bool| ports.iter().any(|(_, m)| f(*m));
        let needs_converted = match wmode {
            MtlsMode::Strict => any(lax),
            m if lax(m) => any(|m| m == MtlsMode::Strict),
            _ if strict => any(|m| m == MtlsMode::Permissive),
            _ => any(|m| m == MtlsMode::Strict),
        };
        if needs_converted {
            // The converted policy carries the STRICT part itself.
            let ns = w.metadata.namespace.as_deref().unwrap_or("default");
            let name = w.metadata.name.as_deref().unwrap_or_default();
            converted = Some(format!("{ns}/{CONVERTED_PREFIX}{name}"));
            strict = false;
        }
    }
    let mut keys: Vec<String> = strict
        .then(|| format!("{root_ns}/{STATIC_STRICT_POLICY_NAME}"))
        .into_iter()
        .chain(converted)
        .collect();
    keys.sort();
    keys
}

/// Converts a workload PeerAuthentication with port-level exceptions into its own DENY policy,
/// merging the effective namespace / mesh mode. `None` when the static policy covers it.
pub(crate) fn convert_peer_authentication(
    root_ns: &str,
    pa: &PeerAuthentication,
    ns_pa: Option<&PeerAuthentication>,
    root_pa: Option<&PeerAuthentication>,
) -> Option<Authorization> {
    let ns = pa.metadata.namespace.as_deref().unwrap_or("default");
    if ns == root_ns || pa.spec.selector.is_none() || pa.spec.port_level_mtls.is_empty() {
        return None;
    }
    let wmode = mode(pa.spec.mtls.as_ref());
    let ns_mode = ns_pa.map(|p| mode(p.spec.mtls.as_ref()));
    let root_mode = root_pa.map(|p| mode(p.spec.mtls.as_ref()));
    let parent_strict = ns_mode == Some(MtlsMode::Strict)
        || (matches!(ns_mode, None | Some(MtlsMode::Unset)) && root_mode == Some(MtlsMode::Strict));
    let mut rules = Vec::new();
    let mut groups = Vec::new();
    if wmode == MtlsMode::Strict {
        rules.push(Rules {
            matches: vec![no_principal(None)],
        });
    }
    let mut found_lax_port = false;
    for (port, pmode) in port_modes(pa) {
        if pmode == MtlsMode::Strict {
            if wmode == MtlsMode::Strict || (wmode == MtlsMode::Unset && parent_strict) {
                continue;
            }
            groups.push(Group {
                rules: vec![Rules {
                    matches: vec![no_principal(Some(port))],
                }],
            });
        } else if lax(pmode) {
            let lax_parent = match ns_mode {
                Some(m) => m != MtlsMode::Strict,
                None => root_mode != Some(MtlsMode::Strict),
            };
            if lax(wmode) || (wmode == MtlsMode::Unset && lax_parent) {
                continue;
            }
            found_lax_port = true;
            rules.push(Rules {
                matches: vec![Match {
                    not_destination_ports: vec![port],
                    ..Default::default()
                }],
            });
        }
    }
    if wmode == MtlsMode::Strict && !found_lax_port {
        return None;
    }
    if rules.is_empty() && groups.is_empty() {
        return None;
    }
    if parent_strict && found_lax_port && wmode != MtlsMode::Strict {
        rules.push(Rules {
            matches: vec![no_principal(None)],
        });
    }
    if !rules.is_empty() {
        groups.push(Group { rules });
    }
    Some(Authorization {
        name: format!(
            "{CONVERTED_PREFIX}{}",
            pa.metadata.name.as_deref().unwrap_or_default()
        ),
        namespace: ns.to_string(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        groups,
        ..Default::default()
    })
}

/// The selector labels of a workload-level PeerAuthentication (`None` for namespace/mesh ones).
pub(crate) fn pa_selector(pa: &PeerAuthentication) -> Option<&BTreeMap<String, String>> {
    pa.spec
        .selector
        .as_ref()
        .map(|s| &s.match_labels)
        .filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests;
