//! One L4 authorization policy, compiled from the `istio.security.Authorization` resource, and
//! the matching of one connection against it.
//!
//! Structure (field names as on the wire): a policy matches when ANY of its `groups` matches; a
//! group matches when ALL of its `rules` match; a rule matches when ANY of its `matches` matches;
//! a match matches when every non-empty field pair hits (positive list: any entry hits; negative
//! list: no entry hits). Edge cases follow upstream ztunnel: a policy with no groups never
//! matches, a group with no rules and a rule with no matches always match, and a match with no
//! fields is skipped (so a rule made only of empty matches never matches).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use mesh_proto::security::{self as xds, string_match::MatchType};
use tracing::{trace, warn};

use super::{Connection, RbacError};

const SPIFFE_PREFIX: &str = "spiffe://";

/// Whether a policy allows or denies what it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `ALLOW` (wire value 0).
    Allow,
    /// `DENY` (wire value 1).
    Deny,
}

impl Action {
    /// Lower-case name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

/// Which workloads a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every workload of the mesh (root-namespace policy without selector).
    Global,
    /// Every workload of the policy's namespace.
    Namespace,
    /// Only workloads that list the policy in `Workload.authorization_policies`.
    WorkloadSelector,
}

/// A string matcher as Istio encodes it. Principal patterns omit `spiffe://`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StringMatch {
    /// The whole value equals the pattern.
    Exact(String),
    /// The value starts with the pattern.
    Prefix(String),
    /// The value ends with the pattern.
    Suffix(String),
    /// The value is non-empty.
    Presence,
}

impl StringMatch {
    /// Matches a plain value (a namespace).
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(p) => value == p,
            StringMatch::Prefix(p) => value.starts_with(p.as_str()),
            StringMatch::Suffix(p) => value.ends_with(p.as_str()),
            StringMatch::Presence => !value.is_empty(),
        }
    }

    /// Matches a peer identity URI (`spiffe://td/ns/x/sa/y`), comparing the pattern with the URI
    /// stripped of `spiffe://`. Anything else, including the empty string of a plaintext peer,
    /// never matches.
    pub fn matches_principal(&self, uri: &str) -> bool {
        uri.strip_prefix(SPIFFE_PREFIX)
            .is_some_and(|id| self.matches(id))
    }

    fn from_xds(m: &xds::StringMatch) -> Option<Self> {
        Some(match m.match_type.as_ref()? {
            MatchType::Exact(s) => StringMatch::Exact(s.clone()),
            MatchType::Prefix(s) => StringMatch::Prefix(s.clone()),
            MatchType::Suffix(s) => StringMatch::Suffix(s.clone()),
            MatchType::Presence(()) => StringMatch::Presence,
        })
    }
}

/// A `(namespace, service account)` pair; matches the peer identity's own pair exactly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceAccountMatch {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Kubernetes service account.
    pub service_account: String,
}

/// One `Match`: every non-empty field pair must hit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RbacMatch {
    /// Source identity namespace, any of.
    pub namespaces: Vec<StringMatch>,
    /// Source identity namespace, none of.
    pub not_namespaces: Vec<StringMatch>,
    /// Source principal (`td/ns/x/sa/y`), any of.
    pub principals: Vec<StringMatch>,
    /// Source principal, none of.
    pub not_principals: Vec<StringMatch>,
    /// Source IP in any of these CIDRs.
    pub source_ips: Vec<IpNet>,
    /// Source IP in none of these CIDRs.
    pub not_source_ips: Vec<IpNet>,
    /// Destination IP in any of these CIDRs.
    pub destination_ips: Vec<IpNet>,
    /// Destination IP in none of these CIDRs.
    pub not_destination_ips: Vec<IpNet>,
    /// Destination port, any of.
    pub destination_ports: Vec<u16>,
    /// Destination port, none of.
    pub not_destination_ports: Vec<u16>,
    /// Source `(namespace, service account)`, any of.
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Source `(namespace, service account)`, none of.
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

/// The source attributes a match looks at, computed once per connection.
pub(super) struct Peer<'a> {
    conn: &'a Connection,
    /// `spiffe://...` URI, or empty for a plaintext peer.
    uri: String,
    /// Identity namespace, or empty for a plaintext peer.
    namespace: &'a str,
    src_ip: IpAddr,
    dst_ip: IpAddr,
}

impl<'a> Peer<'a> {
    pub(super) fn new(conn: &'a Connection) -> Self {
        let id = conn.src_identity.as_ref();
        Peer {
            conn,
            uri: id.map(ToString::to_string).unwrap_or_default(),
            namespace: id.map(|i| i.namespace()).unwrap_or_default(),
            src_ip: conn.src_ip.to_canonical(),
            dst_ip: conn.dst_ip.to_canonical(),
        }
    }

    fn service_account_is(&self, sa: &ServiceAccountMatch) -> bool {
        self.conn.src_identity.as_ref().is_some_and(|id| {
            id.namespace() == sa.namespace && id.service_account() == sa.service_account
        })
    }
}

/// Positive list empty or any entry hits, and negative list empty or no entry hits.
fn field_hits<T>(positive: &[T], negative: &[T], hit: impl Fn(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&hit)) && !negative.iter().any(&hit)
}

impl RbacMatch {
    /// True when no field is set: such a match is skipped.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
    }

    fn hits(&self, peer: &Peer<'_>) -> bool {
        let port = peer.conn.dst_port;
        field_hits(&self.destination_ports, &self.not_destination_ports, |p| {
            *p == port
        }) && field_hits(&self.destination_ips, &self.not_destination_ips, |n| {
            n.contains(&peer.dst_ip)
        }) && field_hits(&self.source_ips, &self.not_source_ips, |n| {
            n.contains(&peer.src_ip)
        }) && field_hits(&self.namespaces, &self.not_namespaces, |m| {
            m.matches(peer.namespace)
        }) && field_hits(&self.principals, &self.not_principals, |m| {
            m.matches_principal(&peer.uri)
        }) && field_hits(&self.service_accounts, &self.not_service_accounts, |sa| {
            peer.service_account_is(sa)
        })
    }

    fn from_xds(m: &xds::Match, policy: &str) -> Self {
        let strings = |v: &[xds::StringMatch]| v.iter().filter_map(StringMatch::from_xds).collect();
        let nets = |v: &[xds::Address]| v.iter().filter_map(|a| to_net(a, policy)).collect();
        let ports = |v: &[u32]| v.iter().filter_map(|p| to_port(*p, policy)).collect();
        let sas = |v: &[xds::ServiceAccountMatch]| {
            v.iter()
                .map(|s| ServiceAccountMatch {
                    namespace: s.namespace.clone(),
                    service_account: s.service_account.clone(),
                })
                .collect()
        };
        RbacMatch {
            namespaces: strings(&m.namespaces),
            not_namespaces: strings(&m.not_namespaces),
            principals: strings(&m.principals),
            not_principals: strings(&m.not_principals),
            source_ips: nets(&m.source_ips),
            not_source_ips: nets(&m.not_source_ips),
            destination_ips: nets(&m.destination_ips),
            not_destination_ips: nets(&m.not_destination_ips),
            destination_ports: ports(&m.destination_ports),
            not_destination_ports: ports(&m.not_destination_ports),
            service_accounts: sas(&m.service_accounts),
            not_service_accounts: sas(&m.not_service_accounts),
        }
    }
}

/// Converts an `Address{address, length}`: 4 or 16 address bytes and a prefix length of at most
/// 32 or 128 (0 is the whole address family, as `ipnet` and upstream ztunnel read it; istiod
/// sends the full length for a single IP). Invalid entries are dropped with a warning, as
/// upstream ztunnel does.
fn to_net(a: &xds::Address, policy: &str) -> Option<IpNet> {
    let ip = match a.address.len() {
        4 => <[u8; 4]>::try_from(a.address.as_slice())
            .ok()
            .map(IpAddr::from),
        16 => <[u8; 16]>::try_from(a.address.as_slice())
            .ok()
            .map(IpAddr::from),
        _ => None,
    };
    let net = ip.and_then(|ip| IpNet::new(ip, u8::try_from(a.length).ok()?).ok());
    if net.is_none() {
        warn!(
            policy,
            bytes = a.address.len(),
            length = a.length,
            "ignoring invalid address in authorization policy"
        );
    }
    net
}

/// Ports above 65535 cannot occur on a connection; istiod never sends them. Dropped with a
/// warning (upstream ztunnel truncates them to 16 bits instead).
fn to_port(p: u32, policy: &str) -> Option<u16> {
    let port = u16::try_from(p).ok();
    if port.is_none() {
        warn!(
            policy,
            port = p,
            "ignoring invalid port in authorization policy"
        );
    }
    port
}

/// A compiled L4 authorization policy.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Policy name.
    pub name: String,
    /// Policy namespace (the root namespace for GLOBAL policies).
    pub namespace: String,
    /// Which workloads it applies to.
    pub scope: Scope,
    /// ALLOW or DENY.
    pub action: Action,
    /// Groups (OR) of rules (AND) of matches (OR).
    pub groups: Vec<Vec<Vec<RbacMatch>>>,
    /// Evaluated and logged, never enforced.
    pub dry_run: bool,
}

impl Policy {
    /// The key policies are known by: `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the connection matches this policy (the action is not applied here).
    pub fn matches(&self, conn: &Connection) -> bool {
        self.matches_peer(&Peer::new(conn))
    }

    pub(super) fn matches_peer(&self, peer: &Peer<'_>) -> bool {
        let matched = self.groups.iter().any(|group| {
            group
                .iter()
                .all(|rule| rule.is_empty() || rule.iter().any(|m| !m.is_empty() && m.hits(peer)))
        });
        trace!(policy = %self, conn = %peer.conn, matched, "evaluated authorization policy");
        matched
    }
}

impl TryFrom<&xds::Authorization> for Policy {
    type Error = RbacError;

    fn try_from(a: &xds::Authorization) -> Result<Self, RbacError> {
        let key = format!("{}/{}", a.namespace, a.name);
        let scope = match xds::Scope::try_from(a.scope) {
            Ok(xds::Scope::Global) => Scope::Global,
            Ok(xds::Scope::Namespace) => Scope::Namespace,
            Ok(xds::Scope::WorkloadSelector) => Scope::WorkloadSelector,
            Err(_) => {
                return Err(RbacError::UnknownScope {
                    policy: key,
                    value: a.scope,
                })
            }
        };
        let action = match xds::Action::try_from(a.action) {
            Ok(xds::Action::Allow) => Action::Allow,
            Ok(xds::Action::Deny) => Action::Deny,
            Err(_) => {
                return Err(RbacError::UnknownAction {
                    policy: key,
                    value: a.action,
                })
            }
        };
        let groups = a
            .groups
            .iter()
            .map(|g| {
                g.rules
                    .iter()
                    .map(|r| {
                        r.matches
                            .iter()
                            .map(|m| RbacMatch::from_xds(m, &key))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Ok(Policy {
            name: a.name.clone(),
            namespace: a.namespace.clone(),
            scope,
            action,
            groups,
            dry_run: a.dry_run,
        })
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
