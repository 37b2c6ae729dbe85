use mesh_api::{Namespace, Object, Service};
use mesh_proto::workload::AppProtocol;
use serde_json::{json, Value};

use super::*;
use crate::model::testing::{namespace, obj, pod_json, service};

fn cfg() -> ModelConfig {
    ModelConfig::default()
}

fn as_pod(v: Value) -> Pod {
    match obj(v) {
        Object::Pod(p) => *p,
        other => panic!("not a pod: {other:?}"),
    }
}

fn ns_obj(labels: Value) -> Namespace {
    match namespace("ns", labels) {
        Object::Namespace(n) => *n,
        other => panic!("not a namespace: {other:?}"),
    }
}

fn convert(pod: Value, ns_labels: Value, services: &[&Service]) -> Workload {
    let ns = ns_obj(ns_labels);
    let c = cfg();
    let inp = WorkloadInputs {
        cfg: &c,
        namespace: Some(&ns),
        services,
        service_entries: &[],
        policies: &[],
        node: None,
    };
    pod_to_workload(&inp, &as_pod(pod))
        .expect("valid pod")
        .expect("pod has a workload")
}

fn base() -> Value {
    pod_json("ns", "p", "10.0.0.1", json!({}))
}

fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let target = v.pointer_mut(parent).expect("parent exists");
    target[key] = value;
    v
}

#[test]
fn basic_fields() {
    let w = convert(base(), json!({}), &[]);
    assert_eq!(w.uid, "Kubernetes//Pod/ns/p");
    assert_eq!(w.name, "p");
    assert_eq!(w.namespace, "ns");
    assert_eq!(w.addresses, vec![vec![10, 0, 0, 1]]);
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.service_account, "sa");
    assert_eq!(w.node, "node-1");
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.network, "");
    assert_eq!(w.status, WorkloadStatus::Healthy as i32);
    assert_eq!(w.network_mode, NetworkMode::Standard as i32);
    assert_eq!(w.canonical_name, "p");
    assert_eq!(w.canonical_revision, "latest");
    assert_eq!(w.workload_type, WorkloadType::Pod as i32);
    assert!(w.waypoint.is_none());
}

#[test]
fn ambient_enrollment_table() {
    let sidecar = json!({"sidecar.istio.io/status": "{}"});
    let cases: [(&str, Value, Value, Value, TunnelProtocol); 7] = [
        (
            "pod label",
            json!({"istio.io/dataplane-mode": "ambient"}),
            json!({}),
            json!({}),
            TunnelProtocol::Hbone,
        ),
        (
            "namespace label",
            json!({}),
            json!({"istio.io/dataplane-mode": "ambient"}),
            json!({}),
            TunnelProtocol::Hbone,
        ),
        (
            "pod opt-out",
            json!({"istio.io/dataplane-mode": "none"}),
            json!({"istio.io/dataplane-mode": "ambient"}),
            json!({}),
            TunnelProtocol::None,
        ),
        (
            "sidecar pod label",
            json!({"istio.io/dataplane-mode": "ambient"}),
            json!({}),
            sidecar.clone(),
            TunnelProtocol::None,
        ),
        (
            "sidecar ns label",
            json!({}),
            json!({"istio.io/dataplane-mode": "ambient"}),
            sidecar,
            TunnelProtocol::None,
        ),
        (
            "no labels",
            json!({}),
            json!({}),
            json!({}),
            TunnelProtocol::None,
        ),
        (
            "cni annotation",
            json!({}),
            json!({}),
            json!({"ambient.istio.io/redirection": "enabled"}),
            TunnelProtocol::Hbone,
        ),
    ];
    for (name, pod_labels, ns_labels, annotations, want) in cases {
        let p = with(base(), "/metadata/labels", pod_labels);
        let p = with(p, "/metadata/annotations", annotations);
        let w = convert(p, ns_labels, &[]);
        assert_eq!(w.tunnel_protocol, want as i32, "case {name}");
    }
}

#[test]
fn host_network_pod() {
    let p = with(base(), "/spec/hostNetwork", json!(true));
    let p = with(
        p,
        "/metadata/labels",
        json!({"istio.io/dataplane-mode": "ambient"}),
    );
    let w = convert(p, json!({}), &[]);
    assert_eq!(w.network_mode, NetworkMode::HostNetwork as i32);
    assert_eq!(w.tunnel_protocol, TunnelProtocol::None as i32);
}

#[test]
fn status_table() {
    let cases = [
        (
            "running ready",
            json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}),
            WorkloadStatus::Healthy,
        ),
        (
            "running not ready",
            json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "False"}]}),
            WorkloadStatus::Unhealthy,
        ),
        (
            "running no conditions",
            json!({"phase": "Running", "podIP": "10.0.0.1"}),
            WorkloadStatus::Healthy,
        ),
        (
            "pending with ip",
            json!({"phase": "Pending", "podIP": "10.0.0.1"}),
            WorkloadStatus::Unhealthy,
        ),
    ];
    for (name, status, want) in cases {
        let w = convert(with(base(), "/status", status), json!({}), &[]);
        assert_eq!(w.status, want as i32, "case {name}");
    }
}

#[test]
fn pods_without_workload() {
    let c = cfg();
    let inp = WorkloadInputs {
        cfg: &c,
        namespace: None,
        services: &[],
        service_entries: &[],
        policies: &[],
        node: None,
    };
    for status in [
        json!({"phase": "Pending"}),
        json!({"phase": "Succeeded", "podIP": "10.0.0.1"}),
        json!({"phase": "Failed", "podIP": "10.0.0.1"}),
    ] {
        let p = as_pod(with(base(), "/status", status.clone()));
        assert_eq!(
            pod_to_workload(&inp, &p).expect("no error"),
            None,
            "{status}"
        );
    }
    let bad = as_pod(with(
        base(),
        "/status",
        json!({"phase": "Running", "podIP": "nope"}),
    ));
    let err = pod_to_workload(&inp, &bad).expect_err("invalid IP");
    assert_eq!(err.reason(), "invalid_address");
    assert!(err.to_string().contains("Pod ns/p"), "{err}");
}

#[test]
fn dual_stack_addresses_from_pod_ips() {
    let p = with(
        base(),
        "/status/podIPs",
        json!([{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]),
    );
    let w = convert(p, json!({}), &[]);
    assert_eq!(w.addresses.len(), 2);
    assert_eq!(w.addresses[1].len(), 16);
}

#[test]
fn workload_type_table() {
    let rs = |name: &str| json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": "u", "controller": true}]);
    let job = |name: &str| json!([{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u", "controller": true}]);
    let sts = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u", "controller": true}]);
    let cases = [
        (
            "deployment",
            rs("web-5d8f9c"),
            json!({"pod-template-hash": "5d8f9c"}),
            "web",
            WorkloadType::Deployment,
        ),
        (
            "bare replicaset",
            rs("web-rs"),
            json!({}),
            "p",
            WorkloadType::Pod,
        ),
        (
            "job",
            job("batch-x"),
            json!({}),
            "batch-x",
            WorkloadType::Job,
        ),
        (
            "cronjob",
            job("nightly-28391234"),
            json!({}),
            "nightly",
            WorkloadType::Cronjob,
        ),
        ("statefulset", sts, json!({}), "p", WorkloadType::Pod),
        ("no owner", json!([]), json!({}), "p", WorkloadType::Pod),
    ];
    for (name, owners, labels, want_name, want_type) in cases {
        let p = with(base(), "/metadata/ownerReferences", owners);
        let p = with(p, "/metadata/labels", labels);
        let w = convert(p, json!({}), &[]);
        assert_eq!(
            (w.workload_name.as_str(), w.workload_type),
            (want_name, want_type as i32),
            "case {name}"
        );
    }
}

#[test]
fn canonical_label_precedence() {
    let cases = [
        (
            json!({"service.istio.io/canonical-name": "c", "app.kubernetes.io/name": "k", "app": "a"}),
            "c",
        ),
        (json!({"app.kubernetes.io/name": "k", "app": "a"}), "k"),
        (json!({"app": "a"}), "a"),
        (json!({}), "p"),
    ];
    for (labels, want) in cases {
        let w = convert(
            with(base(), "/metadata/labels", labels.clone()),
            json!({}),
            &[],
        );
        assert_eq!(w.canonical_name, want, "{labels}");
    }
    let revs = [
        (
            json!({"service.istio.io/canonical-revision": "c", "app.kubernetes.io/version": "k", "version": "v"}),
            "c",
        ),
        (
            json!({"app.kubernetes.io/version": "k", "version": "v"}),
            "k",
        ),
        (json!({"version": "v"}), "v"),
        (json!({}), "latest"),
    ];
    for (labels, want) in revs {
        let w = convert(
            with(base(), "/metadata/labels", labels.clone()),
            json!({}),
            &[],
        );
        assert_eq!(w.canonical_revision, want, "{labels}");
    }
}

fn waypoint_host(w: &Workload) -> Option<(String, String, u32)> {
    let g = w.waypoint.as_ref()?;
    match &g.destination {
        Some(gateway_address::Destination::Hostname(h)) => {
            Some((h.namespace.clone(), h.hostname.clone(), g.hbone_mtls_port))
        }
        other => panic!("unexpected waypoint destination {other:?}"),
    }
}

#[test]
fn waypoint_label_table() {
    let wp = |ns: &str, name: &str| {
        Some((
            ns.to_string(),
            format!("{name}.{ns}.svc.cluster.local"),
            15008,
        ))
    };
    let cases = [
        (
            "pod label",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({}),
            wp("ns", "wp"),
        ),
        (
            "ns label",
            json!({}),
            json!({"istio.io/use-waypoint": "nwp"}),
            wp("ns", "nwp"),
        ),
        (
            "pod wins",
            json!({"istio.io/use-waypoint": "wp"}),
            json!({"istio.io/use-waypoint": "nwp"}),
            wp("ns", "wp"),
        ),
        (
            "pod opt-out",
            json!({"istio.io/use-waypoint": "none"}),
            json!({"istio.io/use-waypoint": "nwp"}),
            None,
        ),
        (
            "other namespace",
            json!({"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra"}),
            json!({}),
            wp("infra", "wp"),
        ),
        (
            "ns label other namespace",
            json!({}),
            json!({"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra"}),
            wp("infra", "wp"),
        ),
        ("none", json!({}), json!({}), None),
    ];
    for (name, pod_labels, ns_labels, want) in cases {
        let w = convert(with(base(), "/metadata/labels", pod_labels), ns_labels, &[]);
        assert_eq!(waypoint_host(&w), want, "case {name}");
    }
}

#[test]
fn network_label_table() {
    let cases = [
        (
            json!({"topology.istio.io/network": "pn"}),
            json!({"topology.istio.io/network": "nn"}),
            "pn",
        ),
        (json!({}), json!({"topology.istio.io/network": "nn"}), "nn"),
        (json!({}), json!({}), ""),
    ];
    for (pl, nl, want) in cases {
        let w = convert(with(base(), "/metadata/labels", pl), nl, &[]);
        assert_eq!(w.network, want);
    }
}

#[test]
fn service_ports_resolve_named_numeric_and_absent_target_ports() {
    let Object::Service(svc) = service("ns", "web", json!({"app": "web"}), "10.96.0.10") else {
        panic!("service");
    };
    let w = convert(base(), json!({}), &[&svc]);
    let ports = &w.services["ns/web.ns.svc.cluster.local"].ports;
    let got: Vec<(u32, u32, i32)> = ports
        .iter()
        .map(|p| (p.service_port, p.target_port, p.app_protocol))
        .collect();
    assert_eq!(
        got,
        vec![
            (80, 8080, AppProtocol::Http11 as i32),
            (9000, 9001, AppProtocol::Unknown as i32),
            (9090, 9090, AppProtocol::Grpc as i32),
        ]
    );
}

#[test]
fn named_target_port_missing_on_pod_leaves_port_out() {
    let Object::Service(svc) = service("ns", "web", json!({"app": "web"}), "10.96.0.10") else {
        panic!("service");
    };
    let p = with(base(), "/spec/containers", json!([{"name": "app"}]));
    let w = convert(p, json!({}), &[&svc]);
    let ports: Vec<u32> = w.services["ns/web.ns.svc.cluster.local"]
        .ports
        .iter()
        .map(|p| p.service_port)
        .collect();
    assert_eq!(ports, vec![9000, 9090]);
}

#[test]
fn policies_are_copied() {
    let c = cfg();
    let policies = vec!["ns/a".to_string(), "istio-system/b".to_string()];
    let inp = WorkloadInputs {
        cfg: &c,
        namespace: None,
        services: &[],
        service_entries: &[],
        policies: &policies,
        node: None,
    };
    let w = pod_to_workload(&inp, &as_pod(base()))
        .expect("ok")
        .expect("workload");
    assert_eq!(w.authorization_policies, policies);
}

#[test]
fn workload_entry_conversion() {
    let c = cfg();
    let inp = WorkloadInputs {
        cfg: &c,
        namespace: None,
        services: &[],
        service_entries: &[],
        policies: &[],
        node: None,
    };
    let spec: WorkloadEntrySpec = serde_json::from_value(json!({
        "address": "192.168.1.5", "network": "vm-net", "serviceAccount": "vm",
        "labels": {"app": "legacy", "istio.io/dataplane-mode": "ambient"},
        "locality": "us-east1/us-east1-a",
    }))
    .expect("spec");
    let uid = workload_entry_uid("Kubernetes", "ns", "vm1");
    assert_eq!(uid, "Kubernetes/networking.istio.io/WorkloadEntry/ns/vm1");
    let w = entry_to_workload(&inp, uid.clone(), "ns", "vm1", &spec, BTreeMap::new())
        .expect("ok")
        .expect("workload");
    assert_eq!(w.uid, uid);
    assert_eq!(w.addresses, vec![vec![192, 168, 1, 5]]);
    let loc = w.locality.clone().expect("locality");
    assert_eq!(
        (loc.region.as_str(), loc.zone.as_str(), loc.subzone.as_str()),
        ("us-east1", "us-east1-a", "")
    );
    assert_eq!(w.network, "vm-net");
    assert_eq!(w.service_account, "vm");
    assert_eq!(w.canonical_name, "legacy");
    assert_eq!(w.tunnel_protocol, TunnelProtocol::Hbone as i32);
}

#[test]
fn a_sidecar_that_takes_hbone_is_tunnelled_to() {
    // The injector's label for sidecars with ISTIO_META_ENABLE_HBONE: a list of protocols.
    for (value, hbone) in [
        ("http", true),
        ("tcp, http", true),
        ("tcp", false),
        ("", false),
    ] {
        let pod = with(
            base(),
            "/metadata/labels",
            json!({"networking.istio.io/tunnel": value}),
        );
        let w = convert(pod, json!({}), &[]);
        let want = if hbone {
            TunnelProtocol::Hbone
        } else {
            TunnelProtocol::None
        };
        assert_eq!(w.tunnel_protocol, want as i32, "{value:?}");
        assert_eq!(w.native_tunnel, hbone, "{value:?}");
    }
}
