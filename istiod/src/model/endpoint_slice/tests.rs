//! Hand-made endpoints through the model: workloads for non-pod endpoints, ports by name,
//! following the Service, bad addresses named.

use mesh_api::{Kind, ObjectKey};
use mesh_proto::workload::{address, Address, NetworkMode, Workload, WorkloadStatus};
use prost::Message;
use serde_json::json;

use crate::model::testing::obj;
use crate::model::{Model, ModelConfig, Snapshot};

fn service(ports: serde_json::Value) -> mesh_api::Object {
    obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.40", "ports": ports},
    }))
}

fn slice(endpoints: serde_json::Value) -> mesh_api::Object {
    obj(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "db-manual", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"},
                  {"name": "metrics", "port": 9187, "protocol": "UDP"}],
        "endpoints": endpoints,
    }))
}

fn workload(s: &Snapshot, uid: &str) -> Option<Workload> {
    let r = s.addresses().get(uid)?;
    match Address::decode(r.body.value.as_slice()).ok()?.r#type {
        Some(address::Type::Workload(w)) => Some(w),
        _ => None,
    }
}

const UID: &str = "Kubernetes/discovery.k8s.io/EndpointSlice/shop/db-manual/192.168.9.1";

#[test]
fn hand_made_endpoints_become_workloads_of_their_service() {
    let mut m = Model::new(ModelConfig::default());
    m.apply(slice(json!([
        {"addresses": ["192.168.9.1"]},
        {"addresses": ["192.168.9.2"], "conditions": {"ready": false}},
        {"addresses": ["10.244.0.7"], "targetRef": {"kind": "Pod", "namespace": "shop", "name": "db-0"}},
        {"addresses": ["not-an-ip"]},
    ])));
    let s = m.build();
    assert!(workload(&s, UID).is_none(), "no Service yet: nothing");

    m.apply(service(
        json!([{"name": "pg", "port": 5432, "targetPort": 5432},
                           {"name": "metrics", "port": 9187}]),
    ));
    let s = m.build();
    let w = workload(&s, UID).expect("a workload for the hand-made endpoint");
    assert_eq!(w.name, "db-manual");
    assert_eq!(w.namespace, "shop");
    assert_eq!(w.addresses, vec![vec![192, 168, 9, 1]]);
    assert_eq!(w.network_mode, NetworkMode::HostNetwork as i32);
    assert_eq!(w.status, WorkloadStatus::Healthy as i32);
    assert!(w.service_account.is_empty());
    let ports = &w.services["shop/db.shop.svc.cluster.local"].ports;
    assert_eq!(
        ports
            .iter()
            .map(|p| (p.service_port, p.target_port))
            .collect::<Vec<_>>(),
        vec![(5432, 5432)],
        "TCP ports matched by name"
    );
    let unready = workload(
        &s,
        "Kubernetes/discovery.k8s.io/EndpointSlice/shop/db-manual/192.168.9.2",
    )
    .expect("unready endpoint");
    assert_eq!(unready.status, WorkloadStatus::Unhealthy as i32);
    assert!(
        s.addresses().keys().all(|k| !k.ends_with("/10.244.0.7")),
        "pod endpoints are the pods' business"
    );
    let bad = s
        .errors()
        .iter()
        .map(|e| e.to_string())
        .find(|e| e.contains("not-an-ip"));
    assert!(
        bad.is_some_and(|e| e.contains("EndpointSlice shop/db-manual")),
        "{:?}",
        s.errors()
    );
    // Two of them share nothing exclusively: the same IP on a pod is no conflict.
    m.apply(crate::model::testing::pod(
        "shop",
        "other",
        "192.168.9.1",
        json!({}),
    ));
    let s = m.build();
    assert!(workload(&s, UID).is_some());
    assert!(
        !s.errors().iter().any(|e| e.reason() == "ip_conflict"),
        "{:?}",
        s.errors()
    );

    // The Service's port renamed: the endpoint's port goes; the Service gone: the workload goes.
    m.apply(service(json!([{"name": "postgres", "port": 5432}])));
    let s = m.build();
    assert!(
        workload(&s, UID).expect("still there").services["shop/db.shop.svc.cluster.local"]
            .ports
            .is_empty()
    );
    m.delete(&ObjectKey::new(Kind::Service, "shop", "db"));
    let s = m.build();
    assert!(workload(&s, UID).is_none());
}
