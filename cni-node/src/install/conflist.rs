//! Choosing the primary CNI configuration and chaining `istio-cni` into it (pure JSON work).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::InstallError;

/// The plugin's `type` (and binary name).
pub const PLUGIN_TYPE: &str = "istio-cni";
/// The network name given to a `.conf` turned into a conflist.
pub const CHAINED_NAME: &str = "k8s-pod-network";
const CHAINED_VERSION: &str = "0.3.1";

/// Whether `v`, read from a file with extension `ext`, is a usable CNI configuration.
fn valid(v: &Value, ext: &str) -> bool {
    match ext {
        "conf" => v
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty()),
        "conflist" => v
            .get("plugins")
            .and_then(Value::as_array)
            .is_some_and(|p| !p.is_empty()),
        _ => false,
    }
}

/// The primary configuration in `dir`: `name` if given (and valid), else the first valid
/// `*.conf` / `*.conflist` in lexical order. `None` when there is none yet.
pub fn choose_primary(dir: &Path, name: Option<&str>) -> Result<Option<PathBuf>, InstallError> {
    let read = |p: &Path| -> Option<Value> { serde_json::from_slice(&std::fs::read(p).ok()?).ok() };
    if let Some(name) = name {
        let path = dir.join(name);
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default()
            .to_string();
        return match read(&path) {
            Some(v) if valid(&v, &ext) => Ok(Some(path)),
            Some(_) => Err(InstallError::Invalid {
                path,
                problem:
                    "not a valid CNI configuration (a .conf needs a type, a .conflist plugins)"
                        .into(),
            }),
            None => Ok(None),
        };
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(InstallError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    Ok(files.into_iter().find(|p| {
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
        (ext == "conf" || ext == "conflist") && read(p).is_some_and(|v| valid(&v, ext))
    }))
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// The entry as it is written: `type: istio-cni` unless it names one.
pub(crate) fn typed_entry(entry: &Value) -> Value {
    let mut entry = entry.clone();
    if entry.get("type").is_none() {
        entry["type"] = json!(PLUGIN_TYPE);
    }
    entry
}

/// `current` with `entry` chained last (a `.conf` is wrapped into a conflist first; an earlier
/// `istio-cni` entry is replaced).
pub fn chain(current: &Value, is_conf: bool, entry: &Value) -> Value {
    let mut list = if is_conf {
        json!({"name": CHAINED_NAME, "cniVersion": CHAINED_VERSION, "plugins": [current]})
    } else {
        current.clone()
    };
    let entry = typed_entry(entry);
    if let Some(plugins) = list.get_mut("plugins").and_then(Value::as_array_mut) {
        plugins.retain(|p| !is_ours(p));
        plugins.push(entry);
    }
    list
}

/// `current` without its `istio-cni` entries; `None` when it has none. (A conflist made from a
/// `.conf` stays a conflist, as Istio's cleanup leaves it.)
pub fn unchain(current: &Value) -> Option<Value> {
    let plugins = current.get("plugins")?.as_array()?;
    if !plugins.iter().any(is_ours) {
        return None;
    }
    let mut list = current.clone();
    list["plugins"] = Value::Array(plugins.iter().filter(|p| !is_ours(p)).cloned().collect());
    Some(list)
}
