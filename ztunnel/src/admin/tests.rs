use std::net::SocketAddr;

use mesh_proto::workload::{address, Address, Workload};
use mesh_runtime::http::BoundServer;
use mesh_runtime::signal;
use mesh_testutil::HttpResponse;
use prost::Message;

use super::*;

async fn request(addr: SocketAddr, method: &str, path: &str) -> HttpResponse {
    mesh_testutil::http_call(addr, method, path, std::time::Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

async fn serve(router: Router) -> (SocketAddr, signal::ShutdownTrigger) {
    let (trigger, shutdown) = signal::channel();
    let server = BoundServer::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = server.local_addr();
    tokio::spawn(server.serve(router, shutdown));
    (addr, trigger)
}

#[tokio::test]
async fn config_dump_shows_state_and_config_and_quit_triggers_shutdown() {
    let state = SharedState::default();
    let addr = Address {
        r#type: Some(address::Type::Workload(Workload {
            uid: "Kubernetes//Pod/demo/client".into(),
            name: "client".into(),
            namespace: "demo".into(),
            addresses: vec![vec![10, 244, 1, 11]],
            ..Default::default()
        })),
    };
    crate::xds::Handler::apply(
        &state,
        mesh_proto::type_url::ADDRESS,
        &[("Kubernetes//Pod/demo/client".into(), addr.encode_to_vec())],
        &[],
    )
    .expect("applied");
    let config = Config::from_vars(Vec::<(String, String)>::new()).expect("defaults");
    let (trigger, shutdown) = signal::channel();
    let view = AdminView {
        config: Arc::new(config),
        state,
        certs: None,
        shutdown: Arc::new(trigger),
        inpod: None,
        logging: None,
    };
    let (admin, _stop) = serve(admin_router(view)).await;

    let resp = request(admin, "GET", "/config_dump").await;
    let dump: serde_json::Value = serde_json::from_str(&resp.body).expect("json");
    assert_eq!(
        dump["workloads"].as_array().map(Vec::len),
        Some(1),
        "{dump}"
    );
    assert!(
        resp.body.contains("10.244.1.11"),
        "IPs as strings: {resp:?}"
    );
    assert!(
        dump["config"].is_object() && dump["certificates"].is_array(),
        "{dump}"
    );
    // Every top-level section upstream's dump has.
    let keys: Vec<&str> = dump
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        [
            "certificates",
            "config",
            "policies",
            "services",
            "stagedServices",
            "staticConfig",
            "version",
            "workloadState",
            "workloads"
        ],
        "{dump}"
    );
    assert!(dump["workloadState"].is_object(), "{dump}");
    assert!(dump["stagedServices"].is_object(), "{dump}");

    assert!(!shutdown.requested());
    let resp = request(admin, "POST", "/quitquitquit").await;
    assert!(resp.status == 200, "{resp:?}");
    assert!(shutdown.requested(), "quitquitquit requests shutdown");
}

#[tokio::test]
async fn readiness_is_503_until_every_condition_is_met() {
    let readiness = Readiness::new();
    readiness.register("xds");
    let (addr, _stop) = serve(readiness_router(readiness.clone())).await;
    let resp = request(addr, "GET", "/healthz/ready").await;
    assert!(resp.status == 503 && resp.body.contains("xds"), "{resp:?}");
    readiness.mark_ready("xds");
    let resp = request(addr, "GET", "/healthz/ready").await;
    assert_eq!(resp.status, 200, "{resp:?}");
}
