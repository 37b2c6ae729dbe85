//! L4 authorization of inbound connections (`istio.security.Authorization`), pure and I/O-free.
//!
//! - [`Policy`] is one compiled policy (`Policy::try_from(&proto)`), [`Policy::matches`] the
//!   matching of a [`Connection`] against it (semantics in [`policy`]).
//! - [`PolicySet`] holds the policies keyed `namespace/name` and selects those that apply to a
//!   destination workload ([`PolicySet::for_workload`]).
//! - [`authorize`] decides, as Istio documents and upstream ztunnel implements: dry-run policies
//!   are only logged; any matching DENY denies; no ALLOW policy allows; any matching ALLOW
//!   allows; otherwise deny.

use std::fmt;
use std::net::IpAddr;

use mesh_identity::Identity;
use tracing::{debug, info};

pub mod policy;
mod store;

pub use policy::{Action, Policy, RbacMatch, Scope, ServiceAccountMatch, StringMatch};
pub use store::PolicySet;

#[cfg(test)]
mod tests;

/// Errors converting an `Authorization` resource.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RbacError {
    /// The scope enum value is not one this ztunnel knows.
    #[error(
        "authorization policy {policy} has unknown scope {value}; is istiod newer than this \
         ztunnel? Upgrade ztunnel to match istiod"
    )]
    UnknownScope {
        /// `namespace/name` of the policy.
        policy: String,
        /// The wire value.
        value: i32,
    },
    /// The action enum value is not one this ztunnel knows.
    #[error(
        "authorization policy {policy} has unknown action {value}; is istiod newer than this \
         ztunnel? Upgrade ztunnel to match istiod"
    )]
    UnknownAction {
        /// `namespace/name` of the policy.
        policy: String,
        /// The wire value.
        value: i32,
    },
}

impl RbacError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RbacError::UnknownScope { .. } => "unknown_scope",
            RbacError::UnknownAction { .. } => "unknown_action",
        }
    }
}

/// The attributes of an inbound connection that L4 policy looks at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Connection {
    /// The peer's verified identity; `None` for a plaintext peer.
    pub src_identity: Option<Identity>,
    /// Source IP (IPv4-mapped IPv6 addresses are matched as IPv4).
    pub src_ip: IpAddr,
    /// Destination (workload) IP.
    pub dst_ip: IpAddr,
    /// Destination port.
    pub dst_port: u16,
    /// Network of the destination; policies apply whatever the network.
    pub dst_network: String,
}

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.src_identity {
            Some(id) => write!(f, "{}({id})", self.src_ip)?,
            None => write!(f, "{}(plaintext)", self.src_ip)?,
        }
        match self.dst_ip {
            IpAddr::V4(ip) => write!(f, "->{ip}:{}", self.dst_port),
            IpAddr::V6(ip) => write!(f, "->[{ip}]:{}", self.dst_port),
        }
    }
}

/// The outcome of [`authorize`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// An ALLOW policy matched.
    Allowed {
        /// `namespace/name` of the first matching ALLOW policy.
        policy: String,
    },
    /// No enforced ALLOW policy applies to the workload (and no DENY matched).
    NoAllowPolicies,
    /// A DENY policy matched.
    Denied {
        /// `namespace/name` of the first matching DENY policy.
        policy: String,
    },
    /// ALLOW policies apply to the workload but none matched.
    NotAllowed,
}

impl Decision {
    /// Whether the connection may proceed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. } | Decision::NoAllowPolicies)
    }

    /// The deciding policy, if one policy decided.
    pub fn policy(&self) -> Option<&str> {
        match self {
            Decision::Allowed { policy } | Decision::Denied { policy } => Some(policy),
            Decision::NoAllowPolicies | Decision::NotAllowed => None,
        }
    }

    /// Short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Decision::Allowed { .. } => "allow_policy_matched",
            Decision::NoAllowPolicies => "no_allow_policies",
            Decision::Denied { .. } => "explicitly_denied",
            Decision::NotAllowed => "not_allowed",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Allowed { policy } => write!(f, "allowed by policy {policy}"),
            Decision::NoAllowPolicies => write!(f, "allowed: no ALLOW policy applies"),
            Decision::Denied { policy } => write!(f, "explicitly denied by policy {policy}"),
            Decision::NotAllowed => write!(f, "denied: ALLOW policies exist but none matched"),
        }
    }
}

/// Decides whether `conn` may reach its destination workload, given the policies that apply to
/// that workload (see [`PolicySet::for_workload`]). Dry-run policies never change the decision;
/// those that match are logged (see [`dry_run_matches`]).
pub fn authorize<'a, I>(conn: &Connection, policies: I) -> Decision
where
    I: IntoIterator<Item = &'a Policy>,
{
    let peer = policy::Peer::new(conn);
    let (dry_run, enforced): (Vec<&Policy>, Vec<&Policy>) =
        policies.into_iter().partition(|p| p.dry_run);
    for p in dry_run.into_iter().filter(|p| p.matches_peer(&peer)) {
        info!(policy = %p, %conn, would = p.action.as_str(), "dry-run policy matched");
    }
    let (allow, deny): (Vec<&Policy>, Vec<&Policy>) = enforced
        .into_iter()
        .partition(|p| p.action == Action::Allow);
    let decision = if let Some(p) = deny.iter().find(|p| p.matches_peer(&peer)) {
        Decision::Denied { policy: p.key() }
    } else if allow.is_empty() {
        Decision::NoAllowPolicies
    } else if let Some(p) = allow.iter().find(|p| p.matches_peer(&peer)) {
        Decision::Allowed { policy: p.key() }
    } else {
        Decision::NotAllowed
    };
    debug!(%conn, %decision, "authorization decided");
    decision
}

/// The dry-run policies among `policies` that match `conn`: what they would do if enforced.
pub fn dry_run_matches<'a, I>(conn: &Connection, policies: I) -> Vec<&'a Policy>
where
    I: IntoIterator<Item = &'a Policy>,
{
    let peer = policy::Peer::new(conn);
    policies
        .into_iter()
        .filter(|p| p.dry_run && p.matches_peer(&peer))
        .collect()
}
