//! The fake API server driven by the real `kube` client and runtime watcher, as the mesh's
//! Kubernetes code will drive it.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use mesh_testutil::kube_api::{core_types, FakeApiServer, FakeToken};
use serde_json::json;

fn pod(name: &str, node: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }))
    .expect("pod")
}

async fn started() -> (FakeApiServer, Client) {
    let server = FakeApiServer::start(core_types()).await.expect("start");
    server
        .seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}))
        .expect("namespace");
    let c = server.client();
    (server, c)
}

#[tokio::test]
async fn writes_follow_the_api_servers_rules() {
    let (server, c) = started().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "shop");
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
    let other: Api<Pod> = Api::namespaced(c.clone(), "nowhere");
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
    // Apply needs a field manager and creates what is missing.
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
    assert!(matches!(no_manager, Err(kube::Error::Api(e)) if e.code == 400));
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
    pods.delete("c", &Default::default()).await.expect("delete");
    assert!(server.get("v1", "Pod", "shop", "c").is_none());
}

#[tokio::test]
async fn lists_select_and_paginate_over_one_snapshot() {
    let (_server, c) = started().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "shop");
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
        .list(&ListParams::default().fields("spec.nodeName=node1"))
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
    let (server, c) = started().await;
    server.set_bookmark_interval(Duration::from_millis(100));
    let pods: Api<Pod> = Api::namespaced(c.clone(), "shop");
    let a = pods
        .create(&PostParams::default(), &pod("a", "node1", "web"))
        .await
        .expect("a");
    let rv = a.metadata.resource_version.clone().expect("rv");
    pods.create(&PostParams::default(), &pod("b", "node2", "web"))
        .await
        .expect("b");
    // From a's version: b's creation is replayed, then a bookmark comes.
    let mut stream = pods
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut saw_b = false;
    let mut saw_bookmark = false;
    while let Ok(Ok(Some(ev))) =
        tokio::time::timeout(Duration::from_secs(3), stream.try_next()).await
    {
        match ev {
            WatchEvent::Added(p) => saw_b |= p.metadata.name.as_deref() == Some("b"),
            WatchEvent::Bookmark(_) => {
                saw_bookmark = true;
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_b && saw_bookmark);
    // A label change out of a selected watch is a DELETED for that watch.
    let mut web = pods
        .watch(
            &WatchParams::default().labels("app=web").timeout(5),
            &server.resource_version().to_string(),
        )
        .await
        .expect("watch")
        .boxed();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .expect("relabel");
    let ev = tokio::time::timeout(Duration::from_secs(3), web.try_next()).await;
    assert!(matches!(ev, Ok(Ok(Some(WatchEvent::Deleted(_))))), "{ev:?}");
    // After compaction, the old version is gone: an ERROR event with 410.
    server.compact();
    let mut old = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(3), old.try_next()).await;
    assert!(
        matches!(&ev, Ok(Ok(Some(WatchEvent::Error(e)))) if e.code == 410),
        "{ev:?}"
    );
}

#[tokio::test]
async fn the_runtime_watcher_lists_watches_and_relists_after_410() {
    let (server, c) = started().await;
    // No bookmark may move the watcher's version past the compaction below.
    server.set_bookmark_interval(Duration::from_secs(600));
    let pods: Api<Pod> = Api::namespaced(c.clone(), "shop");
    pods.create(&PostParams::default(), &pod("a", "node1", "web"))
        .await
        .expect("a");
    pods.create(&PostParams::default(), &pod("elsewhere", "node2", "web"))
        .await
        .expect("b");
    let config = watcher::Config::default().fields("spec.nodeName=node1");
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
    pods.delete("a", &Default::default())
        .await
        .expect("delete a");
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
    let _ = Api::<Namespace>::all(c);
}

#[tokio::test]
async fn token_reviews_check_audience_and_the_bound_pod() {
    let (server, c) = started().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "shop");
    let p = pods
        .create(&PostParams::default(), &pod("ztunnel-1", "node1", "z"))
        .await
        .expect("pod");
    let uid = p.metadata.uid.clone().expect("uid");
    server.add_token(
        "good",
        FakeToken {
            namespace: "shop".into(),
            service_account: "ztunnel".into(),
            audiences: vec!["istio-ca".into()],
            pod: Some(("ztunnel-1".into(), uid)),
            user: None,
        },
    );
    let reviews: Api<TokenReview> = Api::all(c.clone());
    let review = |token: &str, aud: &str| TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.into()),
            audiences: Some(vec![aud.into()]),
        },
        ..TokenReview::default()
    };
    let ok = reviews
        .create(&PostParams::default(), &review("good", "istio-ca"))
        .await
        .expect("review");
    let status = ok.status.expect("status");
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.expect("user");
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:shop:ztunnel")
    );
    assert!(user
        .extra
        .expect("extra")
        .contains_key("authentication.kubernetes.io/pod-name"));
    let wrong = reviews
        .create(&PostParams::default(), &review("good", "kubernetes"))
        .await
        .expect("review");
    assert_eq!(wrong.status.and_then(|s| s.authenticated), Some(false));
    let unknown = reviews
        .create(&PostParams::default(), &review("nope", "istio-ca"))
        .await
        .expect("review");
    assert_eq!(unknown.status.and_then(|s| s.authenticated), Some(false));
    // Once its pod is deleted, the bound token no longer authenticates.
    pods.delete("ztunnel-1", &Default::default())
        .await
        .expect("delete");
    let gone = reviews
        .create(&PostParams::default(), &review("good", "istio-ca"))
        .await
        .expect("review");
    assert_eq!(gone.status.and_then(|s| s.authenticated), Some(false));
    assert!(server.requests().iter().any(|r| r.contains("tokenreviews")));
}
