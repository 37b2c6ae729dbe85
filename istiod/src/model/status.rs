//! The status conditions istiod reports for ambient objects (docs/kubernetes.md, status):
//! `istio.io/WaypointBound` on Services and ServiceEntries that name a waypoint, and
//! `ZtunnelAccepted` / `WaypointAccepted` on AuthorizationPolicies. Computed from the model's
//! state on every build; a writer compares them with what it last wrote.

use std::collections::BTreeMap;

use mesh_api::{
    AuthorizationPolicy, Kind, Object, ObjectKey, PolicyTargetReference, StatusCondition,
    WAYPOINT_CLASS,
};

use super::state::{meta_labels, State, NO_LABELS};
use super::workload;
use super::{ModelConfig, ModelError};

/// The writers (server-side apply field managers), one per kind of report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatusWriter {
    /// Waypoint binding of Services and ServiceEntries.
    Service,
    /// Whether ztunnel enforces a policy.
    ZtunnelPolicy,
    /// Whether waypoints enforce a policy.
    WaypointPolicy,
}

impl StatusWriter {
    pub const ALL: [StatusWriter; 3] = [
        StatusWriter::Service,
        StatusWriter::ZtunnelPolicy,
        StatusWriter::WaypointPolicy,
    ];

    /// Istio's field manager for these writes.
    pub fn field_manager(self) -> &'static str {
        match self {
            StatusWriter::Service => "istio-ambient-service",
            StatusWriter::ZtunnelPolicy => "istio-ambient-ztunnel-policy",
            StatusWriter::WaypointPolicy => "istio-ambient-waypoint-policy",
        }
    }
}

pub const WAYPOINT_BOUND: &str = "istio.io/WaypointBound";
pub const ZTUNNEL_ACCEPTED: &str = "ZtunnelAccepted";
pub const WAYPOINT_ACCEPTED: &str = "WaypointAccepted";
/// Whether ingress gateways send a service's traffic through its waypoint.
pub const INGRESS_USE_WAYPOINT: &str = "istio.io/ingress-use-waypoint";

/// Conditions by object and writer. An object a writer reports nothing for is absent.
pub type Statuses = BTreeMap<(ObjectKey, StatusWriter), Vec<StatusCondition>>;

fn condition(type_: &str, ok: bool, reason: &str, message: String) -> StatusCondition {
    StatusCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: None,
        last_transition_time: None,
    }
}

/// Whether a change of an object of `kind` can change any condition: the reported objects, the
/// namespaces whose labels name waypoints, and the Gateways that are those waypoints.
pub(crate) fn depends_on(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Service
            | Kind::ServiceEntry
            | Kind::AuthorizationPolicy
            | Kind::Namespace
            | Kind::Gateway
    )
}

/// Every condition the current state calls for.
pub(crate) fn compute(
    cfg: &ModelConfig,
    state: &State,
    errors: &BTreeMap<ObjectKey, Vec<ModelError>>,
) -> Statuses {
    let mut out = Statuses::new();
    for kind in [Kind::Service, Kind::ServiceEntry] {
        for ns in state.namespaces_with(kind) {
            for obj in state.objects_in(kind, &ns) {
                let meta = match obj {
                    Object::Service(s) => &s.metadata,
                    Object::ServiceEntry(s) => &s.metadata,
                    _ => continue,
                };
                if let Some(c) = waypoint_bound(state, &ns, meta_labels(meta)) {
                    out.insert((obj.key(), StatusWriter::Service), vec![c]);
                }
            }
        }
    }
    for ns in state.namespaces_with(Kind::AuthorizationPolicy) {
        for obj in state.objects_in(Kind::AuthorizationPolicy, &ns) {
            let Object::AuthorizationPolicy(p) = obj else {
                continue;
            };
            let key = obj.key();
            let targets: Vec<&PolicyTargetReference> = p.spec.targets().collect();
            let (writer, mut c) = if targets.is_empty() {
                let errs = errors.get(&key).map(Vec::as_slice).unwrap_or_default();
                (StatusWriter::ZtunnelPolicy, ztunnel_accepted(errs))
            } else {
                let c = waypoint_accepted(cfg, state, &ns, &targets);
                (StatusWriter::WaypointPolicy, c)
            };
            c.observed_generation = generation(p);
            out.insert((key, writer), vec![c]);
        }
    }
    out
}

fn generation(p: &AuthorizationPolicy) -> Option<i64> {
    p.metadata.generation
}

/// The waypoint an object in `ns` names (see [`workload::named_waypoint`]).
fn named_waypoint<'a>(
    state: &'a State,
    ns: &'a str,
    labels: &'a BTreeMap<String, String>,
) -> Option<(&'a str, &'a str)> {
    let ns_labels = state
        .namespace(ns)
        .map(|n| meta_labels(&n.metadata))
        .unwrap_or(&NO_LABELS);
    workload::named_waypoint(labels, ns, ns_labels)
}

/// Whether a Gateway of class `istio-waypoint` exists with an address in its status (its
/// controller gives it one once the waypoint's Service exists).
fn waypoint_ready(state: &State, ns: &str, name: &str) -> bool {
    match state.get(&ObjectKey::new(Kind::Gateway, ns, name)) {
        Some(Object::Gateway(g)) => {
            g.spec.gateway_class_name == WAYPOINT_CLASS
                && g.status.as_ref().is_some_and(|s| !s.addresses.is_empty())
        }
        _ => false,
    }
}

fn waypoint_bound(
    state: &State,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Option<StatusCondition> {
    let (wp_ns, wp) = named_waypoint(state, ns, labels)?;
    if !waypoint_ready(state, wp_ns, wp) {
        return Some(condition(
            WAYPOINT_BOUND,
            false,
            "WaypointIsNotReady",
            format!("waypoint \"{wp_ns}/{wp}\" is not ready"),
        ));
    }
    let ingress = match labels.get(INGRESS_USE_WAYPOINT).map(String::as_str) {
        Some("true") => ". Ingress traffic will traverse the waypoint",
        Some(_) => ". Ingress traffic is not using the waypoint, set the istio.io/ingress-use-waypoint label to true if desired.",
        None => "",
    };
    Some(condition(
        WAYPOINT_BOUND,
        true,
        "WaypointAccepted",
        format!("Successfully attached to waypoint {wp_ns}/{wp}{ingress}"),
    ))
}

/// A policy without targets is ztunnel's: refused for an action it cannot enforce, accepted
/// with a warning when it names HTTP attributes, else accepted.
fn ztunnel_accepted(errors: &[ModelError]) -> StatusCondition {
    for e in errors {
        match e {
            ModelError::UnsupportedAction { action, .. } => {
                return condition(
                    ZTUNNEL_ACCEPTED,
                    false,
                    "UnsupportedValue",
                    format!("ztunnel does not support the {action} action"),
                )
            }
            ModelError::HttpAttributes { fields, effect, .. } => {
                return condition(
                    ZTUNNEL_ACCEPTED,
                    true,
                    "UnsupportedValue",
                    format!("ztunnel does not support HTTP attributes (found: {fields}). In ambient mode you must use a waypoint proxy to enforce HTTP rules; {effect}"),
                )
            }
            _ => {}
        }
    }
    condition(
        ZTUNNEL_ACCEPTED,
        true,
        "Accepted",
        "attached to ztunnel".into(),
    )
}

/// One target's verdict: (accepted, reason, message).
fn target_verdict(
    cfg: &ModelConfig,
    state: &State,
    policy_ns: &str,
    t: &PolicyTargetReference,
) -> (bool, &'static str, String) {
    let ns = t.namespace.as_deref().unwrap_or(policy_ns);
    let bound_service =
        |kind: Kind, labels: &BTreeMap<String, String>| match named_waypoint(state, ns, labels) {
            Some((wp_ns, wp)) => (true, "Accepted", format!("bound to {wp_ns}/{wp}")),
            None => (
                false,
                "AncestorNotBound",
                format!("{kind} {ns}/{} is not bound to a waypoint", t.name),
            ),
        };
    match t.kind.as_str() {
        "Service" => match state.get(&ObjectKey::new(Kind::Service, ns, &t.name)) {
            Some(Object::Service(s)) => bound_service(Kind::Service, meta_labels(&s.metadata)),
            _ => (
                false,
                "TargetNotFound",
                format!("Service {ns}/{} was not found", t.name),
            ),
        },
        "ServiceEntry" => match state.get(&ObjectKey::new(Kind::ServiceEntry, ns, &t.name)) {
            Some(Object::ServiceEntry(s)) => {
                bound_service(Kind::ServiceEntry, meta_labels(&s.metadata))
            }
            _ => (
                false,
                "TargetNotFound",
                format!("ServiceEntry {ns}/{} was not found", t.name),
            ),
        },
        "Gateway" => match state.get(&ObjectKey::new(Kind::Gateway, ns, &t.name)) {
            Some(Object::Gateway(g)) if g.spec.gateway_class_name == WAYPOINT_CLASS => {
                (true, "Accepted", format!("bound to {ns}/{}", t.name))
            }
            _ => (
                false,
                "TargetNotFound",
                format!("Gateway {ns}/{} was not found", t.name),
            ),
        },
        "GatewayClass" if policy_ns != cfg.root_namespace => (
            false,
            "Invalid",
            format!(
                "GatewayClass targets are only honoured in the root namespace {}",
                cfg.root_namespace
            ),
        ),
        "GatewayClass" if t.name == WAYPOINT_CLASS => {
            (true, "Accepted", format!("bound to {}", t.name))
        }
        "GatewayClass" => (
            false,
            "Invalid",
            format!("GatewayClass {} is not {WAYPOINT_CLASS}", t.name),
        ),
        other => (
            false,
            "Invalid",
            format!("{other} {ns}/{} is not a kind waypoints bind to", t.name),
        ),
    }
}

/// A policy with targets is the waypoints': one target's verdict as is; with several, accepted
/// when any is, `PartiallyInvalid` naming the others when only some are.
fn waypoint_accepted(
    cfg: &ModelConfig,
    state: &State,
    policy_ns: &str,
    targets: &[&PolicyTargetReference],
) -> StatusCondition {
    let verdicts: Vec<_> = targets
        .iter()
        .map(|t| (t, target_verdict(cfg, state, policy_ns, t)))
        .collect();
    if let [(_, (ok, reason, message))] = verdicts.as_slice() {
        return condition(WAYPOINT_ACCEPTED, *ok, reason, message.clone());
    }
    let invalid: Vec<String> = verdicts
        .iter()
        .filter(|(_, (ok, ..))| !ok)
        .map(|(t, _)| {
            let ns = t.namespace.as_deref().unwrap_or(policy_ns);
            format!("{}.{}:{ns}/{}", t.kind, t.group, t.name)
        })
        .collect();
    let accepted: Vec<&String> = verdicts
        .iter()
        .filter(|(_, (ok, ..))| *ok)
        .map(|(_, (_, _, m))| m)
        .collect();
    match (accepted.is_empty(), invalid.is_empty()) {
        (false, true) => condition(
            WAYPOINT_ACCEPTED,
            true,
            "Accepted",
            accepted
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
        (false, false) => condition(
            WAYPOINT_ACCEPTED,
            true,
            "PartiallyInvalid",
            format!("Invalid targetRefs: {}", invalid.join(", ")),
        ),
        _ => {
            let first = verdicts.first().map(|(_, v)| v.1).unwrap_or("Invalid");
            condition(
                WAYPOINT_ACCEPTED,
                false,
                first,
                format!("Invalid targetRefs: {}", invalid.join(", ")),
            )
        }
    }
}

#[cfg(test)]
mod tests;
