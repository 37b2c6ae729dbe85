use mesh_api::Object;
use mesh_proto::workload::gateway_address;
use serde_json::json;

use super::*;
use crate::model::testing::{namespace, obj, service};

fn ns(labels: serde_json::Value) -> Namespace {
    match namespace("ns", labels) {
        Object::Namespace(n) => *n,
        other => panic!("not a namespace: {other:?}"),
    }
}

#[test]
fn kubernetes_service() {
    let Object::Service(svc) = service("ns", "web", json!({"app": "web"}), "10.96.0.10") else {
        panic!("service");
    };
    let s = service_to_service(&ModelConfig::default(), Some(&ns(json!({}))), &svc).expect("ok");
    assert_eq!(s.hostname, "web.ns.svc.cluster.local");
    assert_eq!((s.name.as_str(), s.namespace.as_str()), ("web", "ns"));
    assert_eq!(s.addresses[0].address, vec![10, 96, 0, 10]);
    let ports: Vec<(u32, u32)> = s
        .ports
        .iter()
        .map(|p| (p.service_port, p.target_port))
        .collect();
    assert_eq!(ports, vec![(80, 0), (9000, 9001), (9090, 9090)]);
    assert!(s.waypoint.is_none());
}

#[test]
fn headless_service_and_waypoint_labels() {
    let Object::Service(mut svc) = service("ns", "db", json!({}), "None") else {
        panic!("service");
    };
    let s = service_to_service(&ModelConfig::default(), None, &svc).expect("ok");
    assert!(s.addresses.is_empty());
    let ns_wp = ns(json!({"istio.io/use-waypoint": "nswp"}));
    let s = service_to_service(&ModelConfig::default(), Some(&ns_wp), &svc).expect("ok");
    let Some(gateway_address::Destination::Hostname(h)) = s.waypoint.and_then(|w| w.destination)
    else {
        panic!("waypoint expected");
    };
    assert_eq!(h.hostname, "nswp.ns.svc.cluster.local");
    svc.metadata.labels = Some([("istio.io/use-waypoint".to_string(), "none".to_string())].into());
    let s = service_to_service(&ModelConfig::default(), Some(&ns_wp), &svc).expect("ok");
    assert!(s.waypoint.is_none(), "service opt-out wins over namespace");
}

#[test]
fn ip_families_table() {
    let cases = [
        (vec!["IPv4"], IpFamilies::Ipv4Only),
        (vec!["IPv6"], IpFamilies::Ipv6Only),
        (vec!["IPv4", "IPv6"], IpFamilies::Dual),
        (vec![], IpFamilies::Automatic),
    ];
    for (fams, want) in cases {
        let fams: Vec<String> = fams.into_iter().map(String::from).collect();
        assert_eq!(ip_families(&fams), want);
    }
}

#[test]
fn app_protocol_table() {
    assert_eq!(app_protocol(Some("http"), "tcp"), AppProtocol::Http11);
    assert_eq!(
        app_protocol(Some("kubernetes.io/h2c"), ""),
        AppProtocol::Http2
    );
    assert_eq!(app_protocol(None, "grpc-api"), AppProtocol::Grpc);
    assert_eq!(app_protocol(None, "http2"), AppProtocol::Http2);
    assert_eq!(app_protocol(None, "redis"), AppProtocol::Unknown);
}

#[test]
fn service_entry_one_service_per_host_and_invalid_address_reported() {
    let Object::ServiceEntry(se) = obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "ext", "namespace": "ns"},
        "spec": {
            "hosts": ["a.example.com", "b.example.com"],
            "addresses": ["240.0.0.1", "240.1.0.0/16", "not-an-ip"],
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
        },
    })) else {
        panic!("service entry");
    };
    let (svcs, errors) = service_entry_to_services(&ModelConfig::default(), None, &se);
    assert_eq!(svcs.len(), 2);
    assert_eq!(svcs[1].hostname, "b.example.com");
    assert_eq!(svcs[0].addresses.len(), 2);
    assert_eq!(svcs[0].addresses[1].length, Some(16));
    assert_eq!(errors.len(), 1);
    let msg = errors[0].to_string();
    assert!(
        msg.contains("ServiceEntry ns/ext") && msg.contains("spec.addresses[2]"),
        "{msg}"
    );
}
