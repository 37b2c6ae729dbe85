//! Wire checks: the encoded bytes carry Istio's field numbers.

use prost::Message;

use crate::{security, workload};

/// Returns the (field number, wire type) of every top-level field in an encoded message.
fn tags(mut buf: &[u8]) -> Vec<(u32, u8)> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = prost::encoding::decode_varint(&mut buf).expect("varint key");
        let (field, wire) = ((key >> 3) as u32, (key & 7) as u8);
        out.push((field, wire));
        match wire {
            0 => {
                prost::encoding::decode_varint(&mut buf).expect("varint");
            }
            2 => {
                let len = prost::encoding::decode_varint(&mut buf).expect("len") as usize;
                buf = &buf[len..];
            }
            5 => buf = &buf[4..],
            1 => buf = &buf[8..],
            other => panic!("unexpected wire type {other}"),
        }
    }
    out
}

#[test]
fn workload_field_numbers_match_istio() {
    let w = workload::Workload {
        uid: "Kubernetes//Pod/ns/a".into(),
        name: "a".into(),
        namespace: "ns".into(),
        addresses: vec![vec![10, 0, 0, 1]],
        hostname: "h".into(),
        network: "n".into(),
        tunnel_protocol: workload::TunnelProtocol::Hbone as i32,
        trust_domain: "td".into(),
        service_account: "sa".into(),
        node: "node1".into(),
        canonical_name: "c".into(),
        canonical_revision: "v1".into(),
        workload_type: workload::WorkloadType::Pod as i32,
        workload_name: "wn".into(),
        native_tunnel: true,
        authorization_policies: vec!["ns/p".into()],
        status: workload::WorkloadStatus::Unhealthy as i32,
        cluster_id: "Kubernetes".into(),
        network_mode: workload::NetworkMode::HostNetwork as i32,
        capacity: Some(3),
        ..Default::default()
    };
    let fields: Vec<u32> = tags(&w.encode_to_vec()).into_iter().map(|t| t.0).collect();
    for n in [
        20, 1, 2, 3, 21, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 16, 17, 18, 25, 27,
    ] {
        assert!(fields.contains(&n), "field {n} missing from {fields:?}");
    }
    let a = workload::Address {
        r#type: Some(workload::address::Type::Workload(w)),
    };
    assert_eq!(tags(&a.encode_to_vec()), vec![(1, 2)]);
}

#[test]
fn service_and_gateway_field_numbers_match_istio() {
    let s = workload::Service {
        name: "s".into(),
        namespace: "ns".into(),
        hostname: "s.ns.svc.cluster.local".into(),
        addresses: vec![workload::NetworkAddress {
            network: String::new(),
            address: vec![10, 96, 0, 1],
            length: None,
        }],
        ports: vec![workload::Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: workload::AppProtocol::Http11 as i32,
        }],
        subject_alt_names: vec!["x".into()],
        waypoint: Some(workload::GatewayAddress {
            destination: Some(workload::gateway_address::Destination::Hostname(
                workload::NamespacedHostname {
                    namespace: "ns".into(),
                    hostname: "wp".into(),
                },
            )),
            hbone_mtls_port: 15008,
        }),
        ip_families: workload::IpFamilies::Ipv4Only as i32,
        canonical: true,
        ingress_use_waypoint: true,
        visibility: workload::ServiceVisibility::NamespaceLocal as i32,
        ..Default::default()
    };
    let fields: Vec<u32> = tags(&s.encode_to_vec()).into_iter().map(|t| t.0).collect();
    assert_eq!(fields, vec![1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 14]);
}

#[test]
fn authorization_field_numbers_match_istio() {
    let m = security::Match {
        service_accounts: vec![security::ServiceAccountMatch {
            namespace: "ns".into(),
            service_account: "sa".into(),
        }],
        destination_ports: vec![80],
        ..Default::default()
    };
    let fields: Vec<u32> = tags(&m.encode_to_vec()).into_iter().map(|t| t.0).collect();
    assert_eq!(fields, vec![9, 11]);
    let rules = security::Rules { matches: vec![m] };
    assert_eq!(tags(&rules.encode_to_vec()), vec![(2, 2)]);
    let a = security::Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        scope: security::Scope::WorkloadSelector as i32,
        action: security::Action::Deny as i32,
        groups: vec![security::Group { rules: vec![rules] }],
        dry_run: true,
        extensions: vec![],
    };
    let fields: Vec<u32> = tags(&a.encode_to_vec()).into_iter().map(|t| t.0).collect();
    assert_eq!(fields, vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn zds_field_numbers_match_istio() {
    use workload::zds;
    let del = zds::WorkloadRequest {
        payload: Some(zds::workload_request::Payload::Del(zds::DelWorkload {
            uid: "u".into(),
        })),
    };
    let bytes = del.encode_to_vec();
    assert_eq!(tags(&bytes), vec![(2, 2)]);
    // DelWorkload.uid is field 2.
    assert_eq!(tags(&bytes[2..]), vec![(2, 2)]);
    let keep = zds::WorkloadRequest {
        payload: Some(zds::workload_request::Payload::Keep(zds::KeepWorkload {
            uid: "u".into(),
        })),
    };
    assert_eq!(tags(&keep.encode_to_vec()), vec![(5, 2)]);
    let hello = zds::ZdsHello {
        version: zds::Version::V1 as i32,
    };
    assert_eq!(hello.encode_to_vec(), vec![0x08, 0x01]);
}
