//! `ISTIO_KUBE_APP_PROBERS`: the app's kubelet probes the injector moved to the agent, as JSON
//! `{"/app-health/<container>/readyz": {"httpGet": {...}, "timeoutSeconds": 1}, ...}`. Keys of
//! the probers are matched without regard to case, unknown keys are ignored, and every
//! problem is fatal at start (the agent refuses to run with probes it cannot serve).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

/// What the agent does for one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// GET `path` on the app's `port`, over TLS (unverified) when `https`.
    Http {
        path: String,
        port: u16,
        https: bool,
    },
    /// Connect to the app's `port`.
    Tcp { port: u16 },
    /// `grpc.health.v1.Health/Check` for `service` on the app's `port`.
    Grpc { port: u16, service: String },
}

/// One rewritten probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prober {
    pub action: Action,
    /// `timeoutSeconds`; `None` (0 or missing) means no limit.
    pub timeout: Option<Duration>,
}

/// Every rewritten probe, by the path the kubelet calls.
pub type Probers = BTreeMap<String, Prober>;

/// Why `ISTIO_KUBE_APP_PROBERS` cannot be served; the message names the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProberError {
    #[error("ISTIO_KUBE_APP_PROBERS is not a JSON object of probers: {0}")]
    Json(String),
    #[error("ISTIO_KUBE_APP_PROBERS: invalid path {0:?}, must be /app-health/<container>/livez|readyz|startupz")]
    Path(String),
    #[error("ISTIO_KUBE_APP_PROBERS: invalid prober type for {0}, must be one of httpGet, tcpSocket or gRPC")]
    Kind(String),
    #[error("ISTIO_KUBE_APP_PROBERS: invalid prober config for {0}, the port must be int type")]
    Port(String),
    #[error("ISTIO_KUBE_APP_PROBERS: invalid prober config for {path}: {why}")]
    Field { path: String, why: String },
}

fn valid_path(path: &str) -> bool {
    let mut parts = path.split('/');
    parts.next() == Some("")
        && parts.next() == Some("app-health")
        && parts.next().is_some_and(|c| !c.is_empty())
        && matches!(parts.next(), Some("livez" | "readyz" | "startupz"))
        && parts.next().is_none()
}

/// The value of `key` in `object`, matching the key without regard to case.
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
        .filter(|v| !v.is_null())
}

fn port(path: &str, action: &Map<String, Value>) -> Result<u16, ProberError> {
    match field(action, "port") {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| ProberError::Field {
                path: path.to_string(),
                why: format!("port {n} is not between 1 and 65535"),
            }),
        _ => Err(ProberError::Port(path.to_string())),
    }
}

fn string(path: &str, object: &Map<String, Value>, key: &str) -> Result<String, ProberError> {
    match field(object, key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ProberError::Field {
            path: path.to_string(),
            why: format!("{key} must be a string, not {other}"),
        }),
    }
}

fn prober(path: &str, value: &Value) -> Result<Prober, ProberError> {
    let Value::Object(object) = value else {
        return Err(ProberError::Kind(path.to_string()));
    };
    let kinds = ["httpGet", "tcpSocket", "grpc"].map(|k| field(object, k));
    let action = match kinds {
        [Some(Value::Object(http)), None, None] => {
            let mut target = string(path, http, "path")?;
            if !target.starts_with('/') {
                target.insert(0, '/');
            }
            Action::Http {
                path: target,
                port: port(path, http)?,
                https: string(path, http, "scheme")?.eq_ignore_ascii_case("https"),
            }
        }
        [None, Some(Value::Object(tcp)), None] => Action::Tcp {
            port: port(path, tcp)?,
        },
        [None, None, Some(Value::Object(grpc))] => Action::Grpc {
            port: port(path, grpc)?,
            service: string(path, grpc, "service")?,
        },
        _ => return Err(ProberError::Kind(path.to_string())),
    };
    let timeout = match field(object, "timeoutSeconds") {
        None => None,
        Some(Value::Number(n)) if n.as_u64().is_some() => {
            n.as_u64().filter(|s| *s > 0).map(Duration::from_secs)
        }
        Some(other) => {
            return Err(ProberError::Field {
                path: path.to_string(),
                why: format!("timeoutSeconds must be a whole number, not {other}"),
            })
        }
    };
    Ok(Prober { action, timeout })
}

/// Parses `ISTIO_KUBE_APP_PROBERS` (empty: no probers).
pub fn parse(json: &str) -> Result<Probers, ProberError> {
    if json.trim().is_empty() {
        return Ok(Probers::new());
    }
    let value: Value = serde_json::from_str(json).map_err(|e| ProberError::Json(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(ProberError::Json("not an object".into()));
    };
    map.iter()
        .map(|(path, value)| {
            if !valid_path(path) {
                return Err(ProberError::Path(path.clone()));
            }
            Ok((path.clone(), prober(path, value)?))
        })
        .collect()
}
