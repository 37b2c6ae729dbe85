//! Server-side apply, as far as the tests need the real semantics:
//! - **Ownership.** Each field manager owns the fields of its last applied configuration. A
//!   field the manager applied before and leaves out now is removed from the object, unless
//!   another manager's configuration also sets it.
//! - **Structured merge.** Maps merge key by key. Lists that Kubernetes declares as maps merge
//!   item by item on their key, so two managers can own different items of one list. These are
//!   `conditions` by `type`; `containers`, `initContainers`, `env`, `volumes`, `listeners` and
//!   the like by `name`; `ports` by `port` or `containerPort`; `ownerReferences` by `uid`. Other
//!   lists are atomic: the applier replaces them whole.
//! - **Conflicts.** Without `force`, setting a field to a value that another manager's
//!   configuration holds differently is a 409 naming the manager and the field.
//!
//! Fields written by other kinds of write (PUT, merge or JSON patch) are owned by no apply
//! manager here, so they stay until someone changes them.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::store::ApiStatus;

/// One step into a document: a map key, or the item of a keyed list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    Item { key: String, value: String },
}

type Path = Vec<Step>;

/// The key that items of the list under `field` merge on, when Kubernetes declares that list as a
/// map.
fn list_key(field: &str, items: &[Value]) -> Option<&'static str> {
    let key = match field {
        "conditions" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "volumeMounts"
        | "imagePullSecrets"
        | "listeners"
        | "webhooks" => "name",
        "ownerReferences" => "uid",
        "ports" => {
            if items.iter().all(|i| i.get("containerPort").is_some()) {
                "containerPort"
            } else {
                "port"
            }
        }
        _ => return None,
    };
    items.iter().all(|i| i.get(key).is_some()).then_some(key)
}

fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every leaf of `v` with its value (keyed-list items are walked into; atomic lists are leaves).
fn leaves(v: &Value, prefix: &mut Path, field: &str, out: &mut BTreeMap<Path, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(Step::Key(k.clone()));
                leaves(child, prefix, k, out);
                prefix.pop();
            }
        }
        Value::Array(items) => match list_key(field, items) {
            // An empty keyed list owns no item.
            Some(_) if items.is_empty() => {}
            Some(key) => {
                for item in items {
                    let value = key_text(&item[key]);
                    prefix.push(Step::Item {
                        key: key.to_string(),
                        value,
                    });
                    leaves(item, prefix, "", out);
                    prefix.pop();
                }
            }
            None => {
                out.insert(prefix.clone(), v.clone());
            }
        },
        _ => {
            out.insert(prefix.clone(), v.clone());
        }
    }
}

fn leaves_of(v: &Value) -> BTreeMap<Path, Value> {
    let mut out = BTreeMap::new();
    leaves(v, &mut Vec::new(), "", &mut out);
    out
}

/// Merges `patch` into `target`: maps by key, keyed lists by item, anything else replaced.
fn merge(target: &mut Value, patch: &Value, field: &str) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, pv) in p {
                match t.get_mut(k) {
                    Some(tv) => merge(tv, pv, k),
                    None => {
                        t.insert(k.clone(), pv.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(p)) => match list_key(field, p) {
            Some(key) if t.iter().all(|i| i.get(key).is_some()) => {
                for item in p {
                    match t.iter_mut().find(|i| i.get(key) == item.get(key)) {
                        Some(existing) => merge(existing, item, ""),
                        None => t.push(item.clone()),
                    }
                }
            }
            _ => *t = p.clone(),
        },
        (t, p) => *t = p.clone(),
    }
}

/// Removes the leaf at `path` from `v`, and the maps and keyed items it leaves empty (a keyed
/// item counts as empty when only its key is left).
fn remove(v: &mut Value, path: &[Step]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match (first, v) {
        (Step::Key(k), Value::Object(m)) => {
            if rest.is_empty() {
                m.remove(k);
                return;
            }
            if let Some(child) = m.get_mut(k) {
                remove(child, rest);
                if is_empty(child) {
                    m.remove(k);
                }
            }
        }
        (Step::Item { key, value }, Value::Array(items)) => {
            let Some(pos) = items
                .iter()
                .position(|i| i.get(key).map(key_text).as_deref() == Some(value.as_str()))
            else {
                return;
            };
            remove(&mut items[pos], rest);
            let only_key = items[pos]
                .as_object()
                .is_some_and(|m| m.keys().all(|k| k == key));
            if only_key {
                items.remove(pos);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn describe(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Key(k) => format!(".{k}"),
            Step::Item { key, value } => format!("[{key}=\"{value}\"]"),
        })
        .collect()
}

/// Fields the server sets that an applied configuration never owns.
fn server_owned(path: &[Step]) -> bool {
    matches!(path, [Step::Key(a), ..] if a == "apiVersion" || a == "kind")
        || matches!(path, [Step::Key(m), Step::Key(f), ..]
            if m == "metadata" && matches!(f.as_str(), "name" | "namespace" | "resourceVersion" | "uid" | "generation" | "creationTimestamp" | "managedFields"))
}

/// Applies `config` as `manager` to `current`. `applied` holds each manager's last applied
/// configuration for this object (and subresource), and is updated on success.
pub fn server_side_apply(
    current: &Value,
    applied: &mut BTreeMap<String, Value>,
    manager: &str,
    force: bool,
    config: &Value,
) -> Result<Value, ApiStatus> {
    let mut config = config.clone();
    if let Some(meta) = config.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    let new_leaves: BTreeMap<Path, Value> = leaves_of(&config)
        .into_iter()
        .filter(|(p, _)| !server_owned(p))
        .collect();
    let others: BTreeMap<&String, BTreeMap<Path, Value>> = applied
        .iter()
        .filter(|(m, _)| m.as_str() != manager)
        .map(|(m, c)| (m, leaves_of(c)))
        .collect();
    if !force {
        let conflicts: Vec<String> = new_leaves
            .iter()
            .flat_map(|(p, v)| {
                others.iter().filter_map(move |(m, theirs)| {
                    theirs
                        .get(p)
                        .filter(|tv| *tv != v)
                        .map(|_| format!("conflict with \"{m}\": {}", describe(p)))
                })
            })
            .collect();
        if !conflicts.is_empty() {
            return Err(ApiStatus::new(
                409,
                "Conflict",
                format!(
                    "Apply failed with {} conflict{}: {}",
                    conflicts.len(),
                    if conflicts.len() == 1 { "" } else { "s" },
                    conflicts.join("; ")
                ),
            ));
        }
    }
    let mut next = current.clone();
    if let Some(previous) = applied.get(manager) {
        for path in leaves_of(previous).keys() {
            let still_set = new_leaves.contains_key(path)
                || others.values().any(|theirs| theirs.contains_key(path));
            if !still_set && !server_owned(path) {
                remove(&mut next, path);
            }
        }
    }
    if !next.is_object() {
        next = Value::Object(Map::new());
    }
    merge(&mut next, &config, "");
    applied.insert(manager.to_string(), config);
    // With force, the fields taken over leave the other managers' configurations.
    if force {
        for (m, c) in applied.iter_mut() {
            if m == manager {
                continue;
            }
            for (p, v) in leaves_of(c) {
                if new_leaves.get(&p).is_some_and(|nv| *nv != v) {
                    remove(c, &p);
                }
            }
        }
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cond(t: &str, status: &str) -> Value {
        json!({"type": t, "status": status})
    }

    #[test]
    fn each_manager_owns_its_conditions_and_clears_only_them() {
        let mut applied = BTreeMap::new();
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "status": {"conditions": [cond("Other", "True")]}});
        let a = |conds: Value| {
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "status": {"conditions": conds}})
        };
        let next = server_side_apply(
            &svc,
            &mut applied,
            "istio",
            true,
            &a(json!([cond("istio.io/WaypointBound", "True")])),
        )
        .expect("apply");
        let types = |v: &Value| {
            v["status"]["conditions"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|c| c["type"].as_str().unwrap_or("").to_string())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        assert_eq!(
            types(&next),
            ["Other", "istio.io/WaypointBound"],
            "merged by type"
        );
        let next =
            server_side_apply(&next, &mut applied, "istio", true, &a(json!([]))).expect("apply");
        assert_eq!(types(&next), ["Other"], "only istio's condition removed");
    }

    #[test]
    fn without_force_another_managers_field_is_a_conflict() {
        let mut applied = BTreeMap::new();
        let cm = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": v}});
        let next = server_side_apply(&json!({}), &mut applied, "a", false, &cm("1")).expect("a");
        let err =
            server_side_apply(&next, &mut applied, "b", false, &cm("2")).expect_err("conflict");
        assert_eq!(err.code, 409);
        assert!(
            err.message.contains("conflict with \"a\": .data.k"),
            "{}",
            err.message
        );
        let same = server_side_apply(&next, &mut applied, "b", false, &cm("1"))
            .expect("same value: shared");
        assert_eq!(same["data"]["k"], "1");
        let taken = server_side_apply(&same, &mut applied, "b", true, &cm("3")).expect("forced");
        assert_eq!(taken["data"]["k"], "3");
        // a no longer owns it: b dropping it removes it.
        let gone = server_side_apply(
            &taken,
            &mut applied,
            "b",
            true,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        )
        .expect("drop");
        assert!(
            gone.get("data").and_then(|d| d.get("k")).is_none(),
            "{gone}"
        );
    }
}
