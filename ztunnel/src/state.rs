//! The proxy's view of the mesh: workloads, services and L4 policies, as received over xDS
//! (`istio.workload.Address`, `istio.security.Authorization`) or loaded from `LOCAL_XDS_PATH`.
//!
//! Indexes: workloads by uid and by `network/IP`; services by `namespace/hostname` and by
//! `network/VIP`; workloads by the service keys of their `services` map; policies in a
//! [`PolicySet`]. Every apply function validates the whole resource before touching the state,
//! so a rejected resource (to be NACKed) leaves the previous good state in place.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use mesh_proto::security::Authorization;
use mesh_proto::workload::{address, Address};
use prost::Message;

use crate::rbac::{Policy, PolicySet, RbacError};

mod address_dump;
mod dump;
mod local;
mod shared;
mod types;

pub use address_dump::{EndpointDump, GatewayDump, ServiceDump, WorkloadDump};
pub use dump::{PolicyDump, StateDump};
pub use shared::SharedState;
pub use types::{
    ApplicationTunnel, GatewayAddress, GatewayDestination, LoadBalancing, Locality, NetworkAddress,
    Port, Service, WeightedWaypoint, Workload,
};

#[cfg(test)]
mod tests;

/// What is wrong with one field of a resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// An IP address that is neither 4 nor 16 bytes long.
    #[error("has {0} bytes, but an IP address has 4 (IPv4) or 16 (IPv6); is the sender encoding IPs as text?")]
    IpLength(usize),
    /// A required field is empty.
    #[error("is empty but required; is the sender an older or broken control plane?")]
    Empty,
    /// An enum value this ztunnel does not know.
    #[error("has unknown enum value {0}; is istiod newer than this ztunnel? Upgrade ztunnel")]
    UnknownEnum(i32),
    /// A port above 65535.
    #[error("is {0}, above the largest port 65535")]
    PortRange(u32),
    /// A CIDR prefix longer than the address.
    #[error("is {0}, longer than the address allows (32 for IPv4, 128 for IPv6)")]
    PrefixLength(u32),
    /// A map key that is not `namespace/hostname`.
    #[error("has key {0:?}, expected \"namespace/hostname\"")]
    BadServiceKey(String),
    /// A local-config address that is not `network/IP` or `IP`.
    #[error("{0:?} is not \"network/IP\" or an IP address")]
    BadNetworkAddress(String),
    /// A local-config value that is not one of the allowed names.
    #[error("{value:?} is not one of {allowed}")]
    UnknownName {
        /// The value found.
        value: String,
        /// The accepted names.
        allowed: &'static str,
    },
}

impl Problem {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::IpLength(_) => "ip_length",
            Problem::Empty => "empty_field",
            Problem::UnknownEnum(_) => "unknown_enum",
            Problem::PortRange(_) => "port_range",
            Problem::PrefixLength(_) => "prefix_length",
            Problem::BadServiceKey(_) => "bad_service_key",
            Problem::BadNetworkAddress(_) => "bad_network_address",
            Problem::UnknownName { .. } => "unknown_name",
        }
    }
}

/// A resource (or local config file) that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The bytes are not the expected protobuf message.
    #[error("xDS resource {name} is not a valid {message}: {source}; is the type URL right?")]
    Decode {
        /// Resource name.
        name: String,
        /// Expected message, e.g. `istio.workload.Address`.
        message: &'static str,
        /// Decoder error.
        source: prost::DecodeError,
    },
    /// One field of a resource is invalid.
    #[error("resource {resource}: field {field} {problem}")]
    Invalid {
        /// Resource name (or local-config entry).
        resource: String,
        /// Field path, e.g. `addresses[1]`.
        field: String,
        /// What is wrong.
        problem: Problem,
    },
    /// An authorization policy that cannot be compiled.
    #[error("xDS resource {name}: {source}")]
    Policy {
        /// Resource name.
        name: String,
        /// Conversion error.
        source: RbacError,
    },
    /// The local config file cannot be read.
    #[error(
        "cannot read LOCAL_XDS_PATH file {path}: {source}; does the file exist and is it readable?"
    )]
    LocalRead {
        /// File path.
        path: PathBuf,
        /// I/O error.
        source: std::io::Error,
    },
    /// The local config file is not valid YAML of the expected shape.
    #[error("LOCAL_XDS_PATH file {path} is not valid local xDS YAML: {source}")]
    LocalParse {
        /// File path.
        path: PathBuf,
        /// Parser error, with the field path and line.
        source: serde_yaml::Error,
    },
    /// One entry of the local config file is invalid.
    #[error("LOCAL_XDS_PATH file {path}: {source}")]
    LocalInvalid {
        /// File path.
        path: PathBuf,
        /// What is wrong with the entry.
        source: Box<StateError>,
    },
}

impl StateError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StateError::Decode { .. } => "decode",
            StateError::Invalid { problem, .. } => problem.reason(),
            StateError::Policy { source, .. } => source.reason(),
            StateError::LocalRead { .. } => "local_read",
            StateError::LocalParse { .. } => "local_parse",
            StateError::LocalInvalid { source, .. } => source.reason(),
        }
    }
}

/// A `network/IP` index key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkIp {
    /// Network name ("" = default network).
    pub network: String,
    /// The address.
    pub ip: IpAddr,
}

/// The mesh as this ztunnel sees it.
#[derive(Clone, Debug, Default)]
pub struct State {
    workloads: BTreeMap<String, Workload>,
    workloads_by_ip: HashMap<NetworkIp, String>,
    /// Service key to the uids of workloads naming it in `services`.
    endpoints: HashMap<String, BTreeSet<String>>,
    services: BTreeMap<String, Service>,
    services_by_vip: HashMap<NetworkIp, String>,
    policies: PolicySet,
    /// What `LOCAL_XDS_PATH` loaded, for `/config_dump`'s `staticConfig`.
    local: Arc<local::LocalConfig>,
}

impl State {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one `istio.workload.Address` resource; `None` removes it. On error nothing
    /// changes.
    pub fn apply_address(&mut self, name: &str, bytes: Option<&[u8]>) -> Result<(), StateError> {
        let Some(bytes) = bytes else {
            self.remove_address(name);
            return Ok(());
        };
        let addr = Address::decode(bytes).map_err(|source| StateError::Decode {
            name: name.to_string(),
            message: "istio.workload.Address",
            source,
        })?;
        self.apply_address_message(name, &addr)
    }

    /// Applies a decoded `Address`.
    pub fn apply_address_message(&mut self, name: &str, addr: &Address) -> Result<(), StateError> {
        let ctx = types::Ctx { resource: name };
        match &addr.r#type {
            Some(address::Type::Workload(w)) => {
                let w = types::workload(&ctx, w)?;
                self.insert_workload(name, w);
            }
            Some(address::Type::Service(s)) => {
                let s = types::service(&ctx, s)?;
                self.insert_service(name, s);
            }
            None => return Err(ctx.err("type", Problem::Empty)),
        }
        Ok(())
    }

    /// Applies one `istio.security.Authorization` resource; `None` removes it. On error nothing
    /// changes.
    pub fn apply_authorization(
        &mut self,
        name: &str,
        bytes: Option<&[u8]>,
    ) -> Result<(), StateError> {
        let Some(bytes) = bytes else {
            self.policies.remove(name);
            return Ok(());
        };
        let authz = Authorization::decode(bytes).map_err(|source| StateError::Decode {
            name: name.to_string(),
            message: "istio.security.Authorization",
            source,
        })?;
        self.apply_authorization_message(name, &authz)
    }

    /// Applies a decoded `Authorization`.
    pub fn apply_authorization_message(
        &mut self,
        name: &str,
        authz: &Authorization,
    ) -> Result<(), StateError> {
        let policy = Policy::try_from(authz).map_err(|source| StateError::Policy {
            name: name.to_string(),
            source,
        })?;
        if policy.key() != name {
            // istiod names policies `namespace/name`; drop whatever held this name before.
            self.policies.remove(name);
        }
        self.policies.insert(policy);
        Ok(())
    }

    fn insert_workload(&mut self, name: &str, w: Workload) {
        if name != w.uid {
            self.remove_address(name);
        }
        self.remove_workload(&w.uid);
        for ip in &w.workload_ips {
            self.workloads_by_ip.insert(
                NetworkIp {
                    network: w.network.clone(),
                    ip: *ip,
                },
                w.uid.clone(),
            );
        }
        for svc in w.services.keys() {
            self.endpoints
                .entry(svc.clone())
                .or_default()
                .insert(w.uid.clone());
        }
        self.workloads.insert(w.uid.clone(), w);
    }

    fn insert_service(&mut self, name: &str, s: Service) {
        let key = s.key();
        if name != key {
            self.remove_address(name);
        }
        self.remove_service(&key);
        for vip in &s.vips {
            self.services_by_vip.insert(
                NetworkIp {
                    network: vip.network.clone(),
                    ip: vip.address,
                },
                key.clone(),
            );
        }
        self.services.insert(key, s);
    }

    /// Removes the resource `name`: istiod names workloads by uid and services by
    /// `namespace/hostname`, so the name is the index key.
    fn remove_address(&mut self, name: &str) {
        self.remove_workload(name);
        self.remove_service(name);
    }

    fn remove_workload(&mut self, uid: &str) {
        let Some(old) = self.workloads.remove(uid) else {
            return;
        };
        for ip in &old.workload_ips {
            let key = NetworkIp {
                network: old.network.clone(),
                ip: *ip,
            };
            if self.workloads_by_ip.get(&key).is_some_and(|u| u == uid) {
                self.workloads_by_ip.remove(&key);
            }
        }
        for svc in old.services.keys() {
            if let Some(set) = self.endpoints.get_mut(svc) {
                set.remove(uid);
                if set.is_empty() {
                    self.endpoints.remove(svc);
                }
            }
        }
    }

    fn remove_service(&mut self, key: &str) {
        let Some(old) = self.services.remove(key) else {
            return;
        };
        for vip in &old.vips {
            let k = NetworkIp {
                network: vip.network.clone(),
                ip: vip.address,
            };
            if self.services_by_vip.get(&k).is_some_and(|s| s == key) {
                self.services_by_vip.remove(&k);
            }
        }
    }

    /// The workload with this uid.
    pub fn workload(&self, uid: &str) -> Option<&Workload> {
        self.workloads.get(uid)
    }

    /// The workload owning `ip` on `network`.
    pub fn workload_by_ip(&self, network: &str, ip: IpAddr) -> Option<&Workload> {
        let key = NetworkIp {
            network: network.to_string(),
            ip,
        };
        self.workloads_by_ip
            .get(&key)
            .and_then(|uid| self.workloads.get(uid))
    }

    /// The service with this `namespace/hostname` key.
    pub fn service(&self, key: &str) -> Option<&Service> {
        self.services.get(key)
    }

    /// The service with VIP `ip` on `network`.
    pub fn service_by_vip(&self, network: &str, ip: IpAddr) -> Option<&Service> {
        let key = NetworkIp {
            network: network.to_string(),
            ip,
        };
        self.services_by_vip
            .get(&key)
            .and_then(|k| self.services.get(k))
    }

    /// The workloads whose `services` map names the service key `namespace/hostname`, in uid
    /// order.
    pub fn workloads_of_service(&self, key: &str) -> Vec<&Workload> {
        self.endpoints
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.workloads.get(uid))
            .collect()
    }

    /// The policies that apply to a workload (namespace, global, selected).
    pub fn policies_for(&self, workload: &Workload) -> Vec<&Policy> {
        self.policies
            .applicable(&workload.namespace, &workload.authorization_policies)
    }

    /// All policies.
    pub fn policies(&self) -> &PolicySet {
        &self.policies
    }

    /// All workloads, in uid order.
    pub fn workloads(&self) -> impl Iterator<Item = &Workload> {
        self.workloads.values()
    }

    /// All services, in key order.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    /// Every service key some workload names, whether or not the service is known.
    pub fn endpoint_keys(&self) -> impl Iterator<Item = &str> {
        self.endpoints.keys().map(String::as_str)
    }

    /// The local configuration loaded (empty without `LOCAL_XDS_PATH`).
    pub fn local_config(&self) -> Arc<local::LocalConfig> {
        Arc::clone(&self.local)
    }

    /// A serializable snapshot for `/config_dump`.
    pub fn dump(&self) -> StateDump<'_> {
        dump::dump(self)
    }
}
