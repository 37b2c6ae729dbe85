//! `LOCAL_XDS_PATH`: upstream ztunnel's static YAML (`workloads`, `policies`, `services`),
//! converted to the xDS messages and applied through the same validation as xDS.
//!
//! ```yaml
//! workloads:
//! - uid: cluster1//Pod/default/local
//!   name: local
//!   namespace: default
//!   serviceAccount: default
//!   workloadIps: ["127.0.0.1"]
//!   protocol: HBONE            # or TCP
//!   node: local
//!   services: {"default/echo.default.svc.cluster.local": {80: 8080}}
//! services:
//! - name: echo
//!   namespace: default
//!   hostname: echo.default.svc.cluster.local
//!   vips: ["/10.96.0.10"]      # "network/IP"
//!   ports: {80: 8080}
//! policies:
//! - {name: deny, namespace: default, scope: Namespace, action: Deny,
//!    rules: [[[{notNamespaces: [{Exact: default}]}]]]}
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use mesh_proto::workload as pb;
use serde::{Deserialize, Serialize};

use super::dump::PolicyDump;
use super::types::Ctx;
use super::{Problem, State, StateError};

/// The whole file; also `/config_dump`'s `staticConfig`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LocalConfig {
    workloads: Vec<LocalWorkload>,
    policies: Vec<PolicyDump>,
    services: Vec<LocalService>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
enum LocalProtocol {
    #[serde(rename = "HBONE")]
    Hbone,
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct LocalWorkload {
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    name: String,
    namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    service_account: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    trust_domain: String,
    workload_ips: Vec<IpAddr>,
    protocol: LocalProtocol,
    #[serde(skip_serializing_if = "String::is_empty")]
    node: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    network: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    hostname: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    canonical_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    canonical_revision: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    workload_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    cluster_id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    authorization_policies: Vec<String>,
    /// `"namespace/hostname": {servicePort: targetPort}`.
    services: BTreeMap<String, BTreeMap<u16, u16>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct LocalService {
    name: String,
    namespace: String,
    hostname: String,
    /// `"network/IP"` (or a bare IP on the default network).
    vips: Vec<String>,
    /// `servicePort: targetPort`.
    ports: BTreeMap<u16, u16>,
    subject_alt_names: Vec<String>,
    canonical: bool,
}

fn ports(map: &BTreeMap<u16, u16>) -> Vec<pb::Port> {
    map.iter()
        .map(|(s, t)| pb::Port {
            service_port: u32::from(*s),
            target_port: u32::from(*t),
            app_protocol: pb::AppProtocol::Unknown as i32,
        })
        .collect()
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

impl LocalWorkload {
    fn to_proto(&self) -> pb::Workload {
        pb::Workload {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            addresses: self.workload_ips.iter().map(|ip| ip_bytes(*ip)).collect(),
            hostname: self.hostname.clone(),
            network: self.network.clone(),
            tunnel_protocol: match self.protocol {
                LocalProtocol::Hbone => pb::TunnelProtocol::Hbone,
                LocalProtocol::Tcp => pb::TunnelProtocol::None,
            } as i32,
            trust_domain: self.trust_domain.clone(),
            service_account: self.service_account.clone(),
            node: self.node.clone(),
            canonical_name: self.canonical_name.clone(),
            canonical_revision: self.canonical_revision.clone(),
            workload_name: self.workload_name.clone(),
            services: self
                .services
                .iter()
                .map(|(k, m)| (k.clone(), pb::PortList { ports: ports(m) }))
                .collect(),
            authorization_policies: self.authorization_policies.clone(),
            cluster_id: self.cluster_id.clone(),
            ..Default::default()
        }
    }
}

impl LocalService {
    fn to_proto(&self, ctx: &Ctx<'_>) -> Result<pb::Service, StateError> {
        let addresses = self
            .vips
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let (network, ip) = v.split_once('/').unwrap_or(("", v));
                let ip: IpAddr = ip.parse().map_err(|_| {
                    ctx.err(format!("vips[{i}]"), Problem::BadNetworkAddress(v.clone()))
                })?;
                Ok(pb::NetworkAddress {
                    network: network.to_string(),
                    address: ip_bytes(ip),
                    length: None,
                })
            })
            .collect::<Result<_, StateError>>()?;
        Ok(pb::Service {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            hostname: self.hostname.clone(),
            addresses,
            ports: ports(&self.ports),
            subject_alt_names: self.subject_alt_names.clone(),
            canonical: self.canonical,
            ..Default::default()
        })
    }
}

impl State {
    /// Loads a `LOCAL_XDS_PATH` file into this state (all or nothing).
    pub fn load_local_file(&mut self, path: &Path) -> Result<(), StateError> {
        let text = std::fs::read_to_string(path).map_err(|source| StateError::LocalRead {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_local_yaml(path, &text)
    }

    /// Loads local xDS YAML (`path` only names the source in errors). Every entry is validated
    /// before the state changes.
    pub fn load_local_yaml(&mut self, path: &Path, yaml: &str) -> Result<(), StateError> {
        let config: LocalConfig =
            serde_yaml::from_str(yaml).map_err(|source| StateError::LocalParse {
                path: path.to_path_buf(),
                source,
            })?;
        let mut next = self.clone();
        next.apply_local(&config)
            .map_err(|source| StateError::LocalInvalid {
                path: path.to_path_buf(),
                source: Box::new(source),
            })?;
        next.local = std::sync::Arc::new(config);
        *self = next;
        Ok(())
    }

    fn apply_local(&mut self, config: &LocalConfig) -> Result<(), StateError> {
        for (i, w) in config.workloads.iter().enumerate() {
            let name = format!("workloads[{i}] ({}/{})", w.namespace, w.name);
            let addr = pb::Address {
                r#type: Some(pb::address::Type::Workload(w.to_proto())),
            };
            self.apply_address_message(&name, &addr)?;
        }
        for (i, s) in config.services.iter().enumerate() {
            let name = format!("services[{i}] ({}/{})", s.namespace, s.hostname);
            let svc = s.to_proto(&Ctx { resource: &name })?;
            let addr = pb::Address {
                r#type: Some(pb::address::Type::Service(svc)),
            };
            self.apply_address_message(&name, &addr)?;
        }
        for (i, p) in config.policies.iter().enumerate() {
            let name = format!("policies[{i}] ({}/{})", p.namespace, p.name);
            self.apply_authorization_message(&name, &p.to_proto())?;
        }
        Ok(())
    }
}
