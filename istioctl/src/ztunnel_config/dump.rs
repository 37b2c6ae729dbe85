//! ztunnel's `/config_dump` JSON as istioctl reads it: our ztunnel's shape (waypoints as
//! `{destination: {hostname: {namespace, hostname}}}`, VIPs as `{network, address}`, hex
//! serial numbers) and upstream ztunnel's (waypoint destinations and VIPs as `network/ip`
//! strings, decimal serials, `endpoints` on services, sections as lists or maps). Every field
//! is optional: a dump from a newer or older ztunnel still renders.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// Why a dump cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(
        "the config dump is not JSON: {0}; is the address a ztunnel admin endpoint (port 15000)?"
    )]
    NotJson(#[source] serde_json::Error),
    #[error("the config dump is not a JSON object; is the address a ztunnel admin endpoint (port 15000)?")]
    NotAnObject,
    #[error("config dump section {section}[{index}] has an unexpected shape: {source}")]
    Entry {
        section: &'static str,
        index: usize,
        source: serde_json::Error,
    },
}

impl DumpError {
    /// Short label for the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            DumpError::NotJson(_) => "not_json",
            DumpError::NotAnObject => "not_an_object",
            DumpError::Entry { .. } => "entry",
        }
    }
}

/// The parsed dump: typed views for tables, the raw values for `-o json|yaml`.
#[derive(Debug, Clone, Default)]
pub struct ConfigDump {
    pub raw: Value,
    pub workloads: Vec<Entry<Workload>>,
    pub services: Vec<Entry<Service>>,
    pub policies: Vec<Entry<Policy>>,
    pub certificates: Vec<Entry<Certificate>>,
}

/// One element of a section: typed and as dumped.
#[derive(Debug, Clone)]
pub struct Entry<T> {
    pub view: T,
    pub raw: Value,
}

/// The workload fields the tables use.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Workload {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    pub workload_ips: Vec<String>,
    pub node: String,
    pub protocol: String,
    pub status: String,
    pub waypoint: Option<Gateway>,
    /// The services selecting this workload: a list of `namespace/hostname` (upstream ztunnel
    /// and ours now) or a map keyed by them (our ztunnel before it took upstream's shapes).
    pub services: Value,
}

impl Workload {
    /// Whether the service `namespace/hostname` selects this workload.
    pub fn in_service(&self, key: &str) -> bool {
        match &self.services {
            Value::Array(keys) => keys.iter().any(|k| k.as_str() == Some(key)),
            Value::Object(map) => map.contains_key(key),
            _ => false,
        }
    }
}

/// A waypoint reference.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Gateway {
    /// `{hostname: {namespace, hostname}}`, `{address: {network, address}}` or a
    /// `namespace/hostname` / `network/ip` string.
    pub destination: Value,
}

/// The service fields the tables use.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    /// `{network, address}` objects or `network/ip` strings.
    pub vips: Vec<Value>,
    pub waypoint: Option<Gateway>,
    /// Upstream ztunnel only: endpoints by key, each naming its workload.
    pub endpoints: Option<BTreeMap<String, Endpoint>>,
}

/// An upstream ztunnel service endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Endpoint {
    pub workload_uid: String,
}

/// The policy fields the tables use.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub action: String,
    pub scope: String,
}

/// One identity's certificate state.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Certificate {
    pub identity: String,
    pub state: String,
    /// Leaf first; ends with the root when `root_certs` is absent.
    pub cert_chain: Vec<CertInfo>,
    pub root_certs: Vec<CertInfo>,
}

/// One certificate of a chain.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CertInfo {
    pub serial_number: String,
    pub valid_from: String,
    pub expiration_time: String,
}

impl ConfigDump {
    /// Parses the body of `GET /config_dump`.
    pub fn parse(bytes: &[u8]) -> Result<ConfigDump, DumpError> {
        let raw: Value = serde_json::from_slice(bytes).map_err(DumpError::NotJson)?;
        if !raw.is_object() {
            return Err(DumpError::NotAnObject);
        }
        Ok(ConfigDump {
            workloads: section(&raw, "workloads")?,
            services: section(&raw, "services")?,
            policies: section(&raw, "policies")?,
            certificates: section(&raw, "certificates")?,
            raw,
        })
    }

    /// The name of the service a waypoint reference points at: found by `namespace/hostname`
    /// or by VIP; `None` when no waypoint is set, `NA` when it names no known service.
    pub fn waypoint_name(&self, waypoint: Option<&Gateway>) -> String {
        let Some(waypoint) = waypoint else {
            return "None".to_string();
        };
        let target = destination_key(&waypoint.destination);
        let found = self
            .services
            .iter()
            .map(|s| &s.view)
            .find(|s| match &target {
                Some(Destination::Hostname(key)) => {
                    *key == format!("{}/{}", s.namespace, s.hostname)
                }
                Some(Destination::Address(ip)) => s.vips.iter().any(|v| vip_ip(v) == *ip),
                None => false,
            });
        found.map_or_else(|| "NA".to_string(), |s| s.name.clone())
    }
}

/// Reads a section given as a list or as a map of entries.
fn section<T: for<'de> Deserialize<'de>>(
    raw: &Value,
    name: &'static str,
) -> Result<Vec<Entry<T>>, DumpError> {
    let values: Vec<Value> = match raw.get(name) {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::Object(map)) => map.values().cloned().collect(),
        _ => Vec::new(),
    };
    values
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            let view = T::deserialize(&raw).map_err(|source| DumpError::Entry {
                section: name,
                index,
                source,
            })?;
            Ok(Entry { view, raw })
        })
        .collect()
}

enum Destination {
    /// `namespace/hostname`.
    Hostname(String),
    /// An IP address.
    Address(String),
}

fn destination_key(d: &Value) -> Option<Destination> {
    if let Some(s) = d.as_str() {
        // Upstream: `namespace/hostname` or `network/ip`; an IP parses, a hostname does not.
        let (_, last) = s.split_once('/').unwrap_or(("", s));
        return Some(if last.parse::<std::net::IpAddr>().is_ok() {
            Destination::Address(last.to_string())
        } else {
            Destination::Hostname(s.to_string())
        });
    }
    if let Some(h) = d.get("hostname") {
        let ns = h.get("namespace").and_then(Value::as_str).unwrap_or("");
        let host = h.get("hostname").and_then(Value::as_str).unwrap_or("");
        return Some(Destination::Hostname(format!("{ns}/{host}")));
    }
    d.get("address").map(|a| Destination::Address(vip_ip(a)))
}

/// The IP of a VIP given as `{network, address}` or `network/ip`.
pub fn vip_ip(v: &Value) -> String {
    match v {
        Value::String(s) => s
            .split_once('/')
            .map_or(s.as_str(), |(_, ip)| ip)
            .to_string(),
        other => other
            .get("address")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    }
}
