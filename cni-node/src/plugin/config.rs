//! The network configuration on stdin: the CNI fields, `prevResult`, and istio-cni's own
//! fields as upstream's conflist writes them (`plugin_log_level`, `cni_agent_run_dir`,
//! `ambient_enabled`, `exclude_namespaces`, `pod_namespace`). Fields are read one by one so
//! every error names its field.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::PluginError;
use crate::event::PLUGIN_EVENT_SOCKET;

/// The spec versions this plugin speaks (it only passes `prevResult` through, so every
/// version with a chained `prevResult` works).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// The newest supported version, used when the input names none.
pub const CURRENT_VERSION: &str = "1.1.0";
/// Upstream's default agent run directory.
pub const DEFAULT_AGENT_RUN_DIR: &str = "/var/run/istio-cni";
/// Namespaces never enrolled when the config lists none.
pub const DEFAULT_EXCLUDE_NAMESPACES: &[&str] = &["kube-system"];

/// The parsed network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    /// The previous plugin's result, kept as-is to pass it through.
    pub prev_result: Option<Map<String, Value>>,
    pub plugin_log_level: Option<String>,
    pub cni_agent_run_dir: PathBuf,
    /// Upstream's default is false (sidecar mode), which this plugin does not implement.
    pub ambient_enabled: bool,
    pub exclude_namespaces: Vec<String>,
    /// Where the istio-cni agent itself runs (its pods are never held up).
    pub pod_namespace: Option<String>,
}

impl NetConf {
    /// `<cni_agent_run_dir>/pluginevent.sock`.
    pub fn agent_socket(&self) -> PathBuf {
        let file = std::path::Path::new(PLUGIN_EVENT_SOCKET)
            .file_name()
            .unwrap_or_default();
        self.cni_agent_run_dir.join(file)
    }

    /// The pod IPs of `prevResult.ips[].address`, checked to be `address/prefix`.
    pub fn prev_result_ips(&self) -> Result<Vec<String>, PluginError> {
        let Some(prev) = &self.prev_result else {
            return Err(PluginError::MissingPrevResult);
        };
        let ips = match prev.get("ips") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(ips)) => ips,
            Some(other) => {
                return Err(invalid(
                    "prevResult.ips",
                    format!("expected an array, got {other}"),
                ))
            }
        };
        ips.iter()
            .enumerate()
            .map(|(index, ip)| {
                let field = format!("prevResult.ips[{index}].address");
                let address = ip
                    .get("address")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(&field, "expected a string \"address/prefix\""))?;
                crate::event::parse_cidr(address)
                    .map_err(|why| invalid(&field, why.to_string()))?;
                Ok(address.to_owned())
            })
            .collect()
    }
}

/// Decodes stdin: not JSON is code 6, a field of the wrong type code 7, an unsupported
/// `cniVersion` code 1.
pub fn parse(stdin: &[u8]) -> Result<NetConf, PluginError> {
    let value: Value = serde_json::from_slice(stdin).map_err(PluginError::Decode)?;
    let Value::Object(map) = value else {
        return Err(invalid("(config)", "expected a JSON object"));
    };
    let cni_version = string(&map, "cniVersion")?.unwrap_or_default();
    check_version(&cni_version)?;
    let prev_result = match map.get("prevResult") {
        None | Some(Value::Null) => None,
        Some(Value::Object(prev)) => Some(prev.clone()),
        Some(other) => {
            return Err(invalid(
                "prevResult",
                format!("expected an object, got {other}"),
            ))
        }
    };
    let exclude_namespaces = match map.get("exclude_namespaces") {
        None | Some(Value::Null) => DEFAULT_EXCLUDE_NAMESPACES
            .iter()
            .map(|ns| (*ns).to_owned())
            .collect(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                item.as_str().map(str::to_owned).ok_or_else(|| {
                    invalid(format!("exclude_namespaces[{index}]"), "expected a string")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(invalid(
                "exclude_namespaces",
                format!("expected an array of strings, got {other}"),
            ))
        }
    };
    Ok(NetConf {
        cni_version,
        name: string(&map, "name")?.unwrap_or_default(),
        plugin_type: string(&map, "type")?.unwrap_or_default(),
        prev_result,
        plugin_log_level: string(&map, "plugin_log_level")?,
        cni_agent_run_dir: string(&map, "cni_agent_run_dir")?
            .filter(|dir| !dir.is_empty())
            .unwrap_or_else(|| DEFAULT_AGENT_RUN_DIR.to_owned())
            .into(),
        ambient_enabled: boolean(&map, "ambient_enabled")?.unwrap_or(false),
        exclude_namespaces,
        pod_namespace: string(&map, "pod_namespace")?.filter(|ns| !ns.is_empty()),
    })
}

/// The `cniVersion` of stdin if it is readable and supported (for VERSION's answer).
pub fn requested_version(stdin: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(stdin).ok()?;
    let version = value.get("cniVersion")?.as_str()?;
    SUPPORTED_VERSIONS
        .contains(&version)
        .then(|| version.to_owned())
}

/// Code 1 unless `version` is one of [`SUPPORTED_VERSIONS`].
pub fn check_version(version: &str) -> Result<(), PluginError> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(PluginError::IncompatibleVersion(version.to_owned()))
    }
}

/// Whether `version` is at least `minimum` (both supported, dotted numbers).
pub fn at_least(version: &str, minimum: &str) -> bool {
    let parse = |text: &str| -> Vec<u32> {
        text.split('.')
            .map(|part| part.parse().unwrap_or(0))
            .collect()
    };
    parse(version) >= parse(minimum)
}

fn string(map: &Map<String, Value>, field: &str) -> Result<Option<String>, PluginError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(invalid(field, format!("expected a string, got {other}"))),
    }
}

fn boolean(map: &Map<String, Value>, field: &str) -> Result<Option<bool>, PluginError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(value)) => Ok(Some(*value)),
        Some(other) => Err(invalid(
            field,
            format!("expected true or false, got {other}"),
        )),
    }
}

fn invalid(field: impl Into<String>, why: impl Into<String>) -> PluginError {
    PluginError::InvalidConfig {
        field: field.into(),
        why: why.into(),
    }
}
