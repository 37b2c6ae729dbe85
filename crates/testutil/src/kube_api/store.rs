//! The fake API server's state: objects by resource, one resource version counter for all of
//! them (as etcd's revision), the event history watches replay, and the write semantics
//! (create, update with optimistic concurrency, patches, status subresource, delete).

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};

use super::select::{FieldSelector, LabelSelector};
use super::ResourceType;

/// An API error as the server reports it: HTTP code, `reason` and message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiStatus {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiStatus {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiStatus {
        ApiStatus {
            code,
            reason,
            message: message.into(),
        }
    }

    /// The `Status` object in the response body.
    pub fn body(&self) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason,
            "code": self.code,
        })
    }
}

/// One change, as watches send it.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub rv: u64,
    /// The object before a MODIFIED change (selectors turn such changes into ADDED/DELETED).
    pub previous: Option<Value>,
    pub resource: String,
    pub namespace: String,
    pub kind: &'static str,
    pub object: Value,
}

/// The key of a resource type: `group/version/plural`.
pub fn resource_key(group: &str, version: &str, plural: &str) -> String {
    format!("{group}/{version}/{plural}")
}

#[derive(Debug, Default, Clone)]
pub struct Store {
    pub types: BTreeMap<String, ResourceType>,
    /// resource key -> (namespace, name) -> object.
    objects: HashMap<String, BTreeMap<(String, String), Value>>,
    pub rv: u64,
    /// Every change, oldest first, from `compacted` on.
    pub history: Vec<WatchEvent>,
    /// Resource versions at or below this are gone from the history (watches get 410).
    pub compacted: u64,
    /// Continue token -> the rest of a paginated list and its resource version.
    pub pages: HashMap<String, (u64, Vec<Value>)>,
    /// Numbers continue tokens (unique for the server's life).
    pub next_page: u64,
    next_uid: u64,
    /// (resource key, namespace, name, status subresource) -> field manager -> its last
    /// server-side-applied configuration.
    pub applied: HashMap<(String, String, String, bool), BTreeMap<String, Value>>,
}

/// What a list or watch is restricted to.
#[derive(Debug, Default, Clone)]
pub struct Selection {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selection {
    pub fn matches(&self, namespace: &str, obj: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }
}

fn name_of(obj: &Value) -> Option<String> {
    obj["metadata"]["name"].as_str().map(str::to_string)
}

impl Store {
    pub fn resource(&self, key: &str) -> Result<&ResourceType, ApiStatus> {
        self.types.get(key).ok_or_else(|| {
            ApiStatus::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({key})"),
            )
        })
    }

    pub fn get(&self, key: &str, ns: &str, name: &str) -> Result<Value, ApiStatus> {
        let rt = self.resource(key)?;
        self.objects
            .get(key)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| {
                ApiStatus::new(
                    404,
                    "NotFound",
                    format!("{} \"{name}\" not found", rt.plural_qualified()),
                )
            })
    }

    /// The matching objects, sorted by namespace and name, at the current resource version.
    pub fn list(&self, key: &str, sel: &Selection) -> Vec<Value> {
        self.objects
            .get(key)
            .map(|m| {
                m.iter()
                    .filter(|((ns, _), o)| sel.matches(ns, o))
                    .map(|(_, o)| o.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn record(
        &mut self,
        key: &str,
        ns: &str,
        kind: &'static str,
        object: Value,
        previous: Option<Value>,
    ) -> WatchEvent {
        let ev = WatchEvent {
            rv: self.rv,
            previous,
            resource: key.to_string(),
            namespace: ns.to_string(),
            kind,
            object,
        };
        self.history.push(ev.clone());
        ev
    }

    fn bump(&mut self, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
    }

    /// Checks the namespace rule of the type and that the namespace exists.
    fn check_namespace(&self, rt: &ResourceType, ns: &str) -> Result<(), ApiStatus> {
        if rt.namespaced && ns.is_empty() {
            return Err(ApiStatus::new(
                400,
                "BadRequest",
                "the namespace of the object is required",
            ));
        }
        let ns_key = resource_key("", "v1", "namespaces");
        if rt.namespaced && self.types.contains_key(&ns_key) {
            let exists = self
                .objects
                .get(&ns_key)
                .is_some_and(|m| m.contains_key(&(String::new(), ns.to_string())));
            if !exists {
                return Err(ApiStatus::new(
                    404,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                ));
            }
        }
        Ok(())
    }

    /// POST: a new object (409 AlreadyExists if the name is taken).
    pub fn create(
        &mut self,
        key: &str,
        ns: &str,
        mut obj: Value,
    ) -> Result<(Value, WatchEvent), ApiStatus> {
        let rt = self.resource(key)?.clone();
        self.check_namespace(&rt, ns)?;
        if key == super::controllers::crd_key() {
            super::controllers::validate_crd(&obj)?;
        }
        let name = name_of(&obj).ok_or_else(|| {
            ApiStatus::new(
                422,
                "Invalid",
                format!("{} is invalid: metadata.name: Required value", rt.kind),
            )
        })?;
        let k = (ns.to_string(), name.clone());
        if self.objects.get(key).is_some_and(|m| m.contains_key(&k)) {
            return Err(ApiStatus::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", rt.plural_qualified()),
            ));
        }
        if !obj.is_object() {
            return Err(ApiStatus::new(
                400,
                "BadRequest",
                "the body is not an object",
            ));
        }
        obj["apiVersion"] = Value::String(rt.api_version());
        obj["kind"] = Value::String(rt.kind.clone());
        if rt.namespaced {
            obj["metadata"]["namespace"] = Value::String(ns.to_string());
        }
        self.next_uid += 1;
        let meta = obj["metadata"]
            .as_object_mut()
            .ok_or_else(|| ApiStatus::new(400, "BadRequest", "metadata is not an object"))?;
        meta.insert(
            "uid".into(),
            json!(format!("00000000-0000-4000-8000-{:012x}", self.next_uid)),
        );
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("generation".into(), json!(1));
        if rt.status {
            // With a status subresource, status is written through `/status` only.
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        if rt.group.is_empty() && rt.plural == "namespaces" {
            // A new namespace is Active (what its status strategy sets).
            obj["status"] = json!({"phase": "Active"});
        }
        self.bump(&mut obj);
        self.objects
            .entry(key.to_string())
            .or_default()
            .insert(k, obj.clone());
        let ev = self.record(key, ns, "ADDED", obj.clone(), None);
        Ok((obj, ev))
    }

    /// PUT (of the object, or with `status_only` of its status): optimistic concurrency on
    /// `metadata.resourceVersion` when the body carries one (409 Conflict when stale).
    pub fn update(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        mut obj: Value,
        status_only: bool,
    ) -> Result<(Value, Option<WatchEvent>), ApiStatus> {
        let rt = self.resource(key)?.clone();
        let current = self.get(key, ns, name)?;
        if name_of(&obj).as_deref() != Some(name) {
            return Err(ApiStatus::new(
                400,
                "BadRequest",
                "the name of the object does not match the name on the URL",
            ));
        }
        if let Some(want) = obj["metadata"]["resourceVersion"].as_str() {
            if want
                != current["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
            {
                return Err(ApiStatus::new(409, "Conflict", format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    rt.plural_qualified()
                )));
            }
        }
        if key == super::controllers::crd_key() && !status_only {
            super::controllers::validate_crd(&obj)?;
        }
        let next = if status_only {
            let mut next = current.clone();
            next["status"] = obj.get("status").cloned().unwrap_or(Value::Null);
            // The pod status strategy keeps labels and annotations written through
            // pods/status (istio-cni writes its redirection annotation there); every other
            // status write changes the status only.
            if rt.group.is_empty() && rt.plural == "pods" {
                for f in ["labels", "annotations"] {
                    match obj["metadata"].get(f) {
                        Some(v) if !v.is_null() => next["metadata"][f] = v.clone(),
                        _ => {
                            if let Some(m) = next["metadata"].as_object_mut() {
                                m.remove(f);
                            }
                        }
                    }
                }
            }
            next
        } else {
            // System fields are the server's; with a status subresource, status is too.
            for f in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
                obj["metadata"][f] = current["metadata"][f].clone();
            }
            obj["apiVersion"] = Value::String(rt.api_version());
            obj["kind"] = Value::String(rt.kind.clone());
            if rt.namespaced {
                obj["metadata"]["namespace"] = Value::String(ns.to_string());
            }
            if rt.status {
                match current.get("status") {
                    Some(s) => obj["status"] = s.clone(),
                    None => {
                        if let Some(o) = obj.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            let spec_changed = strip_meta_status(&obj) != strip_meta_status(&current);
            if spec_changed {
                let g = current["metadata"]["generation"].as_i64().unwrap_or(1);
                obj["metadata"]["generation"] = json!(g + 1);
            }
            obj
        };
        if next == current {
            // A no-op write changes nothing and sends no event, as the real server does.
            return Ok((current, None));
        }
        let mut next = next;
        self.bump(&mut next);
        self.objects
            .entry(key.to_string())
            .or_default()
            .insert((ns.to_string(), name.to_string()), next.clone());
        let ev = self.record(key, ns, "MODIFIED", next.clone(), Some(current));
        Ok((next, Some(ev)))
    }

    pub fn delete(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
    ) -> Result<(Value, WatchEvent), ApiStatus> {
        self.get(key, ns, name)?;
        let mut obj = self
            .objects
            .get_mut(key)
            .and_then(|m| m.remove(&(ns.to_string(), name.to_string())))
            .ok_or_else(|| ApiStatus::new(404, "NotFound", format!("{name} not found")))?;
        // A new object of the same name starts with no field owners.
        self.applied
            .retain(|k, _| (k.0.as_str(), k.1.as_str(), k.2.as_str()) != (key, ns, name));
        self.bump(&mut obj);
        let ev = self.record(key, ns, "DELETED", obj.clone(), None);
        Ok((obj, ev))
    }

    /// Writes `obj` as it is (status included), as if controllers had written it; creates or
    /// replaces, with a new resource version and the event watches would see.
    pub fn seed(&mut self, key: &str, mut obj: Value) -> Result<WatchEvent, ApiStatus> {
        let rt = self.resource(key)?.clone();
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let ns = if rt.namespaced { ns } else { String::new() };
        let name = name_of(&obj)
            .ok_or_else(|| ApiStatus::new(422, "Invalid", "metadata.name: Required value"))?;
        obj["apiVersion"] = Value::String(rt.api_version());
        obj["kind"] = Value::String(rt.kind.clone());
        let k = (ns.clone(), name);
        let previous = self.objects.get(key).and_then(|m| m.get(&k)).cloned();
        if obj["metadata"]["uid"].is_null() {
            self.next_uid += 1;
            obj["metadata"]["uid"] = match &previous {
                Some(p) => p["metadata"]["uid"].clone(),
                None => json!(format!("00000000-0000-4000-8000-{:012x}", self.next_uid)),
            };
        }
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] = json!(now());
        }
        self.bump(&mut obj);
        self.objects
            .entry(key.to_string())
            .or_default()
            .insert(k, obj.clone());
        let kind = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        Ok(self.record(key, &ns, kind, obj, previous))
    }

    /// Forgets the history up to now: watches from an older resource version get 410 Gone.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
        self.pages.clear();
    }
}

fn strip_meta_status(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
    }
    v
}

/// RFC 3339 UTC, second precision, as `metav1.Time`.
fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 -> (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Applies a patch of `content_type` to `current`.
pub fn apply_patch(current: &Value, content_type: &str, body: &[u8]) -> Result<Value, ApiStatus> {
    let bad = |e: String| ApiStatus::new(400, "BadRequest", e);
    let mut out = current.clone();
    match content_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let patch: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
            json_patch::merge(&mut out, &patch);
        }
        "application/json-patch+json" => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
            json_patch::patch(&mut out, &patch)
                .map_err(|e| ApiStatus::new(422, "Invalid", e.to_string()))?;
        }
        "application/apply-patch+yaml" => {
            let patch: Value = serde_yaml::from_slice(body).map_err(|e| bad(e.to_string()))?;
            json_patch::merge(&mut out, &patch);
        }
        other => {
            return Err(ApiStatus::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other})"),
            ))
        }
    }
    Ok(out)
}

/// `Map` helper for list bodies.
pub fn list_body(rt: &ResourceType, rv: u64, mut items: Vec<Value>, cont: Option<String>) -> Value {
    if !rt.custom {
        // Items of built-in lists carry no type meta; the list's kind says it.
        for item in &mut items {
            if let Some(o) = item.as_object_mut() {
                o.remove("apiVersion");
                o.remove("kind");
            }
        }
    }
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    if let Some(c) = cont {
        meta.insert("continue".into(), json!(c));
    }
    json!({
        "kind": format!("{}List", rt.kind),
        "apiVersion": rt.api_version(),
        "metadata": meta,
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_788), (2026, 12, 1));
    }
}
