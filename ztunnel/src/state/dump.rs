//! The `/config_dump` view of the state (workloads and services in upstream ztunnel's shapes,
//! see `address_dump`), and
//! the policy shape shared with the `LOCAL_XDS_PATH` YAML (`rules` as nested lists).

use ipnet::IpNet;
use mesh_proto::security as sec;
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::address_dump::{EndpointDump, ServiceDump, WorkloadDump};
use super::local::LocalConfig;
use super::State;
use crate::rbac::{self, Policy, RbacMatch};

/// Everything the state holds, for `/config_dump`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateDump<'a> {
    /// Workloads in uid order.
    pub workloads: Vec<WorkloadDump<'a>>,
    /// Services in `namespace/hostname` order, with their endpoints.
    pub services: Vec<ServiceDump<'a>>,
    /// Policies in `namespace/name` order.
    pub policies: Vec<PolicyDump>,
    /// Endpoints waiting for their service: `namespace/hostname` to endpoints by workload uid
    /// (workloads that name a service istiod has not sent, or not yet).
    pub staged_services: BTreeMap<&'a str, BTreeMap<&'a str, EndpointDump<'a>>>,
    /// What `LOCAL_XDS_PATH` loaded (empty lists without it).
    pub static_config: Arc<LocalConfig>,
}

pub(super) fn dump(state: &State) -> StateDump<'_> {
    StateDump {
        workloads: state.workloads().map(WorkloadDump::from).collect(),
        services: state
            .services()
            .map(|s| ServiceDump::new(s, state))
            .collect(),
        policies: state.policies().iter().map(PolicyDump::from).collect(),
        staged_services: state
            .endpoint_keys()
            .filter(|key| state.service(key).is_none())
            .filter_map(|key| {
                let endpoints: BTreeMap<_, _> = state
                    .workloads_of_service(key)
                    .into_iter()
                    .map(|w| (w.uid.as_str(), EndpointDump::new(w, key)))
                    .collect();
                (!endpoints.is_empty()).then_some((key, endpoints))
            })
            .collect(),
        static_config: state.local_config(),
    }
}

/// A policy as dumped and as written in local config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyDump {
    /// Policy name.
    pub name: String,
    /// Policy namespace.
    pub namespace: String,
    /// `Global`, `Namespace` or `WorkloadSelector`.
    pub scope: ScopeName,
    /// `Allow` or `Deny`.
    pub action: ActionName,
    /// Groups (OR) of rules (AND) of matches (OR). String matchers are single-key maps
    /// (`{Exact: x}`) in YAML too, not YAML tags.
    #[serde(default)]
    pub rules: Vec<Vec<Vec<MatchDump>>>,
    /// Logged, never enforced.
    #[serde(default)]
    pub dry_run: bool,
}

/// Policy scope by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScopeName {
    /// Every workload.
    Global,
    /// Workloads of the policy's namespace.
    Namespace,
    /// Workloads listing the policy.
    WorkloadSelector,
}

/// Policy action by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActionName {
    /// Allow what matches.
    Allow,
    /// Deny what matches.
    Deny,
}

/// A string matcher as upstream ztunnel writes it: `{"Exact": x}`, `{"Prefix": x}`,
/// `{"Suffix": x}` or `{"Presence": []}`. Reading also takes the lowercase keys and
/// `{presence: {}}` that earlier builds of ours wrote and documented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StringMatchDump {
    /// Equal.
    Exact(String),
    /// Starts with.
    Prefix(String),
    /// Ends with.
    Suffix(String),
    /// Non-empty.
    Presence,
}

impl Serialize for StringMatchDump {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            StringMatchDump::Exact(s) => map.serialize_entry("Exact", s)?,
            StringMatchDump::Prefix(s) => map.serialize_entry("Prefix", s)?,
            StringMatchDump::Suffix(s) => map.serialize_entry("Suffix", s)?,
            StringMatchDump::Presence => map.serialize_entry("Presence", &[(); 0])?,
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for StringMatchDump {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(StringMatchVisitor)
    }
}

struct StringMatchVisitor;

impl<'de> serde::de::Visitor<'de> for StringMatchVisitor {
    type Value = StringMatchDump;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a one-key map: Exact, Prefix or Suffix with a string, or Presence")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let key: String = map.next_key()?.ok_or_else(|| {
            A::Error::custom("empty string matcher; want one of Exact, Prefix, Suffix, Presence")
        })?;
        let found = match key.as_str() {
            "Exact" | "exact" => StringMatchDump::Exact(map.next_value()?),
            "Prefix" | "prefix" => StringMatchDump::Prefix(map.next_value()?),
            "Suffix" | "suffix" => StringMatchDump::Suffix(map.next_value()?),
            "Presence" | "presence" => {
                map.next_value::<serde::de::IgnoredAny>()?;
                StringMatchDump::Presence
            }
            other => {
                return Err(A::Error::custom(format!(
                    "unknown string matcher {other:?}; want one of Exact, Prefix, Suffix, Presence"
                )))
            }
        };
        if map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::custom(
                "a string matcher has exactly one key (Exact, Prefix, Suffix or Presence)",
            ));
        }
        Ok(found)
    }
}

/// A service-account pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountDump {
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

/// One match; IPs are CIDRs (`10.0.0.0/8`, `10.0.0.1/32`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MatchDump {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<StringMatchDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<StringMatchDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<StringMatchDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<StringMatchDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<IpNet>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_source_ips: Vec<IpNet>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ips: Vec<IpNet>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ips: Vec<IpNet>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ports: Vec<u16>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ports: Vec<u16>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<ServiceAccountDump>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<ServiceAccountDump>,
}

impl From<&Policy> for PolicyDump {
    fn from(p: &Policy) -> Self {
        PolicyDump {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            scope: match p.scope {
                rbac::Scope::Global => ScopeName::Global,
                rbac::Scope::Namespace => ScopeName::Namespace,
                rbac::Scope::WorkloadSelector => ScopeName::WorkloadSelector,
            },
            action: match p.action {
                rbac::Action::Allow => ActionName::Allow,
                rbac::Action::Deny => ActionName::Deny,
            },
            rules: p
                .groups
                .iter()
                .map(|g| {
                    g.iter()
                        .map(|r| r.iter().map(MatchDump::from).collect())
                        .collect()
                })
                .collect(),
            dry_run: p.dry_run,
        }
    }
}

impl From<&RbacMatch> for MatchDump {
    fn from(m: &RbacMatch) -> Self {
        let strings = |v: &[rbac::StringMatch]| v.iter().map(StringMatchDump::from).collect();
        let sas = |v: &[rbac::ServiceAccountMatch]| {
            v.iter()
                .map(|s| ServiceAccountDump {
                    namespace: s.namespace.clone(),
                    service_account: s.service_account.clone(),
                })
                .collect()
        };
        MatchDump {
            namespaces: strings(&m.namespaces),
            not_namespaces: strings(&m.not_namespaces),
            principals: strings(&m.principals),
            not_principals: strings(&m.not_principals),
            source_ips: m.source_ips.clone(),
            not_source_ips: m.not_source_ips.clone(),
            destination_ips: m.destination_ips.clone(),
            not_destination_ips: m.not_destination_ips.clone(),
            destination_ports: m.destination_ports.clone(),
            not_destination_ports: m.not_destination_ports.clone(),
            service_accounts: sas(&m.service_accounts),
            not_service_accounts: sas(&m.not_service_accounts),
        }
    }
}

impl From<&rbac::StringMatch> for StringMatchDump {
    fn from(m: &rbac::StringMatch) -> Self {
        match m {
            rbac::StringMatch::Exact(s) => StringMatchDump::Exact(s.clone()),
            rbac::StringMatch::Prefix(s) => StringMatchDump::Prefix(s.clone()),
            rbac::StringMatch::Suffix(s) => StringMatchDump::Suffix(s.clone()),
            rbac::StringMatch::Presence => StringMatchDump::Presence,
        }
    }
}

impl PolicyDump {
    /// The wire resource this policy stands for (local config goes through the same
    /// conversion as xDS).
    pub fn to_proto(&self) -> sec::Authorization {
        sec::Authorization {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            scope: match self.scope {
                ScopeName::Global => sec::Scope::Global,
                ScopeName::Namespace => sec::Scope::Namespace,
                ScopeName::WorkloadSelector => sec::Scope::WorkloadSelector,
            } as i32,
            action: match self.action {
                ActionName::Allow => sec::Action::Allow,
                ActionName::Deny => sec::Action::Deny,
            } as i32,
            groups: self
                .rules
                .iter()
                .map(|g| sec::Group {
                    rules: g
                        .iter()
                        .map(|r| sec::Rules {
                            matches: r.iter().map(MatchDump::to_proto).collect(),
                        })
                        .collect(),
                })
                .collect(),
            dry_run: self.dry_run,
            extensions: Vec::new(),
        }
    }
}

impl MatchDump {
    fn to_proto(&self) -> sec::Match {
        let strings = |v: &[StringMatchDump]| v.iter().map(StringMatchDump::to_proto).collect();
        let ips = |v: &[IpNet]| {
            v.iter()
                .map(|n| sec::Address {
                    address: match n.addr() {
                        std::net::IpAddr::V4(a) => a.octets().to_vec(),
                        std::net::IpAddr::V6(a) => a.octets().to_vec(),
                    },
                    length: u32::from(n.prefix_len()),
                })
                .collect()
        };
        let ports = |v: &[u16]| v.iter().map(|p| u32::from(*p)).collect();
        let sas = |v: &[ServiceAccountDump]| {
            v.iter()
                .map(|s| sec::ServiceAccountMatch {
                    namespace: s.namespace.clone(),
                    service_account: s.service_account.clone(),
                })
                .collect()
        };
        sec::Match {
            namespaces: strings(&self.namespaces),
            not_namespaces: strings(&self.not_namespaces),
            principals: strings(&self.principals),
            not_principals: strings(&self.not_principals),
            source_ips: ips(&self.source_ips),
            not_source_ips: ips(&self.not_source_ips),
            destination_ips: ips(&self.destination_ips),
            not_destination_ips: ips(&self.not_destination_ips),
            destination_ports: ports(&self.destination_ports),
            not_destination_ports: ports(&self.not_destination_ports),
            service_accounts: sas(&self.service_accounts),
            not_service_accounts: sas(&self.not_service_accounts),
            extensions: Vec::new(),
        }
    }
}

impl StringMatchDump {
    fn to_proto(&self) -> sec::StringMatch {
        use sec::string_match::MatchType;
        let t = match self {
            StringMatchDump::Exact(s) => MatchType::Exact(s.clone()),
            StringMatchDump::Prefix(s) => MatchType::Prefix(s.clone()),
            StringMatchDump::Suffix(s) => MatchType::Suffix(s.clone()),
            StringMatchDump::Presence => MatchType::Presence(()),
        };
        sec::StringMatch {
            match_type: Some(t),
        }
    }
}
