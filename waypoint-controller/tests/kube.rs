//! The waypoint controller on the Kubernetes API (the fake API server): a Gateway of class
//! istio-waypoint gets its ServiceAccount, Deployment and Service by server-side apply, owned
//! by the Gateway; its status follows the Deployment; a deleted Gateway's objects go; an object
//! the controller does not manage is left alone.

use std::time::Duration;

use mesh_source::{KubeSource, KubeWriter};
use mesh_testutil::kube_api::{core_types, mesh_crd_types, FakeApiServer};
use serde_json::{json, Value};
use waypoint_controller::render::{MANAGED_LABEL, MANAGED_VALUE};
use waypoint_controller::run::run;
use waypoint_controller::{kube_watches, ControllerOptions, FIELD_MANAGER};

const WAIT: Duration = Duration::from_secs(10);

fn gateway(name: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}})
}

async fn eventually(f: impl FnMut() -> bool) -> bool {
    mesh_testutil::eventually(WAIT, f).await
}

fn condition(gw: &Value, type_: &str) -> Option<(String, String)> {
    gw["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

#[tokio::test]
async fn gateways_become_waypoints_through_the_api() {
    let mut types = core_types();
    types.extend(mesh_crd_types());
    let api = FakeApiServer::start(types).await.expect("fake API server");
    api.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}))
        .expect("namespace");
    api.seed(gateway("waypoint")).expect("gateway");
    // Somebody else's ServiceAccount under the name a second Gateway will need.
    api.seed(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "taken", "namespace": "shop"}}))
        .expect("sa");
    api.seed(gateway("taken")).expect("gateway");

    let client = api.client();
    let source = KubeSource::new(client.clone(), kube_watches());
    let writer = KubeWriter::new(client, FIELD_MANAGER, (MANAGED_LABEL, MANAGED_VALUE));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run(
        Box::new(source),
        writer,
        ControllerOptions::default(),
        async move {
            let _ = stop_rx.await;
        },
    ));

    let get = |kind: &str, name: &str| {
        let v = if kind == "Deployment" {
            "apps/v1"
        } else {
            "v1"
        };
        api.get(v, kind, "shop", name)
    };
    assert!(
        eventually(|| ["ServiceAccount", "Deployment", "Service"]
            .iter()
            .all(|k| get(k, "waypoint").is_some()))
        .await,
        "the waypoint's objects are created"
    );
    let gw_uid = api
        .get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "shop",
            "waypoint",
        )
        .expect("gateway")["metadata"]["uid"]
        .clone();
    for kind in ["ServiceAccount", "Deployment", "Service"] {
        let o = get(kind, "waypoint").expect("object");
        assert_eq!(
            o["metadata"]["labels"][MANAGED_LABEL], MANAGED_VALUE,
            "{kind}"
        );
        let owner = &o["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Gateway", "{kind}");
        assert_eq!(owner["uid"], gw_uid, "{kind} owned by the Gateway's uid");
    }
    // The API server allocates the ClusterIP; the controller never sets one.
    let svc = get("Service", "waypoint").expect("service");
    assert!(svc["spec"]["clusterIP"].is_null(), "{svc}");

    // Status: accepted, not programmed until the Deployment has a ready pod.
    let gw = || {
        api.get(
            "gateway.networking.k8s.io/v1",
            "Gateway",
            "shop",
            "waypoint",
        )
    };
    assert!(
        eventually(|| gw()
            .and_then(|g| condition(&g, "Accepted"))
            .is_some_and(|(s, _)| s == "True"))
        .await
    );
    let programmed = condition(&gw().expect("gw"), "Programmed").expect("programmed");
    assert_eq!(programmed.0, "False", "{programmed:?}");

    // What the API server and the Deployment controller would do.
    let mut svc = svc;
    svc["spec"]["clusterIP"] = json!("10.96.0.42");
    api.seed(svc).expect("allocate");
    let mut dep = get("Deployment", "waypoint").expect("deployment");
    dep["status"] = json!({"replicas": 1, "readyReplicas": 1, "availableReplicas": 1});
    api.seed(dep).expect("ready");
    assert!(
        eventually(|| gw().is_some_and(|g| {
            condition(&g, "Programmed").is_some_and(|(s, _)| s == "True")
                && g["status"]["addresses"][0]["value"] == "10.96.0.42"
        }))
        .await,
        "programmed with the Service's address: {:?}",
        gw().map(|g| g["status"].clone())
    );

    // The other Gateway's ServiceAccount is somebody else's: left alone and reported.
    assert!(get("ServiceAccount", "taken").expect("sa")["metadata"]["labels"].is_null());
    let taken = || api.get("gateway.networking.k8s.io/v1", "Gateway", "shop", "taken");
    assert!(
        eventually(|| taken()
            .and_then(|g| condition(&g, "Programmed"))
            .is_some_and(|(s, _)| s == "False"))
        .await
    );

    // The Gateway goes: so do its objects (the controller deletes what it manages).
    api.remove(&gateway("waypoint")).expect("remove gateway");
    assert!(
        eventually(|| ["ServiceAccount", "Deployment", "Service"]
            .iter()
            .all(|k| get(k, "waypoint").is_none()))
        .await,
        "the deleted Gateway's objects are gone"
    );
    assert!(get("ServiceAccount", "taken").is_some(), "not ours: kept");

    let _ = stop_tx.send(());
    controller
        .await
        .expect("controller task")
        .expect("stops cleanly");
}
