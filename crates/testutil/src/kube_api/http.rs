//! The HTTP side: paths as the API server lays them out, list / watch / get / create / update /
//! patch / delete, the `/status` subresource, discovery, and TokenReview.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use serde_json::{json, Value};

use super::select::{FieldSelector, LabelSelector};
use super::store::{apply_patch, list_body, resource_key, ApiStatus, Selection, WatchEvent};
use super::{lock, Shared};

/// The resource name of the sentinel event that ends every watch.
pub const DROP_WATCHES: &str = "<drop-watches>";

pub fn router(shared: Arc<Shared>) -> Router {
    let fallback = shared.clone();
    Router::new()
        .route(
            "/api/v1/namespaces/{namespace}/pods/{pod}/portforward",
            axum::routing::get(super::portforward::handle),
        )
        .fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let shared = fallback.clone();
                async move { handle(&shared, method, uri, headers, body).await }
            },
        )
        .with_state(shared)
}

/// The response carrying `s` as a `Status`.
pub fn error_response(s: &ApiStatus) -> Response {
    error(s)
}

fn respond(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

fn error(s: &ApiStatus) -> Response {
    respond(s.code, &s.body())
}

/// What a path names.
struct Target {
    key: String,
    namespace: String,
    name: Option<String>,
    status: bool,
}

/// `/api/v1/...` or `/apis/<group>/<version>/...`, then `[namespaces/<ns>/]<plural>[/<name>[/status]]`.
fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, rest @ ..] => (ns.to_string(), {
            let mut v = vec![*plural];
            v.extend_from_slice(rest);
            v
        }),
        other => (String::new(), other.to_vec()),
    };
    let (plural, name, status) = match rest.as_slice() {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some(name.to_string()), false),
        [plural, name, "status"] => (*plural, Some(name.to_string()), true),
        _ => return None,
    };
    Some(Target {
        key: resource_key(group, version, plural),
        namespace,
        name,
        status,
    })
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Percent-decoding (and `+` as space) of one query component.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

async fn handle(
    shared: &Shared,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lock(&shared.requests).push(format!(
        "{method} {}",
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("")
    ));
    if !shared.available.load(std::sync::atomic::Ordering::SeqCst) {
        return error(&ApiStatus::new(
            503,
            "ServiceUnavailable",
            "the API server is shutting down",
        ));
    }
    let path = uri.path();
    if path == "/apis/authentication.k8s.io/v1/tokenreviews" && method == Method::POST {
        return token_review(shared, &body);
    }
    if path == "/version" && method == Method::GET {
        let (major, minor) = *lock(&shared.version);
        return respond(
            200,
            &json!({"major": major.to_string(), "minor": minor.to_string(),
                    "gitVersion": format!("v{major}.{minor}.0"), "platform": "linux/amd64"}),
        );
    }
    if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" && method == Method::POST {
        return access_review(shared, &body);
    }
    if let Some(r) = discovery(shared, path) {
        return r;
    }
    let Some(target) = parse_path(path) else {
        return error(&ApiStatus::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    };
    let q = query(&uri);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
        .unwrap_or_default();
    let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
    match (method, &target.name) {
        (Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch(shared, &target, &q)
        }
        (Method::GET, None) => list(shared, &target, &q),
        (Method::GET, Some(name)) => {
            let store = lock(&shared.store);
            match store.get(&target.key, &target.namespace, name) {
                Ok(o) => respond(200, &o),
                Err(e) => error(&e),
            }
        }
        (Method::POST, None) => write(shared, dry_run, |store| {
            let obj: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiStatus::new(400, "BadRequest", e.to_string()))?;
            let (o, ev) = store.create(&target.key, &target.namespace, obj)?;
            Ok((201, o, Some(ev)))
        }),
        (Method::PUT, Some(name)) => write(shared, dry_run, |store| {
            let obj: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiStatus::new(400, "BadRequest", e.to_string()))?;
            check_status_target(store, &target)?;
            let (o, ev) = store.update(&target.key, &target.namespace, name, obj, target.status)?;
            Ok((200, o, ev))
        }),
        (Method::PATCH, Some(name)) => write(shared, dry_run, |store| {
            check_status_target(store, &target)?;
            patch(store, &target, name, &content_type, &q, &body)
        }),
        (Method::DELETE, Some(name)) => write(shared, dry_run, |store| {
            let (o, ev) = store.delete(&target.key, &target.namespace, name)?;
            Ok((200, o, Some(ev)))
        }),
        (m, _) => error(&ApiStatus::new(
            405,
            "MethodNotAllowed",
            format!("{m} is not supported here"),
        )),
    }
}

fn check_status_target(store: &super::store::Store, target: &Target) -> Result<(), ApiStatus> {
    let rt = store.resource(&target.key)?;
    if target.status && !rt.status {
        return Err(ApiStatus::new(
            404,
            "NotFound",
            format!("{} has no status subresource", rt.plural),
        ));
    }
    Ok(())
}

type WriteResult = Result<(u16, Value, Option<WatchEvent>), ApiStatus>;

/// Runs a write under the store lock, then tells the watches. A dry run (`dryRun=All`) is
/// checked and answered as the write would be, on a copy that is thrown away.
fn write(
    shared: &Shared,
    dry_run: bool,
    f: impl FnOnce(&mut super::store::Store) -> WriteResult,
) -> Response {
    let mut store = lock(&shared.store);
    if dry_run {
        let mut copy = store.clone();
        drop(store);
        return match f(&mut copy) {
            Ok((code, obj, _)) => respond(code, &obj),
            Err(e) => error(&e),
        };
    }
    match f(&mut store) {
        Ok((code, obj, ev)) => {
            drop(store);
            if let Some(ev) = ev {
                let _ = shared.events.send(ev);
            }
            respond(code, &obj)
        }
        Err(e) => error(&e),
    }
}

fn patch(
    store: &mut super::store::Store,
    target: &Target,
    name: &str,
    content_type: &str,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Result<(u16, Value, Option<WatchEvent>), ApiStatus> {
    let apply = content_type == "application/apply-patch+yaml";
    let manager = q.get("fieldManager").cloned().unwrap_or_default();
    // Patch options are validated before anything is looked up, as kube-apiserver does.
    if apply && manager.is_empty() {
        return Err(ApiStatus::new(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
    }
    if !apply && q.contains_key("force") {
        return Err(ApiStatus::new(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"));
    }
    let force = q.get("force").is_some_and(|f| f == "true");
    let owners = (
        target.key.clone(),
        target.namespace.clone(),
        name.to_string(),
        target.status,
    );
    let ssa = |store: &mut super::store::Store, current: &Value| -> Result<Value, ApiStatus> {
        let config: Value = serde_yaml::from_slice(body)
            .map_err(|e| ApiStatus::new(400, "BadRequest", e.to_string()))?;
        // The managers' configurations change only when the apply succeeds.
        let applied = store.applied.entry(owners.clone()).or_default();
        super::apply::server_side_apply(current, applied, &manager, force, &config)
    };
    let current = match store.get(&target.key, &target.namespace, name) {
        Ok(c) => c,
        Err(e) if apply && e.code == 404 && !target.status => {
            // Apply creates what does not exist (owned by nobody before).
            store
                .applied
                .retain(|k, _| (&k.0, &k.1, &k.2) != (&owners.0, &owners.1, &owners.2));
            let obj = ssa(store, &json!({}))?;
            let (o, ev) = store.create(&target.key, &target.namespace, obj)?;
            return Ok((201, o, Some(ev)));
        }
        Err(e) => return Err(e),
    };
    let mut next = if apply {
        ssa(store, &current)?
    } else {
        apply_patch(&current, content_type, body)?
    };
    if !apply {
        // A patch carries no precondition unless it names a resourceVersion itself.
        let patched_rv = next["metadata"]["resourceVersion"].clone();
        if patched_rv == current["metadata"]["resourceVersion"] {
            if let Some(m) = next["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
        }
    } else if let Some(m) = next["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let (o, ev) = store.update(&target.key, &target.namespace, name, next, target.status)?;
    Ok((200, o, ev))
}

fn selection(
    target: &Target,
    kind: &str,
    q: &HashMap<String, String>,
) -> Result<Selection, ApiStatus> {
    let bad = |e: String| ApiStatus::new(400, "BadRequest", e);
    Ok(Selection {
        namespace: (!target.namespace.is_empty()).then(|| target.namespace.clone()),
        labels: match q.get("labelSelector") {
            Some(s) => LabelSelector::parse(s).map_err(bad)?,
            None => LabelSelector::default(),
        },
        fields: match q.get("fieldSelector") {
            Some(s) => FieldSelector::parse(s, kind).map_err(bad)?,
            None => FieldSelector::default(),
        },
    })
}

fn list(shared: &Shared, target: &Target, q: &HashMap<String, String>) -> Response {
    let mut store = lock(&shared.store);
    let rt = match store.resource(&target.key) {
        Ok(rt) => rt.clone(),
        Err(e) => return error(&e),
    };
    let (rv, mut items) = if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        match store.pages.remove(token) {
            Some(page) => page,
            None => {
                return error(&ApiStatus::new(410, "Expired", "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
            }
        }
    } else {
        let sel = match selection(target, &rt.kind, q) {
            Ok(s) => s,
            Err(e) => return error(&e),
        };
        (store.rv, store.list(&target.key, &sel))
    };
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let cont = match limit {
        Some(l) if items.len() > l => {
            let rest = items.split_off(l);
            store.next_page += 1;
            let token = format!("{rv}-{}", store.next_page);
            store.pages.insert(token.clone(), (rv, rest));
            Some(token)
        }
        _ => None,
    };
    respond(200, &list_body(&rt, rv, items, cont))
}

/// The JSON line of one watch event.
fn line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

/// What `ev` looks like to a watch with `sel` (selector changes become ADDED / DELETED).
fn seen_as(ev: &WatchEvent, key: &str, sel: &Selection) -> Option<(&'static str, Value)> {
    if ev.resource != key {
        return None;
    }
    let now = sel.matches(&ev.namespace, &ev.object);
    let before = ev.previous.as_ref().map(|p| sel.matches(&ev.namespace, p));
    match (ev.kind, before, now) {
        ("MODIFIED", Some(true), true) => Some(("MODIFIED", ev.object.clone())),
        ("MODIFIED", Some(false), true) => Some(("ADDED", ev.object.clone())),
        ("MODIFIED", Some(true), false) => Some(("DELETED", ev.object.clone())),
        ("MODIFIED", _, _) => None,
        (k, _, true) => Some((k, ev.object.clone())),
        _ => None,
    }
}

fn watch(shared: &Shared, target: &Target, q: &HashMap<String, String>) -> Response {
    let store = lock(&shared.store);
    let rt = match store.resource(&target.key) {
        Ok(rt) => rt.clone(),
        Err(e) => return error(&e),
    };
    let sel = match selection(target, &rt.kind, q) {
        Ok(s) => s,
        Err(e) => return error(&e),
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let mut first: Vec<Bytes> = Vec::new();
    let from = q.get("resourceVersion").cloned().unwrap_or_default();
    let mut gone = false;
    if from.is_empty() || from == "0" {
        // "Any" resource version: the current state as ADDED events, then changes.
        for o in store.list(&target.key, &sel) {
            first.push(line("ADDED", &o));
        }
    } else {
        match from.parse::<u64>() {
            Ok(rv) if rv < store.compacted => gone = true,
            Ok(rv) => {
                for ev in store.history.iter().filter(|e| e.rv > rv) {
                    if let Some((k, o)) = seen_as(ev, &target.key, &sel) {
                        first.push(line(k, &o));
                    }
                }
            }
            Err(_) => {
                return error(&ApiStatus::new(
                    400,
                    "BadRequest",
                    format!("invalid resource version {from:?}"),
                ));
            }
        }
    }
    if gone {
        let status = ApiStatus::new(
            410,
            "Expired",
            format!("too old resource version: {from} ({})", store.compacted),
        );
        let body = line("ERROR", &status.body());
        return Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap_or_default();
    }
    let mut rx = shared.events.subscribe();
    let mut last_rv = store.rv;
    drop(store);
    let every = *lock(&shared.bookmark_every);
    let api_version = rt.api_version();
    let kind = rt.kind.clone();
    let key = target.key.clone();
    let stream = async_stream(move |tx| async move {
        for b in first {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(ev) if ev.resource == DROP_WATCHES => return,
                    Ok(ev) => {
                        last_rv = last_rv.max(ev.rv);
                        if let Some((k, o)) = seen_as(&ev, &key, &sel) {
                            if tx.send(line(k, &o)).await.is_err() {
                                return;
                            }
                        }
                    }
                    // Fell behind: end the stream; the client re-watches from its last version.
                    Err(_) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"kind": kind, "apiVersion": api_version,
                                   "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(line("BOOKMARK", &b)).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// A body stream fed by a task through a channel.
fn async_stream<F, Fut>(f: F) -> impl futures::Stream<Item = Result<Bytes, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

/// Discovery documents for `/api`, `/api/v1`, `/apis` and `/apis/<group>/<version>`.
fn discovery(shared: &Shared, path: &str) -> Option<Response> {
    let store = lock(&shared.store);
    let types: Vec<&super::ResourceType> = store.types.values().collect();
    let resources = |group: &str, version: &str| -> Value {
        let list: Vec<Value> = types
            .iter()
            .filter(|t| t.group == group && t.version == version)
            .flat_map(|t| {
                let main = json!({"name": t.plural, "namespaced": t.namespaced, "kind": t.kind,
                    "singularName": "", "verbs": ["create","delete","get","list","patch","update","watch"]});
                let status = t.status.then(|| json!({"name": format!("{}/status", t.plural),
                    "namespaced": t.namespaced, "kind": t.kind, "singularName": "", "verbs": ["get","patch","update"]}));
                std::iter::once(main).chain(status)
            })
            .collect();
        json!({"kind": "APIResourceList", "apiVersion": "v1",
               "groupVersion": if group.is_empty() { version.to_string() } else { format!("{group}/{version}") },
               "resources": list})
    };
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let body = match segs.as_slice() {
        ["api"] => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        }
        ["api", "v1"] => resources("", "v1"),
        ["apis"] => {
            let mut groups: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
            for t in types.iter().filter(|t| !t.group.is_empty()) {
                let v = groups.entry(&t.group).or_default();
                if !v.contains(&t.version.as_str()) {
                    v.push(&t.version);
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(g, vs)| {
                    let versions: Vec<Value> = vs
                        .iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
                })
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        ["apis", g, v] => {
            if !types.iter().any(|t| t.group == *g && t.version == *v) {
                return Some(error(&ApiStatus::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )));
            }
            resources(g, v)
        }
        _ => return None,
    };
    Some(respond(200, &body))
}

/// A SelfSubjectAccessReview: allowed unless [`super::FakeApiServer::deny`] named it.
fn access_review(shared: &Shared, body: &[u8]) -> Response {
    let review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error(&ApiStatus::new(400, "BadRequest", e.to_string())),
    };
    let attrs = &review["spec"]["resourceAttributes"];
    if !attrs.is_object() {
        return error(&ApiStatus::new(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: Required value",
        ));
    }
    let field = |f: &str| attrs[f].as_str().unwrap_or_default().to_string();
    let asked = (field("verb"), field("group"), field("resource"));
    let denied = lock(&shared.denied).iter().any(|d| {
        (d.0 == asked.0 || d.0 == "*") && d.1 == asked.1 && (d.2 == asked.2 || d.2 == "*")
    });
    let status = if denied {
        json!({"allowed": false, "denied": true, "reason": "denied by the fake API server's deny list"})
    } else {
        json!({"allowed": true, "reason": "the fake API server allows everything not denied"})
    };
    respond(
        201,
        &json!({"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": null}, "spec": review["spec"], "status": status}),
    )
}

fn token_review(shared: &Shared, body: &[u8]) -> Response {
    let review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error(&ApiStatus::new(400, "BadRequest", e.to_string())),
    };
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let wanted: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let known = lock(&shared.tokens).get(token).cloned();
    let status = match known {
        None => {
            json!({"authenticated": false, "error": "[invalid bearer token, token lookup failed]"})
        }
        Some(t) => {
            let audiences: Vec<String> = if wanted.is_empty() {
                t.audiences.clone()
            } else {
                wanted
                    .iter()
                    .filter(|a| t.audiences.contains(a))
                    .cloned()
                    .collect()
            };
            let pod_alive = t.pod.as_ref().is_none_or(|(name, uid)| {
                let store = lock(&shared.store);
                store
                    .get(&resource_key("", "v1", "pods"), &t.namespace, name)
                    .is_ok_and(|p| p["metadata"]["uid"].as_str() == Some(uid.as_str()))
            });
            if audiences.is_empty() {
                json!({"authenticated": false, "error": "[invalid bearer token, token audiences is invalid for the target audiences]"})
            } else if !pod_alive {
                json!({"authenticated": false, "error": "[invalid bearer token, pod bound to the token no longer exists]"})
            } else {
                let mut extra = serde_json::Map::new();
                if let Some((name, uid)) = &t.pod {
                    extra.insert(
                        "authentication.kubernetes.io/pod-name".into(),
                        json!([name]),
                    );
                    extra.insert("authentication.kubernetes.io/pod-uid".into(), json!([uid]));
                }
                let user = match &t.user {
                    Some(name) => json!({"username": name, "uid": format!("user-uid-{name}"),
                        "groups": ["system:authenticated"]}),
                    None => json!({
                        "username": format!("system:serviceaccount:{}:{}", t.namespace, t.service_account),
                        "uid": format!("sa-uid-{}-{}", t.namespace, t.service_account),
                        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", t.namespace), "system:authenticated"],
                        "extra": extra,
                    }),
                };
                json!({"authenticated": true, "audiences": audiences, "user": user})
            }
        }
    };
    respond(
        201,
        &json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": null}, "spec": review["spec"], "status": status}),
    )
}
