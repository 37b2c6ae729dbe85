use std::net::IpAddr;
use std::path::Path;

use mesh_proto::security as sec;
use mesh_proto::workload::{self as pb, address};
use prost::Message;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn ip_bytes(s: &str) -> Vec<u8> {
    match ip(s) {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn workload(uid: &str, ips: &[&str]) -> pb::Workload {
    pb::Workload {
        uid: uid.to_string(),
        name: uid.rsplit('/').next().unwrap_or(uid).to_string(),
        namespace: "default".to_string(),
        addresses: ips.iter().map(|s| ip_bytes(s)).collect(),
        network: "net1".to_string(),
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        service_account: "sa".to_string(),
        ..Default::default()
    }
}

fn service(host: &str, vip: &str) -> pb::Service {
    pb::Service {
        name: host.split('.').next().unwrap_or(host).to_string(),
        namespace: "default".to_string(),
        hostname: host.to_string(),
        addresses: vec![pb::NetworkAddress {
            network: "net1".to_string(),
            address: ip_bytes(vip),
            length: None,
        }],
        ports: vec![pb::Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: pb::AppProtocol::Http11 as i32,
        }],
        ..Default::default()
    }
}

fn encode_workload(w: pb::Workload) -> Vec<u8> {
    pb::Address {
        r#type: Some(address::Type::Workload(w)),
    }
    .encode_to_vec()
}

fn encode_service(s: pb::Service) -> Vec<u8> {
    pb::Address {
        r#type: Some(address::Type::Service(s)),
    }
    .encode_to_vec()
}

fn authz(name: &str, scope: sec::Scope, action: sec::Action) -> Vec<u8> {
    sec::Authorization {
        name: name.to_string(),
        namespace: "default".to_string(),
        scope: scope as i32,
        action: action as i32,
        ..Default::default()
    }
    .encode_to_vec()
}

const W1: &str = "Kubernetes//Pod/default/w1";
const SVC: &str = "default/echo.default.svc.cluster.local";

#[test]
fn workload_apply_lookup_and_remove() {
    let mut s = State::new();
    let bytes = encode_workload(workload(W1, &["10.0.0.1", "fd00::1"]));
    s.apply_address(W1, Some(&bytes)).expect("apply");
    let w = s.workload_by_ip("net1", ip("10.0.0.1")).expect("by v4");
    assert_eq!(w.uid, W1);
    assert_eq!(w.protocol, pb::TunnelProtocol::Hbone);
    assert_eq!(w.capacity, 1);
    assert!(s.workload_by_ip("net1", ip("fd00::1")).is_some());
    assert!(s.workload_by_ip("other", ip("10.0.0.1")).is_none());
    s.apply_address(W1, None).expect("remove");
    assert!(s.workload(W1).is_none());
    assert!(s.workload_by_ip("net1", ip("10.0.0.1")).is_none());
    s.apply_address("never-seen", None)
        .expect("removing unknown is fine");
}

#[test]
fn ip_change_moves_the_index() {
    let mut s = State::new();
    let first = encode_workload(workload(W1, &["10.0.0.1"]));
    s.apply_address(W1, Some(&first)).expect("apply");
    let moved = encode_workload(workload(W1, &["10.0.0.2"]));
    s.apply_address(W1, Some(&moved)).expect("update");
    assert!(s.workload_by_ip("net1", ip("10.0.0.1")).is_none());
    assert_eq!(
        s.workload_by_ip("net1", ip("10.0.0.2"))
            .map(|w| w.uid.as_str()),
        Some(W1)
    );
    assert_eq!(s.workloads().count(), 1);
}

#[test]
fn reused_ip_is_not_unindexed_by_the_old_owner() {
    let mut s = State::new();
    let old = encode_workload(workload("old", &["10.0.0.1"]));
    let new = encode_workload(workload("new", &["10.0.0.1"]));
    s.apply_address("old", Some(&old)).expect("old");
    s.apply_address("new", Some(&new)).expect("new");
    s.apply_address("old", None).expect("remove old");
    assert_eq!(
        s.workload_by_ip("net1", ip("10.0.0.1"))
            .map(|w| w.uid.as_str()),
        Some("new")
    );
}

#[test]
fn service_by_vip_and_endpoints() {
    let mut s = State::new();
    let svc = encode_service(service("echo.default.svc.cluster.local", "10.96.0.10"));
    s.apply_address(SVC, Some(&svc)).expect("service");
    let mut w = workload(W1, &["10.0.0.1"]);
    w.services.insert(
        SVC.to_string(),
        pb::PortList {
            ports: vec![pb::Port {
                service_port: 80,
                target_port: 8080,
                app_protocol: 0,
            }],
        },
    );
    s.apply_address(W1, Some(&encode_workload(w)))
        .expect("workload");
    let found = s.service_by_vip("net1", ip("10.96.0.10")).expect("by vip");
    assert_eq!(found.key(), SVC);
    let eps: Vec<&str> = s
        .workloads_of_service(SVC)
        .iter()
        .map(|w| w.uid.as_str())
        .collect();
    assert_eq!(eps, [W1]);
    s.apply_address(W1, None).expect("remove workload");
    assert!(s.workloads_of_service(SVC).is_empty());
    s.apply_address(SVC, None).expect("remove service");
    assert!(s.service_by_vip("net1", ip("10.96.0.10")).is_none());
}

#[test]
fn invalid_resources_are_rejected_and_state_kept() {
    let mut s = State::new();
    let good = encode_workload(workload(W1, &["10.0.0.1"]));
    s.apply_address(W1, Some(&good)).expect("good");

    let mut bad = workload(W1, &["10.0.0.2"]);
    bad.addresses.push(vec![1, 2, 3]);
    let err = s
        .apply_address(W1, Some(&encode_workload(bad)))
        .expect_err("3-byte IP");
    assert_eq!(err.reason(), "ip_length");
    assert!(err.to_string().contains("addresses[1]"), "{err}");

    let mut bad = workload(W1, &["10.0.0.2"]);
    bad.tunnel_protocol = 42;
    let err = s
        .apply_address(W1, Some(&encode_workload(bad)))
        .expect_err("unknown enum");
    assert!(err.to_string().contains("tunnelProtocol"), "{err}");
    assert_eq!(err.reason(), "unknown_enum");

    let err = s
        .apply_address("x", Some(&encode_workload(workload("", &[]))))
        .expect_err("empty uid");
    assert!(err.to_string().contains("field uid is empty"), "{err}");

    let err = s
        .apply_address("x", Some(&[0xff, 0xff]))
        .expect_err("garbage");
    assert_eq!(err.reason(), "decode");

    let err = s
        .apply_address("x", Some(&pb::Address { r#type: None }.encode_to_vec()))
        .expect_err("no type");
    assert_eq!(err.reason(), "empty_field");

    let mut bad_svc = service("echo.default.svc.cluster.local", "10.96.0.10");
    bad_svc.ports[0].target_port = 70_000;
    let err = s
        .apply_address(SVC, Some(&encode_service(bad_svc)))
        .expect_err("port range");
    assert!(err.to_string().contains("ports[0].targetPort"), "{err}");

    // The previous good state is untouched.
    assert!(s.workload_by_ip("net1", ip("10.0.0.1")).is_some());
    assert!(s.workload_by_ip("net1", ip("10.0.0.2")).is_none());
    assert!(s.service(SVC).is_none());
}

#[test]
fn policies_apply_remove_and_select() {
    let mut s = State::new();
    let ns = authz("ns-deny", sec::Scope::Namespace, sec::Action::Deny);
    let sel = authz("selected", sec::Scope::WorkloadSelector, sec::Action::Allow);
    s.apply_authorization("default/ns-deny", Some(&ns))
        .expect("ns");
    s.apply_authorization("default/selected", Some(&sel))
        .expect("sel");
    let mut w = workload(W1, &["10.0.0.1"]);
    s.apply_address(W1, Some(&encode_workload(w.clone())))
        .expect("w");
    let keys = |s: &State| -> Vec<String> {
        let w = s.workload(W1).expect("workload");
        s.policies_for(w).iter().map(|p| p.key()).collect()
    };
    assert_eq!(keys(&s), ["default/ns-deny"]);
    w.authorization_policies = vec!["default/selected".to_string()];
    s.apply_address(W1, Some(&encode_workload(w))).expect("w");
    assert_eq!(keys(&s), ["default/ns-deny", "default/selected"]);
    s.apply_authorization("default/ns-deny", None)
        .expect("remove");
    assert_eq!(keys(&s), ["default/selected"]);

    let bad = sec::Authorization {
        name: "bad".to_string(),
        namespace: "default".to_string(),
        scope: 9,
        ..Default::default()
    };
    let err = s
        .apply_authorization("default/bad", Some(&bad.encode_to_vec()))
        .expect_err("unknown scope");
    assert_eq!(err.reason(), "unknown_scope");
    assert_eq!(s.policies().len(), 1);
}

#[test]
fn dump_uses_upstream_ztunnel_shapes() {
    let mut s = State::new();
    let mut w1 = workload(W1, &["10.0.0.1"]);
    w1.services.insert(
        SVC.to_string(),
        pb::PortList {
            ports: vec![pb::Port {
                service_port: 80,
                target_port: 8080,
                app_protocol: 0,
            }],
        },
    );
    w1.waypoint = Some(pb::GatewayAddress {
        destination: Some(pb::gateway_address::Destination::Hostname(
            pb::NamespacedHostname {
                namespace: "default".to_string(),
                hostname: "waypoint.default.svc.cluster.local".to_string(),
            },
        )),
        hbone_mtls_port: 15008,
    });
    w1.workload_type = pb::WorkloadType::Deployment as i32;
    s.apply_address(W1, Some(&encode_workload(w1))).expect("w1");
    // An unhealthy workload of the same service, with no trust domain or service account.
    let mut w2 = workload("Kubernetes//Pod/default/w2", &["10.0.0.2"]);
    w2.services
        .insert(SVC.to_string(), pb::PortList { ports: vec![] });
    w2.status = pb::WorkloadStatus::Unhealthy as i32;
    w2.service_account = String::new();
    w2.tunnel_protocol = pb::TunnelProtocol::None as i32;
    s.apply_address("Kubernetes//Pod/default/w2", Some(&encode_workload(w2)))
        .expect("w2");
    let mut svc = service("echo.default.svc.cluster.local", "10.96.0.10");
    svc.waypoint = Some(pb::GatewayAddress {
        destination: Some(pb::gateway_address::Destination::Address(
            pb::NetworkAddress {
                network: String::new(),
                address: ip_bytes("10.96.0.20"),
                length: None,
            },
        )),
        hbone_mtls_port: 15008,
    });
    svc.ip_families = pb::IpFamilies::Ipv4Only as i32;
    s.apply_address(SVC, Some(&encode_service(svc)))
        .expect("svc");
    let p = authz("deny", sec::Scope::Global, sec::Action::Deny);
    s.apply_authorization("default/deny", Some(&p)).expect("p");
    let json = serde_json::to_value(s.dump()).expect("serialize");

    let w = &json["workloads"][0];
    assert_eq!(w["uid"], W1);
    assert_eq!(w["workloadIps"][0], "10.0.0.1");
    assert_eq!(w["protocol"], "HBONE");
    assert_eq!(w["status"], "Healthy");
    assert_eq!(w["networkMode"], "Standard");
    assert_eq!(w["workloadType"], "deployment");
    assert_eq!(w["trustDomain"], "cluster.local");
    assert_eq!(w["clusterId"], "Kubernetes");
    assert_eq!(
        w["waypoint"],
        serde_json::json!({
            "destination": "default/waypoint.default.svc.cluster.local",
            "hboneMtlsPort": 15008
        })
    );
    assert_eq!(w["services"], serde_json::json!([SVC]));
    assert!(w.get("locality").is_none() && w.get("applicationTunnel").is_none());
    let w2 = &json["workloads"][1];
    assert_eq!(w2["protocol"], "TCP");
    assert_eq!(w2["status"], "Unhealthy");
    assert_eq!(w2["serviceAccount"], "default");

    let svc = &json["services"][0];
    assert_eq!(svc["vips"], serde_json::json!(["net1/10.96.0.10"]));
    assert_eq!(svc["ports"], serde_json::json!({"80": 8080}));
    assert_eq!(svc["waypoint"]["destination"], "/10.96.0.20");
    assert_eq!(svc["ipFamilies"], "IPv4");
    // Only the healthy workload is an endpoint (the default health policy).
    assert_eq!(
        svc["endpoints"],
        serde_json::json!({
            W1: {"workloadUid": W1, "port": {"80": 8080}, "status": "Healthy"}
        })
    );
    assert_eq!(json["policies"][0]["scope"], "Global");
    assert_eq!(json["policies"][0]["action"], "Deny");

    // Upstream istioctl decodes the dump into typed Go structs (istioctl/pkg/writer/ztunnel/
    // configdump), which fail on a JSON type they do not expect: mirror their field types.
    let parsed: upstream_istioctl::Dump =
        serde_json::from_value(json).expect("upstream istioctl's types read the dump");
    assert_eq!(parsed.workloads.len(), 2);
    assert_eq!(parsed.services[0].ports.get("80"), Some(&8080));
    assert_eq!(parsed.services[0].endpoints[W1].port.get(&80), Some(&8080));
}

/// The JSON types upstream istioctl's Go structs expect in ztunnel's `/config_dump` (strings,
/// string-keyed maps, nested structs; unknown fields are ignored, as Go's decoder does).
mod upstream_istioctl {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Dump {
        pub workloads: Vec<Workload>,
        pub services: Vec<Service>,
        #[allow(dead_code, reason = "decoded for its type only")]
        pub policies: Vec<Policy>,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Workload {
        pub uid: String,
        pub workload_ips: Vec<String>,
        pub waypoint: Option<Gateway>,
        pub network_gateway: Option<Gateway>,
        pub protocol: String,
        pub name: String,
        pub namespace: String,
        pub service_account: String,
        #[serde(default)]
        pub workload_name: String,
        pub workload_type: String,
        #[serde(default)]
        pub canonical_name: String,
        pub cluster_id: String,
        pub trust_domain: String,
        #[serde(default)]
        pub locality: Locality,
        #[serde(default)]
        pub node: String,
        #[serde(default)]
        pub network: String,
        pub status: String,
        #[serde(default)]
        pub hostname: String,
        pub application_tunnel: Option<ApplicationTunnel>,
        #[serde(default)]
        pub authorization_policies: Vec<String>,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize, Default)]
    pub struct Locality {
        #[serde(default)]
        pub region: String,
        #[serde(default)]
        pub zone: String,
        #[serde(default)]
        pub subzone: String,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    pub struct ApplicationTunnel {
        pub protocol: String,
        pub port: Option<u16>,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    pub struct Gateway {
        pub destination: String,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Service {
        pub name: String,
        pub namespace: String,
        pub hostname: String,
        pub vips: Vec<String>,
        pub ports: BTreeMap<String, i64>,
        pub load_balancer: Option<LoadBalancer>,
        pub waypoint: Option<Gateway>,
        pub endpoints: BTreeMap<String, Endpoint>,
        #[serde(default)]
        pub subject_alt_names: Vec<String>,
        #[serde(default)]
        pub ip_families: String,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct LoadBalancer {
        pub mode: String,
        pub routing_preferences: Vec<String>,
        pub health_policy: String,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Endpoint {
        pub workload_uid: String,
        #[serde(default)]
        pub service: String,
        #[serde(default)]
        pub address: String,
        pub port: BTreeMap<u16, u16>,
    }

    #[allow(dead_code, reason = "decoded for their types only")]
    #[derive(Deserialize)]
    pub struct Policy {
        pub name: String,
        pub namespace: String,
        pub scope: String,
        pub action: String,
        pub rules: Vec<Vec<Vec<serde_json::Value>>>,
    }
}

const LOCAL: &str = r#"
workloads:
- uid: cluster1//Pod/default/local
  name: local
  namespace: default
  serviceAccount: default
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  node: local
  services:
    "default/echo.default.svc.cluster.local": {80: 8080}
- uid: cluster1//Pod/default/local-tcp
  name: local-tcp
  namespace: default
  serviceAccount: default
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  node: local
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10", "net2/fd00::10"]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/default"]
policies:
- name: only-default
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - namespaces: [{exact: default}]
        sourceIps: ["127.0.0.0/8"]
        destinationPorts: [8080]
"#;

#[test]
fn local_xds_yaml_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("local.yaml");
    std::fs::write(&path, LOCAL).expect("write");
    let mut s = State::new();
    s.load_local_file(&path).expect("load");
    let w = s.workload_by_ip("", ip("127.0.0.1")).expect("local");
    assert_eq!(w.protocol, pb::TunnelProtocol::Hbone);
    let tcp = s.workload_by_ip("", ip("127.0.0.2")).expect("local-tcp");
    assert_eq!(tcp.protocol, pb::TunnelProtocol::None);
    let svc = s.service_by_vip("net2", ip("fd00::10")).expect("vip");
    assert_eq!(svc.ports[0].target_port, 8080);
    assert!(s.service_by_vip("", ip("10.96.0.10")).is_some());
    assert_eq!(s.workloads_of_service(SVC).len(), 1);
    let policies = s.policies_for(w);
    assert_eq!(policies.len(), 1);
    let m = &policies[0].groups[0][0][0];
    assert_eq!(m.destination_ports, [8080]);
    // The dump round-trips the policy shape of the file.
    let json = serde_json::to_value(s.dump()).expect("serialize");
    let m = &json["policies"][0]["rules"][0][0][0];
    assert_eq!(m["namespaces"][0]["Exact"], "default", "{json}");
    assert_eq!(m["sourceIps"][0], "127.0.0.0/8");
    let dumped = s.dump().policies;
    assert_eq!(
        dumped[0].rules[0][0][0].source_ips[0].to_string(),
        "127.0.0.0/8"
    );
}

#[test]
fn local_xds_errors_name_file_and_field() {
    let mut s = State::new();
    let path = Path::new("/etc/ztunnel/local.yaml");
    let bad_vip = LOCAL.replace("net2/fd00::10", "net2/not-an-ip");
    let err = s.load_local_yaml(path, &bad_vip).expect_err("bad vip");
    let msg = err.to_string();
    assert!(msg.contains("/etc/ztunnel/local.yaml"), "{msg}");
    assert!(
        msg.contains("services[0]") && msg.contains("vips[1]"),
        "{msg}"
    );
    assert_eq!(err.reason(), "bad_network_address");
    let bad_proto = LOCAL.replace("protocol: TCP", "protocol: UDP");
    let err = s.load_local_yaml(path, &bad_proto).expect_err("bad enum");
    assert!(err.to_string().contains("workloads[1].protocol"), "{err}");
    let no_uid = LOCAL.replace("uid: cluster1//Pod/default/local-tcp", "uid: \"\"");
    let err = s.load_local_yaml(path, &no_uid).expect_err("empty uid");
    assert!(err.to_string().contains("workloads[1]"), "{err}");
    assert_eq!(s.workloads().count(), 0, "failed loads change nothing");
    let err = s
        .load_local_file(Path::new("/nonexistent/local.yaml"))
        .expect_err("missing file");
    assert_eq!(err.reason(), "local_read");
}

#[tokio::test]
async fn shared_state_wakes_waiters_on_xds_changes() {
    use crate::xds::Handler;
    let shared = SharedState::default();
    let waiter = {
        let shared = shared.clone();
        tokio::spawn(async move {
            shared
                .wait_for(std::time::Duration::from_secs(5), |s| {
                    s.workload_by_ip("net1", ip("10.0.0.9"))
                        .map(|w| w.uid.clone())
                })
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let body = encode_workload(workload("c//Pod/ns/late", &["10.0.0.9"]));
    shared
        .apply(
            mesh_proto::type_url::ADDRESS,
            &[("c//Pod/ns/late".into(), body)],
            &[],
        )
        .expect("applied");
    assert_eq!(
        waiter.await.expect("join").as_deref(),
        Some("c//Pod/ns/late")
    );
    // A lookup that never succeeds gives up at its timeout.
    let none = shared
        .wait_for(std::time::Duration::from_millis(30), |s| {
            s.workload_by_ip("", ip("10.9.9.9")).map(|_| ())
        })
        .await;
    assert!(none.is_none());
}

#[test]
fn the_dump_has_upstreams_shape_for_matches_visibility_staged_services_and_static_config() {
    let yaml = r#"
workloads:
- uid: cluster1//Pod/default/a
  name: a
  namespace: default
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  services:
    "default/echo.default.svc.cluster.local": {80: 8080}
    "default/later.default.svc.cluster.local": {90: 9090}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
policies:
- name: p
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - namespaces: [{Exact: default}]
        principals: [{Presence: []}]
      - notPrincipals: [{presence: {}}, {Prefix: x}, {suffix: y}]
"#;
    let mut s = State::new();
    s.load_local_yaml(Path::new("local.yaml"), yaml)
        .expect("load");
    let json = serde_json::to_value(s.dump()).expect("serialize");
    let rules = &json["policies"][0]["rules"][0];
    assert_eq!(
        rules[0][0]["namespaces"][0],
        serde_json::json!({"Exact": "default"})
    );
    assert_eq!(
        rules[0][0]["principals"][0],
        serde_json::json!({"Presence": []})
    );
    assert_eq!(
        rules[0][1]["notPrincipals"],
        serde_json::json!([{"Presence": []}, {"Prefix": "x"}, {"Suffix": "y"}])
    );
    assert_eq!(json["services"][0]["visibility"], "Public");
    assert_eq!(
        json["stagedServices"],
        serde_json::json!({"default/later.default.svc.cluster.local": {
            "cluster1//Pod/default/a": {"workloadUid": "cluster1//Pod/default/a",
                "port": {"90": 9090}, "status": "Healthy"}}})
    );
    let static_config = &json["staticConfig"];
    assert_eq!(
        static_config["workloads"][0]["uid"],
        "cluster1//Pod/default/a"
    );
    assert_eq!(
        static_config["services"][0]["hostname"],
        "echo.default.svc.cluster.local"
    );
    assert_eq!(static_config["policies"][0]["name"], "p");
    // What the dump shows loads again.
    let again = serde_yaml::to_string(&*s.local_config()).expect("yaml");
    let mut t = State::new();
    t.load_local_yaml(Path::new("dump.yaml"), &again)
        .expect("the static config reloads");
    assert_eq!(
        serde_json::to_value(t.dump()).expect("json")["policies"],
        json["policies"]
    );

    // Without local config: empty lists, as upstream.
    let empty = serde_json::to_value(State::new().dump()).expect("json");
    assert_eq!(
        empty["staticConfig"],
        serde_json::json!({"workloads": [], "policies": [], "services": []})
    );
    assert_eq!(empty["stagedServices"], serde_json::json!({}));
}

#[test]
fn bad_string_matchers_are_named() {
    for (rule, want) in [
        ("{Regex: x}", "unknown string matcher \"Regex\""),
        ("{}", "empty string matcher"),
        ("{Exact: a, Prefix: b}", "exactly one key"),
        ("{Exact: [1]}", "invalid type"),
    ] {
        let yaml = format!(
            "policies:\n- {{name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{{namespaces: [{rule}]}}]]]}}\n"
        );
        let err = State::new()
            .load_local_yaml(Path::new("bad.yaml"), &yaml)
            .expect_err(rule);
        assert!(err.to_string().contains(want), "{rule}: {err}");
    }
}
