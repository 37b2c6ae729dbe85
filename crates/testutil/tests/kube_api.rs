//! The fake API server driven by the real `kube` client and runtime watcher, as the mesh's
//! Kubernetes code drives it. The same flows run against a real kube-apiserver when
//! `MESH_KUBE_CONFORMANCE` names its kubeconfig (`scripts/kube-conformance.sh`); the few steps
//! that need the fake's test controls say so when they are left out.

mod kube_target;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::Api;
use kube_target::{now, Target};
use serde_json::json;

/// A pod bound to a node that does not exist, so that no kubelet acts on it.
fn pod(name: &str, node: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": format!("absent-{node}"), "containers": [{"name": "c", "image": "x"}]},
    }))
    .expect("pod")
}

fn config_map(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("cm")
}

#[tokio::test]
async fn writes_follow_the_api_servers_rules() {
    let t = Target::start("writes").await;
    let pods: Api<Pod> = t.api();
    let created = pods
        .create(&PostParams::default(), &pod("a", "node1", "web"))
        .await
        .expect("create");
    let rv1 = created.metadata.resource_version.clone().expect("rv");
    assert!(created.metadata.uid.is_some());
    // The name is taken: 409 AlreadyExists.
    let again = pods
        .create(&PostParams::default(), &pod("a", "node1", "web"))
        .await;
    assert!(
        matches!(again, Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "AlreadyExists")
    );
    // A namespace that does not exist: 404.
    let other: Api<Pod> = Api::namespaced(t.client.clone(), "mesh-conformance-nowhere");
    let missing = other
        .create(&PostParams::default(), &pod("b", "n", "x"))
        .await;
    assert!(matches!(missing, Err(kube::Error::Api(e)) if e.code == 404));
    // A merge patch moves the resource version; an update from the old one conflicts.
    let patched = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .expect("merge patch");
    assert_ne!(
        patched.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    let mut stale = created.clone();
    stale.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
    let conflict = pods.replace("a", &PostParams::default(), &stale).await;
    assert!(
        matches!(conflict, Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "Conflict")
    );
    // Status is written through /status only.
    let with_status = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.1.0.5"}})),
        )
        .await
        .expect("status patch");
    assert_eq!(
        with_status.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );
    let ignored = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("patch");
    assert_eq!(
        ignored.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );
    // Apply needs a field manager (checked before anything else: 422) and creates what is
    // missing.
    let applied = pods
        .patch(
            "c",
            &PatchParams::apply("mesh-test"),
            &Patch::Apply(pod("c", "node2", "web")),
        )
        .await
        .expect("apply creates");
    assert_eq!(applied.metadata.name.as_deref(), Some("c"));
    let no_manager = pods
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Apply(pod("c", "node2", "web")),
        )
        .await;
    assert!(
        matches!(&no_manager, Err(kube::Error::Api(e)) if e.code == 422 && e.reason == "Invalid"),
        "{no_manager:?}"
    );
    // `force` belongs to apply only (the kube client refuses to send it with another patch, so
    // the request is written by hand).
    let forced_merge =
        http::Request::patch(format!("/api/v1/namespaces/{}/pods/c?force=true", t.ns))
            .header("content-type", "application/merge-patch+json")
            .body(br#"{"metadata":{"labels":{"x":"y"}}}"#.to_vec())
            .expect("request");
    let forced_merge = t.client.request::<Pod>(forced_merge).await;
    assert!(
        matches!(&forced_merge, Err(kube::Error::Api(e)) if e.code == 422),
        "{forced_merge:?}"
    );
    // JSON patch.
    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}
    ]))
    .expect("json patch");
    let j = pods
        .patch("c", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .expect("json patch");
    assert_eq!(
        j.metadata
            .annotations
            .and_then(|a| a.get("k").cloned())
            .as_deref(),
        Some("v")
    );
    pods.delete("c", &now()).await.expect("delete");
    assert!(pods.get_opt("c").await.expect("read").is_none());
}

#[tokio::test]
async fn lists_select_and_paginate_over_one_snapshot() {
    let t = Target::start("lists").await;
    let pods: Api<Pod> = t.api();
    for (i, node) in ["node1", "node2", "node1", "node1", "node2"]
        .iter()
        .enumerate()
    {
        let app = if i % 2 == 0 { "web" } else { "db" };
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), node, app))
            .await
            .expect("create");
    }
    let on_node1 = pods
        .list(&ListParams::default().fields("spec.nodeName=absent-node1"))
        .await
        .expect("list");
    assert_eq!(on_node1.items.len(), 3);
    let web = pods
        .list(&ListParams::default().labels("app in (web),app!=db"))
        .await
        .expect("list");
    assert_eq!(web.items.len(), 3);
    let bad = pods
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await;
    assert!(matches!(bad, Err(kube::Error::Api(e)) if e.code == 400));
    // Pages of 2: every page has the first page's resource version; a write in between does not
    // show up in the rest of the list.
    let first = pods
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    let token = first.metadata.continue_.clone().expect("continue");
    pods.create(&PostParams::default(), &pod("late", "node1", "web"))
        .await
        .expect("create");
    let second = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let third = pods
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().expect("more")),
        )
        .await
        .expect("page 3");
    let names: Vec<String> = [first.items, second.items, third.items]
        .concat()
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
}

#[tokio::test]
async fn watches_replay_bookmark_and_expire() {
    let t = Target::start("watches").await;
    let bookmark_wait = t.bookmarks_soon();
    let maps: Api<ConfigMap> = t.api();
    let a = maps
        .create(
            &PostParams::default(),
            &config_map("a", json!({"app": "web"})),
        )
        .await
        .expect("a");
    let rv = a.metadata.resource_version.clone().expect("rv");
    let b = maps
        .create(
            &PostParams::default(),
            &config_map("b", json!({"app": "web"})),
        )
        .await
        .expect("b");
    // From a's version: b's creation is replayed, then a bookmark comes.
    let mut stream = maps
        .watch(
            &WatchParams::default().timeout(bookmark_wait.as_secs() as u32 + 30),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    let mut saw_b = false;
    let mut saw_bookmark = false;
    while let Ok(Ok(Some(ev))) = tokio::time::timeout(bookmark_wait, stream.try_next()).await {
        match ev {
            WatchEvent::Added(m) => saw_b |= m.metadata.name.as_deref() == Some("b"),
            WatchEvent::Bookmark(_) => {
                saw_bookmark = true;
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        saw_b && saw_bookmark,
        "b replayed: {saw_b}, bookmark: {saw_bookmark}"
    );
    // A label change out of a selected watch is a DELETED for that watch.
    let mut web = maps
        .watch(
            &WatchParams::default().labels("app=web").timeout(10),
            b.metadata.resource_version.as_deref().expect("rv"),
        )
        .await
        .expect("watch")
        .boxed();
    maps.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .expect("relabel");
    let ev = tokio::time::timeout(Duration::from_secs(5), web.try_next()).await;
    assert!(matches!(ev, Ok(Ok(Some(WatchEvent::Deleted(_))))), "{ev:?}");
    // A version the server has forgotten: an ERROR event with 410 (and HTTP 200).
    let forgotten = t.forgotten_version(&rv);
    let mut old = maps
        .watch(&WatchParams::default(), &forgotten)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(5), old.try_next()).await;
    assert!(
        matches!(&ev, Ok(Ok(Some(WatchEvent::Error(e)))) if e.code == 410),
        "{ev:?}"
    );
}

#[tokio::test]
async fn server_side_apply_tracks_each_managers_fields() {
    let t = Target::start("apply").await;
    let maps: Api<ConfigMap> = t.api();
    let apply = |manager: &'static str, data: serde_json::Value, force: bool| {
        let maps = maps.clone();
        async move {
            let mut params = PatchParams::apply(manager);
            if force {
                params = params.force();
            }
            let doc = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "shared"}, "data": data});
            maps.patch("shared", &params, &Patch::Apply(&doc)).await
        }
    };
    let data = |m: ConfigMap| m.data.unwrap_or_default().into_iter().collect::<Vec<_>>();
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    apply("first", json!({"a": "1", "s": "x"}), false)
        .await
        .expect("first applies");
    let both = apply("second", json!({"b": "2"}), false)
        .await
        .expect("second applies");
    assert_eq!(data(both), [pair("a", "1"), pair("b", "2"), pair("s", "x")]);
    // A field its only manager stops applying is removed.
    let dropped = apply("first", json!({"a": "1"}), false)
        .await
        .expect("first re-applies");
    assert_eq!(data(dropped), [pair("a", "1"), pair("b", "2")]);
    // Setting another manager's field to another value conflicts, naming the manager...
    let conflict = apply("second", json!({"a": "9"}), false).await;
    assert!(
        matches!(&conflict, Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "Conflict" && e.message.contains("first")),
        "{conflict:?}"
    );
    // ... unless forced: the field changes hands, and what `second` no longer applies goes.
    let forced = apply("second", json!({"a": "9"}), true)
        .await
        .expect("forced apply");
    assert_eq!(data(forced), [pair("a", "9")]);

    // Conditions are a list keyed by type: each manager keeps its own items, and applying an
    // empty list gives up only its own.
    let pods: Api<Pod> = t.api();
    pods.create(&PostParams::default(), &pod("p", "node1", "web"))
        .await
        .expect("pod");
    let condition = |manager: &'static str, conditions: serde_json::Value| {
        let pods = pods.clone();
        async move {
            let doc = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "status": {"conditions": conditions}});
            pods.patch_status(
                "p",
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&doc),
            )
            .await
            .expect("status apply")
        }
    };
    let types = |p: Pod| {
        let mut types: Vec<String> = p
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.type_)
            .filter(|t| t.starts_with("mesh.test/"))
            .collect();
        types.sort();
        types
    };
    condition("first", json!([{"type": "mesh.test/A", "status": "True"}])).await;
    let both = condition("second", json!([{"type": "mesh.test/B", "status": "True"}])).await;
    assert_eq!(types(both), ["mesh.test/A", "mesh.test/B"]);
    let cleared = condition("first", json!([])).await;
    assert_eq!(types(cleared), ["mesh.test/B"]);
}

#[tokio::test]
async fn the_runtime_watcher_lists_watches_and_relists_after_410() {
    let t = Target::start("watcher").await;
    let pods: Api<Pod> = t.api();
    pods.create(&PostParams::default(), &pod("a", "node1", "web"))
        .await
        .expect("a");
    pods.create(&PostParams::default(), &pod("elsewhere", "node2", "web"))
        .await
        .expect("b");
    let config = watcher::Config::default().fields("spec.nodeName=absent-node1");
    let mut events = watcher(pods.clone(), config).boxed();
    macro_rules! next {
        () => {
            tokio::time::timeout(Duration::from_secs(5), events.try_next())
                .await
                .expect("an event in time")
                .expect("no error")
                .expect("stream open")
        };
    }
    assert!(matches!(next!(), watcher::Event::Init));
    assert!(
        matches!(next!(), watcher::Event::InitApply(p) if p.metadata.name.as_deref() == Some("a"))
    );
    assert!(matches!(next!(), watcher::Event::InitDone));
    pods.create(&PostParams::default(), &pod("c", "node1", "web"))
        .await
        .expect("c");
    assert!(matches!(next!(), watcher::Event::Apply(p) if p.metadata.name.as_deref() == Some("c")));
    let Some(server) = &t.fake else {
        eprintln!(
            "not checked on a real server: the re-list after 410 (it needs the history compacted and the watch dropped on demand)"
        );
        return;
    };
    // No bookmark may move the watcher's version past the compaction below.
    server.set_bookmark_interval(Duration::from_secs(600));
    // A change the watch does not select moves the server on; the history is compacted past
    // the watcher's version and the watch drops: re-watching gets 410, the watcher re-lists.
    pods.patch(
        "elsewhere",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .expect("patch elsewhere");
    server.compact();
    server.drop_watches();
    pods.delete("a", &now()).await.expect("delete a");
    // The watcher reports the 410 once, then starts over.
    let expired = tokio::time::timeout(Duration::from_secs(5), events.try_next()).await;
    assert!(
        matches!(&expired, Ok(Err(watcher::Error::WatchError(s))) if s.code == 410),
        "{expired:?}"
    );
    assert!(matches!(next!(), watcher::Event::Init));
    let mut names = Vec::new();
    loop {
        match next!() {
            watcher::Event::InitApply(p) => names.extend(p.metadata.name),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(names, ["c"]);
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/namespaces/shop/pods?") && !r.contains("watch=true"))
        .count();
    assert_eq!(lists, 2, "one list, one re-list: {:?}", server.requests());
}

#[tokio::test]
async fn token_reviews_check_audience_and_the_bound_pod() {
    let t = Target::start("tokens").await;
    t.service_account("ztunnel").await;
    let mut ztunnel = pod("ztunnel-1", "node1", "z");
    if let Some(spec) = ztunnel.spec.as_mut() {
        spec.service_account_name = Some("ztunnel".into());
    }
    let pods: Api<Pod> = t.api();
    let p = pods
        .create(&PostParams::default(), &ztunnel)
        .await
        .expect("pod");
    let uid = p.metadata.uid.clone().expect("uid");
    let token = t.pod_token("ztunnel", "ztunnel-1", &uid, "istio-ca").await;
    let reviews: Api<TokenReview> = Api::all(t.client.clone());
    let review = |token: &str, aud: &str| {
        let reviews = reviews.clone();
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                audiences: Some(vec![aud.into()]),
            },
            ..TokenReview::default()
        };
        async move {
            reviews
                .create(&PostParams::default(), &request)
                .await
                .expect("review")
                .status
                .expect("status")
        }
    };
    let status = review(&token, "istio-ca").await;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("user");
    assert_eq!(
        user.username,
        Some(format!("system:serviceaccount:{}:ztunnel", t.ns))
    );
    assert!(user
        .extra
        .expect("extra")
        .contains_key("authentication.kubernetes.io/pod-name"));
    let wrong = review(&token, "kubernetes").await;
    assert_eq!(wrong.authenticated, Some(false));
    let unknown = review("nope", "istio-ca").await;
    assert_eq!(unknown.authenticated, Some(false));
    // Once its pod is deleted, the bound token no longer authenticates (a real server may keep
    // a success in its token cache for about 10 s).
    pods.delete("ztunnel-1", &now()).await.expect("delete");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let gone = review(&token, "istio-ca").await;
        if gone.authenticated == Some(false) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the token of a deleted pod still authenticates: {gone:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(server) = &t.fake {
        assert!(server.requests().iter().any(|r| r.contains("tokenreviews")));
    }
}

/// Polls `check` every 100 ms until it holds, for at most `secs` seconds.
async fn until<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn crds_are_established_then_served_and_take_their_objects_with_them() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{DeleteParams, DynamicObject};
    use kube::core::GroupVersionKind;

    let t = Target::start("crds").await;
    let crds: Api<CustomResourceDefinition> = Api::all(t.client.clone());
    let group = format!("{}.conformance.example.com", t.ns);
    let crd = |name: &str| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                                   "subresources": {"status": {}}}]}}))
        .expect("crd")
    };
    let bad = crds
        .create(&PostParams::default(), &crd("gadgets.example.com"))
        .await
        .expect_err("the name must be <plural>.<group>");
    assert!(
        matches!(bad, kube::Error::Api(ref s) if s.code == 422),
        "{bad}"
    );

    let name = format!("widgets.{group}");
    crds.create(&PostParams::default(), &crd(&name))
        .await
        .expect("create the CRD");
    until(30, "the CRD is not Established", || async {
        crds.get(&name).await.is_ok_and(|c| {
            c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
    })
    .await;
    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let (resource, _) = kube::discovery::pinned_kind(&t.client, &gvk)
        .await
        .expect("an established CRD is discovered");
    let widgets: Api<DynamicObject> = Api::namespaced_with(t.client.clone(), &t.ns, &resource);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}}))
    .expect("widget");
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("create a widget");
    assert_eq!(
        widgets
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );

    let version = t.client.apiserver_version().await.expect("/version");
    assert_eq!(version.major, "1");

    crds.delete(&name, &DeleteParams::default())
        .await
        .expect("delete the CRD");
    until(60, "the CRD is still there", || async {
        crds.get_opt(&name).await.is_ok_and(|c| c.is_none())
    })
    .await;
    until(30, "widgets are still served", || async {
        matches!(widgets.list(&ListParams::default()).await, Err(kube::Error::Api(ref s)) if s.code == 404)
    })
    .await;
}

#[tokio::test]
async fn access_reviews_answer_for_the_caller() {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };

    let t = Target::start("reviews").await;
    let reviews: Api<SelfSubjectAccessReview> = Api::all(t.client.clone());
    let ask = |resource: &str| SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(t.ns.clone()),
                verb: Some("create".into()),
                group: Some("".into()),
                resource: Some(resource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let allowed = |r: SelfSubjectAccessReview| r.status.is_some_and(|s| s.allowed);
    let answer = reviews
        .create(&PostParams::default(), &ask("configmaps"))
        .await
        .expect("review");
    assert!(
        allowed(answer),
        "the conformance user may create config maps"
    );
    // Only the fake can be told to deny.
    if let Some(fake) = &t.fake {
        fake.deny("create", "", "configmaps");
        let answer = reviews
            .create(&PostParams::default(), &ask("configmaps"))
            .await
            .expect("review");
        assert!(!allowed(answer), "denied");
    }
}
