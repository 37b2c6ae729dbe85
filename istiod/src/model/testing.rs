//! Object builders for tests (objects are decoded from JSON, as the source would).

use mesh_api::Object;
use serde_json::{json, Value};

/// Decodes one object; panics with the decoding error.
pub(crate) fn obj(v: Value) -> Object {
    Object::from_value(v).expect("test object must decode")
}

/// A running, ready pod with one IP on node `node-1`.
pub(crate) fn pod(ns: &str, name: &str, ip: &str, labels: Value) -> Object {
    obj(pod_json(ns, name, ip, labels))
}

pub(crate) fn pod_json(ns: &str, name: &str, ip: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "nodeName": "node-1",
            "serviceAccountName": "sa",
            "containers": [{"name": "app", "ports": [{"name": "http-web", "containerPort": 8080}]}],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

pub(crate) fn namespace(name: &str, labels: Value) -> Object {
    obj(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
    }))
}

pub(crate) fn service(ns: &str, name: &str, selector: Value, cluster_ip: &str) -> Object {
    obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": selector,
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http-web"},
                {"name": "tcp", "port": 9000, "targetPort": 9001},
                {"name": "grpc-x", "port": 9090},
            ],
        },
    }))
}

pub(crate) fn authz(ns: &str, name: &str, spec: Value) -> Object {
    obj(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
}

pub(crate) fn peer_auth(ns: &str, name: &str, spec: Value) -> Object {
    obj(json!({
        "apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": spec,
    }))
}
