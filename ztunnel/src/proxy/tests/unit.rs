//! Unit tests: endpoint choice, routing decisions, HBONE headers.

use std::net::{IpAddr, SocketAddr};

use mesh_proto::workload::{self as pb, address, gateway_address, load_balancing};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::fixture::{id, workload, HBONE_PORT};
use crate::proxy::route::{choose_endpoint, target_port, RouteError, Router, Upstream};
use crate::proxy::{baggage, forwarded_for};
use crate::state::State;

const SVC_KEY: &str = "default/echo.default.svc.cluster.local";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn endpoint(name: &str, addr: &str, healthy: bool, capacity: Option<u32>) -> pb::Workload {
    let mut w = workload(name, ip(addr), "echo", pb::TunnelProtocol::Hbone);
    w.status = if healthy { 0 } else { 1 };
    w.capacity = capacity;
    w.services.insert(
        SVC_KEY.to_string(),
        pb::PortList {
            ports: vec![pb::Port {
                service_port: 80,
                target_port: 8080,
                app_protocol: 0,
            }],
        },
    );
    w
}

fn service(lb: Option<pb::LoadBalancing>, waypoint: Option<pb::GatewayAddress>) -> pb::Service {
    pb::Service {
        name: "echo".into(),
        namespace: "default".into(),
        hostname: "echo.default.svc.cluster.local".into(),
        addresses: vec![pb::NetworkAddress {
            network: String::new(),
            address: octets(ip("10.96.0.10")),
            length: None,
        }],
        ports: vec![pb::Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: 0,
        }],
        subject_alt_names: vec!["spiffe://cluster.local/ns/default/sa/extra".into()],
        load_balancing: lb,
        waypoint,
        ..Default::default()
    }
}

fn state_with(workloads: Vec<pb::Workload>, services: Vec<pb::Service>) -> State {
    let mut s = State::new();
    for w in workloads {
        let uid = w.uid.clone();
        let a = pb::Address {
            r#type: Some(address::Type::Workload(w)),
        };
        s.apply_address_message(&uid, &a).expect("workload");
    }
    for svc in services {
        let key = format!("{}/{}", svc.namespace, svc.hostname);
        let a = pb::Address {
            r#type: Some(address::Type::Service(svc)),
        };
        s.apply_address_message(&key, &a).expect("service");
    }
    s
}

fn counts(state: &State, draws: usize) -> std::collections::BTreeMap<String, usize> {
    let svc = state.service(SVC_KEY).expect("service");
    let candidates = state.workloads_of_service(SVC_KEY);
    let mut rng = StdRng::seed_from_u64(7);
    let mut out = std::collections::BTreeMap::new();
    for _ in 0..draws {
        if let Some(w) = choose_endpoint(svc, &candidates, &mut rng) {
            *out.entry(w.name.clone()).or_insert(0) += 1;
        }
    }
    out
}

#[test]
fn endpoint_choice_skips_unhealthy_unless_allow_all() {
    let eps = vec![
        endpoint("up", "10.0.0.1", true, None),
        endpoint("down", "10.0.0.2", false, None),
    ];
    let only_healthy = state_with(eps.clone(), vec![service(None, None)]);
    assert_eq!(counts(&only_healthy, 50).get("down"), None);
    assert_eq!(counts(&only_healthy, 50).get("up"), Some(&50));
    let lb = pb::LoadBalancing {
        health_policy: load_balancing::HealthPolicy::AllowAll as i32,
        ..Default::default()
    };
    let allow_all = state_with(eps, vec![service(Some(lb), None)]);
    let c = counts(&allow_all, 200);
    assert!(c["down"] > 50 && c["up"] > 50, "{c:?}");
    let none = state_with(
        vec![endpoint("down", "10.0.0.2", false, None)],
        vec![service(None, None)],
    );
    assert!(counts(&none, 10).is_empty());
}

#[test]
fn endpoint_choice_weights_by_capacity() {
    let s = state_with(
        vec![
            endpoint("big", "10.0.0.1", true, Some(3)),
            endpoint("small", "10.0.0.2", true, Some(1)),
            endpoint("zero", "10.0.0.3", true, Some(0)),
        ],
        vec![service(None, None)],
    );
    let c = counts(&s, 4000);
    assert_eq!(
        c.get("zero"),
        None,
        "capacity 0 gets nothing while others have weight"
    );
    let ratio = c["big"] as f64 / c["small"] as f64;
    assert!((2.5..3.5).contains(&ratio), "{c:?}");
    // All weights zero: uniform among the eligible.
    let s = state_with(
        vec![
            endpoint("a", "10.0.0.1", true, Some(0)),
            endpoint("b", "10.0.0.2", true, Some(0)),
        ],
        vec![service(None, None)],
    );
    let c = counts(&s, 400);
    assert!(c["a"] > 120 && c["b"] > 120, "{c:?}");
}

#[test]
fn target_port_prefers_the_workload_mapping() {
    let mut w = endpoint("e", "10.0.0.1", true, None);
    w.services.get_mut(SVC_KEY).expect("ports").ports[0].target_port = 9090;
    let s = state_with(vec![w], vec![service(None, None)]);
    let svc = s.service(SVC_KEY).expect("svc");
    let e = s.workloads_of_service(SVC_KEY)[0];
    assert_eq!(target_port(svc, e, 80), 9090);
    assert_eq!(target_port(svc, e, 443), 443, "unknown port: same port");
}

fn router(state: &State) -> Router<'_> {
    Router {
        state,
        network: "",
        hbone_port: HBONE_PORT,
    }
}

fn client() -> pb::Workload {
    workload(
        "client",
        ip("10.0.1.1"),
        "client",
        pb::TunnelProtocol::Hbone,
    )
}

#[test]
fn service_vip_routes_to_an_endpoint_with_service_sans() {
    let s = state_with(
        vec![client(), endpoint("e", "10.0.0.1", true, None)],
        vec![service(None, None)],
    );
    let src = s.workload_by_ip("", ip("10.0.1.1")).expect("client");
    let route = router(&s)
        .route(
            src,
            "10.96.0.10:80".parse().expect("vip"),
            &mut StdRng::seed_from_u64(1),
        )
        .expect("route");
    assert_eq!(
        route.upstream,
        Upstream::Hbone {
            hbone_addr: "10.0.0.1:15008".parse().expect("addr"),
            authority: "10.0.0.1:8080".parse().expect("addr"),
            identities: vec![id("echo"), id("extra")],
        }
    );
    assert_eq!(route.dst_service.expect("service").name, "echo");
}

fn waypoint_addr(addr: &str) -> pb::GatewayAddress {
    pb::GatewayAddress {
        destination: Some(gateway_address::Destination::Address(pb::NetworkAddress {
            network: String::new(),
            address: octets(ip(addr)),
            length: None,
        })),
        hbone_mtls_port: 15008,
    }
}

#[test]
fn service_waypoint_gets_the_vip_as_authority_except_from_the_waypoint() {
    let wp = workload(
        "waypoint",
        ip("10.0.2.1"),
        "waypoint",
        pb::TunnelProtocol::Hbone,
    );
    let s = state_with(
        vec![client(), wp, endpoint("e", "10.0.0.1", true, None)],
        vec![service(None, Some(waypoint_addr("10.0.2.1")))],
    );
    let vip: SocketAddr = "10.96.0.10:80".parse().expect("vip");
    let mut rng = StdRng::seed_from_u64(1);
    let src = s.workload_by_ip("", ip("10.0.1.1")).expect("client");
    let route = router(&s).route(src, vip, &mut rng).expect("route");
    assert!(route.via_waypoint);
    assert_eq!(
        route.upstream,
        Upstream::Hbone {
            hbone_addr: "10.0.2.1:15008".parse().expect("addr"),
            authority: vip,
            identities: vec![id("waypoint")],
        }
    );
    let from_wp = s.workload_by_ip("", ip("10.0.2.1")).expect("waypoint");
    let route = router(&s).route(from_wp, vip, &mut rng).expect("route");
    assert!(
        !route.via_waypoint,
        "the waypoint's own traffic goes to the endpoint"
    );
}

#[test]
fn workload_waypoint_protocols_and_passthrough() {
    let mut behind = workload(
        "behind",
        ip("10.0.0.5"),
        "behind",
        pb::TunnelProtocol::Hbone,
    );
    behind.waypoint = Some(waypoint_addr("10.0.2.1"));
    let wp = workload(
        "waypoint",
        ip("10.0.2.1"),
        "waypoint",
        pb::TunnelProtocol::Hbone,
    );
    let plain = workload("plain", ip("10.0.0.6"), "plain", pb::TunnelProtocol::None);
    let s = state_with(vec![client(), behind, wp, plain], vec![]);
    let src = s.workload_by_ip("", ip("10.0.1.1")).expect("client");
    let mut rng = StdRng::seed_from_u64(1);
    let dst: SocketAddr = "10.0.0.5:9000".parse().expect("addr");
    let route = router(&s).route(src, dst, &mut rng).expect("route");
    assert!(
        matches!(route.upstream, Upstream::Hbone { hbone_addr, authority, .. }
        if hbone_addr == "10.0.2.1:15008".parse().expect("addr") && authority == dst)
    );
    let dst: SocketAddr = "10.0.0.6:9000".parse().expect("addr");
    let route = router(&s).route(src, dst, &mut rng).expect("route");
    assert_eq!(route.upstream, Upstream::Tcp { addr: dst });
    let dst: SocketAddr = "192.0.2.1:443".parse().expect("addr");
    let route = router(&s).route(src, dst, &mut rng).expect("route");
    assert_eq!(route.upstream, Upstream::Tcp { addr: dst });
    assert!(route.dst_workload.is_none());
}

#[test]
fn service_without_endpoints_fails_unless_passthrough() {
    let s = state_with(vec![client()], vec![service(None, None)]);
    let src = s.workload_by_ip("", ip("10.0.1.1")).expect("client");
    let vip: SocketAddr = "10.96.0.10:80".parse().expect("vip");
    let mut rng = StdRng::seed_from_u64(1);
    let err = router(&s)
        .route(src, vip, &mut rng)
        .expect_err("no endpoints");
    assert!(matches!(err, RouteError::NoHealthyUpstream { .. }));
    assert!(err.to_string().contains("no healthy upstream"), "{err}");
    let lb = pb::LoadBalancing {
        mode: load_balancing::Mode::Passthrough as i32,
        ..Default::default()
    };
    let s = state_with(vec![client()], vec![service(Some(lb), None)]);
    let src = s.workload_by_ip("", ip("10.0.1.1")).expect("client");
    let route = router(&s).route(src, vip, &mut rng).expect("passthrough");
    assert_eq!(route.upstream, Upstream::Tcp { addr: vip });
}

#[test]
fn baggage_describes_the_source_workload() {
    let mut w = workload(
        "client",
        ip("10.0.1.1"),
        "client",
        pb::TunnelProtocol::Hbone,
    );
    w.workload_name = "client-deploy".into();
    w.locality = Some(pb::Locality {
        region: "eu-west1".into(),
        zone: "b".into(),
        subzone: String::new(),
    });
    let s = state_with(vec![w], vec![]);
    let w = s.workload_by_ip("", ip("10.0.1.1")).expect("client");
    assert_eq!(
        baggage(w),
        "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
         k8s.deployment.name=client-deploy,service.name=client,service.version=v1,\
         cloud.region=eu-west1,cloud.availability_zone=b"
    );
}

#[test]
fn forwarded_for_parses_istio_and_rfc_forms() {
    assert_eq!(forwarded_for("for=\"10.0.0.1:5000\""), Some(ip("10.0.0.1")));
    assert_eq!(
        forwarded_for("for=\"[fd00::1]:80\";host=echo.default.svc"),
        Some(ip("fd00::1"))
    );
    assert_eq!(forwarded_for("host=x; For=10.0.0.2"), Some(ip("10.0.0.2")));
    assert_eq!(forwarded_for("for=\"[fd00::2]\""), Some(ip("fd00::2")));
    assert_eq!(forwarded_for("for=unknown"), None);
    assert_eq!(forwarded_for("proto=https"), None);
}

#[test]
fn connect_request_carries_forwarded_host() {
    let mut r = crate::hbone::ConnectRequest::new(
        "10.96.0.10:80".parse().expect("addr"),
        "10.0.1.1:5555".parse().expect("addr"),
    );
    r.forwarded_host = Some("echo.default.svc.cluster.local".into());
    let http = r.to_http().expect("request");
    assert_eq!(
        http.headers()[crate::hbone::FORWARDED_HEADER],
        "for=\"10.0.1.1:5555\";host=echo.default.svc.cluster.local"
    );
}
