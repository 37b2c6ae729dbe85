//! The sidecar index through the model: which pods get a configuration, their inbound ports
//! and modes, and regeneration that pushes only what changed.

use mesh_api::{Kind, ObjectKey};
use mesh_proto::envoy::pb::envoy::config::listener::v3::Listener;
use mesh_proto::type_url;
use mesh_xds::XdsSnapshot;
use prost::Message;
use serde_json::json;

use crate::envoy::WaypointKey;
use crate::model::testing::{authz, namespace, obj, peer_auth, pod_json, service};
use crate::model::{Model, ModelConfig, Snapshot};

fn key(name: &str) -> WaypointKey {
    WaypointKey {
        namespace: "legacy".into(),
        name: name.into(),
    }
}

/// A pod the injector gave a sidecar.
fn injected(name: &str, ip: &str) -> mesh_api::Object {
    let mut v = pod_json(
        "legacy",
        name,
        ip,
        json!({"app": "echo", "security.istio.io/tlsMode": "istio"}),
    );
    v["metadata"]["annotations"] = json!({"sidecar.istio.io/status": "{}"});
    obj(v)
}

fn legacy() -> Model {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("legacy", json!({"istio-injection": "enabled"})));
    m.apply(service(
        "legacy",
        "echo",
        json!({"app": "echo"}),
        "10.96.0.10",
    ));
    m.apply(injected("echo-1", "10.1.0.5"));
    m
}

fn names(s: &Snapshot, pod: &str, type_url: &str) -> Vec<String> {
    s.sidecar(&key(pod))
        .get(type_url)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// `(chain name, destination port)` of the pod's `virtualInbound`.
fn inbound_chains(s: &Snapshot, pod: &str) -> Vec<(String, Option<u32>)> {
    let lds = s.sidecar(&key(pod)).get(type_url::LISTENER).expect("lds");
    let l = Listener::decode(lds["virtualInbound"].body.value.as_slice()).expect("listener");
    l.filter_chains
        .iter()
        .map(|c| {
            let port = c
                .filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port);
            (c.name.clone(), port.map(|p| p.value))
        })
        .collect()
}

#[test]
fn injected_pods_get_a_sidecar_configuration_others_do_not() {
    let mut m = legacy();
    let plain = pod_json("legacy", "plain", "10.1.0.6", json!({"app": "echo"}));
    m.apply(obj(plain));
    let s = m.build();
    let clusters = names(&s, "echo-1", type_url::CLUSTER);
    for c in [
        "outbound|80||echo.legacy.svc.cluster.local",
        "outbound|9000||echo.legacy.svc.cluster.local",
        "inbound|8080||",
        "inbound|9001||",
        "PassthroughCluster",
    ] {
        assert!(clusters.contains(&c.to_string()), "{c} in {clusters:?}");
    }
    assert!(s
        .sidecar(&key("plain"))
        .get(type_url::CLUSTER)
        .expect("cds")
        .is_empty());
    assert_eq!(s.sidecars().count(), 1);
    // The node id of the pod's proxy picks its scope.
    let node = mesh_proto::envoy::pb::envoy::config::core::v3::Node {
        id: "sidecar~10.1.0.5~echo-1.legacy~legacy.svc.cluster.local".into(),
        ..Default::default()
    };
    let scope = s.scope_of(&node);
    let lds = s.scoped_resources(&scope, type_url::LISTENER).expect("lds");
    assert!(lds.contains_key("virtualOutbound") && lds.contains_key("virtualInbound"));
    // Removing the annotation (or the pod) takes the configuration away.
    m.delete(&ObjectKey::new(Kind::Pod, "legacy", "echo-1"));
    let s = m.build();
    assert_eq!(s.sidecars().count(), 0);
}

#[test]
fn peer_authentication_modes_reach_the_inbound_chains() {
    let mut m = legacy();
    let s = m.build();
    let chains = inbound_chains(&s, "echo-1");
    assert!(
        chains.contains(&("0.0.0.0_8080".into(), Some(8080))),
        "{chains:?}"
    );
    m.apply(peer_auth(
        "legacy",
        "default",
        json!({"mtls": {"mode": "STRICT"}}),
    ));
    m.apply(peer_auth(
        "legacy",
        "echo",
        json!({"selector": {"matchLabels": {"app": "echo"}},
               "portLevelMtls": {"9001": {"mode": "DISABLE"}, "7777": {"mode": "STRICT"}}}),
    ));
    let s = m.build();
    let chains = inbound_chains(&s, "echo-1");
    assert!(
        chains.contains(&("0.0.0.0_8080-refused".into(), Some(8080))),
        "{chains:?}"
    );
    assert!(
        chains.contains(&("0.0.0.0_9001".into(), Some(9001))),
        "{chains:?}"
    );
    let errors: Vec<String> = (s.sidecar(&key("echo-1")).errors.iter())
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("legacy/echo") && e.contains("7777")),
        "{errors:?}"
    );
}

#[test]
fn unrelated_changes_push_nothing_and_policies_reach_only_selected_pods() {
    let mut m = legacy();
    m.apply(injected("echo-2", "10.1.0.7"));
    let s1 = m.build();
    let before = s1.sidecar(&key("echo-1")).changed_in;
    // A pod without a sidecar in another namespace changes nothing the sidecars get.
    m.apply(obj(pod_json("other", "x", "10.1.0.9", json!({"app": "x"}))));
    let s2 = m.build();
    assert_eq!(s2.sidecar(&key("echo-1")).changed_in, before);
    // A policy selecting echo-2 only.
    let mut v = pod_json(
        "legacy",
        "echo-2",
        "10.1.0.7",
        json!({"app": "echo", "tier": "gold", "security.istio.io/tlsMode": "istio"}),
    );
    v["metadata"]["annotations"] = json!({"sidecar.istio.io/status": "{}"});
    m.apply(obj(v));
    m.apply(authz(
        "legacy",
        "deny-v2",
        json!({"selector": {"matchLabels": {"tier": "gold"}}, "action": "DENY",
               "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"]}}]}]}),
    ));
    let s3 = m.build();
    assert_eq!(s3.sidecar(&key("echo-1")).changed_in, before);
    assert!(s3.sidecar(&key("echo-2")).changed_in > before);
}

fn sidecar_resource(
    ns: &str,
    name: &str,
    created: &str,
    spec: serde_json::Value,
) -> mesh_api::Object {
    obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": spec,
    }))
}

/// `legacy` (echo, echo-1 with a sidecar), plus services in `shop` and `istio-system`.
fn three_namespaces() -> Model {
    let mut m = legacy();
    m.apply(service("shop", "web", json!({"app": "web"}), "10.96.0.20"));
    m.apply(service(
        "istio-system",
        "istiod",
        json!({"app": "istiod"}),
        "10.96.0.30",
    ));
    m
}

/// Where `virtualOutbound` sends destinations it has no listener for.
fn catch_all(s: &Snapshot, pod: &str) -> String {
    use mesh_proto::envoy::pb::envoy::config::listener::v3::filter::ConfigType;
    use mesh_proto::envoy::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        tcp_proxy::ClusterSpecifier, TcpProxy,
    };
    let lds = s.sidecar(&key(pod)).get(type_url::LISTENER).expect("lds");
    let vo = Listener::decode(lds["virtualOutbound"].body.value.as_slice()).expect("listener");
    let chain = vo.filter_chains.last().expect("chains");
    let Some(ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!("typed filter");
    };
    match TcpProxy::decode(any.value.as_slice())
        .expect("tcp_proxy")
        .cluster_specifier
    {
        Some(ClusterSpecifier::Cluster(c)) => c,
        other => panic!("{other:?}"),
    }
}

fn outbound_hosts(s: &Snapshot, pod: &str) -> Vec<String> {
    let mut hosts: Vec<String> = names(s, pod, type_url::CLUSTER)
        .into_iter()
        .filter_map(|c| c.strip_prefix("outbound|").map(str::to_string))
        .collect();
    hosts.sort();
    hosts
}

#[test]
fn a_sidecar_resource_scopes_what_the_proxy_gets() {
    let mut m = three_namespaces();
    let everything = outbound_hosts(&m.build(), "echo-1");
    assert!(
        everything
            .iter()
            .any(|h| h.ends_with("web.shop.svc.cluster.local")),
        "{everything:?}"
    );
    // The namespace's Sidecar: its own namespace and istio-system, and shop on 9000 only.
    m.apply(sidecar_resource(
        "legacy",
        "default",
        "2024-01-01T00:00:00Z",
        json!({"egress": [
            {"port": {"number": 9000, "protocol": "TCP"}, "hosts": ["shop/*"]},
            {"hosts": ["./*", "istio-system/*"]},
        ]}),
    ));
    let s = m.build();
    let hosts = outbound_hosts(&s, "echo-1");
    assert_eq!(
        hosts,
        vec![
            "80||echo.legacy.svc.cluster.local",
            "80||istiod.istio-system.svc.cluster.local",
            "9000||web.shop.svc.cluster.local",
            "9090||echo.legacy.svc.cluster.local",
            "9090||istiod.istio-system.svc.cluster.local",
        ],
    );
    let listeners = names(&s, "echo-1", type_url::LISTENER);
    assert!(
        listeners.contains(&"10.96.0.20_9000".to_string()),
        "{listeners:?}"
    );
    assert!(
        !listeners.contains(&"10.96.0.30_9000".to_string()),
        "{listeners:?}"
    );
    // An older one selecting the pod wins over the namespace's; a newer one loses to it.
    m.apply(sidecar_resource(
        "legacy",
        "echo-newer",
        "2025-01-01T00:00:00Z",
        json!({"workloadSelector": {"labels": {"app": "echo"}}, "egress": [{"hosts": ["~/*"]}]}),
    ));
    m.apply(sidecar_resource(
        "legacy",
        "echo",
        "2024-06-01T00:00:00Z",
        json!({"workloadSelector": {"labels": {"app": "echo"}}, "egress": [{"hosts": ["shop/*"]}]}),
    ));
    let hosts = outbound_hosts(&m.build(), "echo-1");
    assert!(
        hosts
            .iter()
            .all(|h| h.ends_with("web.shop.svc.cluster.local")),
        "{hosts:?}"
    );
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    // Gone: the namespace's again, then (none left) everything.
    m.delete(&ObjectKey::new(Kind::Sidecar, "legacy", "echo"));
    m.delete(&ObjectKey::new(Kind::Sidecar, "legacy", "echo-newer"));
    assert_eq!(outbound_hosts(&m.build(), "echo-1").len(), 5);
    m.delete(&ObjectKey::new(Kind::Sidecar, "legacy", "default"));
    assert_eq!(outbound_hosts(&m.build(), "echo-1"), everything);
}

#[test]
fn the_root_namespace_sidecar_is_the_mesh_default_with_dot_as_the_pods_namespace() {
    let mut m = three_namespaces();
    m.apply(sidecar_resource(
        "istio-system",
        "default",
        "2024-01-01T00:00:00Z",
        json!({"egress": [{"hosts": ["./*"]}], "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
    ));
    let s = m.build();
    let hosts = outbound_hosts(&s, "echo-1");
    assert!(
        hosts
            .iter()
            .all(|h| h.ends_with("echo.legacy.svc.cluster.local")),
        "{hosts:?}"
    );
    assert_eq!(catch_all(&s, "echo-1"), "BlackHoleCluster");
}

#[test]
fn the_mesh_config_sets_the_outbound_mode_a_sidecar_overrides_it() {
    let cfg = ModelConfig {
        outbound_registry_only: true,
        ..ModelConfig::default()
    };
    let mut m = Model::new(cfg);
    m.apply(namespace("legacy", json!({})));
    m.apply(service(
        "legacy",
        "echo",
        json!({"app": "echo"}),
        "10.96.0.10",
    ));
    m.apply(injected("echo-1", "10.1.0.5"));
    assert_eq!(catch_all(&m.build(), "echo-1"), "BlackHoleCluster");
    m.apply(sidecar_resource(
        "legacy",
        "default",
        "2024-01-01T00:00:00Z",
        json!({"outboundTrafficPolicy": {"mode": "ALLOW_ANY"}}),
    ));
    let s = m.build();
    assert_eq!(catch_all(&s, "echo-1"), "PassthroughCluster");
    assert_eq!(
        outbound_hosts(&s, "echo-1").len(),
        3,
        "no egress: every service"
    );
}

#[test]
fn ingress_listeners_replace_the_services_ports_and_problems_are_reported() {
    let mut m = legacy();
    m.apply(sidecar_resource(
        "legacy",
        "echo",
        "2024-01-01T00:00:00Z",
        json!({"workloadSelector": {"labels": {"app": "echo"}},
               "ingress": [
                   {"port": {"number": 8080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:18080"},
                   {"port": {"number": 7070, "protocol": "TCP", "name": "tcp"}, "defaultEndpoint": "0.0.0.0:17070"},
                   {"port": {"number": 6060}, "defaultEndpoint": "10.0.0.1:6060"},
               ],
               "egress": [{"hosts": ["./*", "bad"]}]}),
    ));
    let s = m.build();
    let chains = inbound_chains(&s, "echo-1");
    let ports: Vec<u32> = chains.iter().filter_map(|(_, p)| *p).collect();
    assert!(ports.contains(&8080) && ports.contains(&7070), "{chains:?}");
    assert!(
        !ports.contains(&9001),
        "service ports are replaced: {chains:?}"
    );
    let clusters = names(&s, "echo-1", type_url::CLUSTER);
    assert!(
        clusters.contains(&"inbound|7070||".to_string()),
        "{clusters:?}"
    );
    assert!(
        !clusters.contains(&"inbound|9001||".to_string()),
        "{clusters:?}"
    );
    let cds = s
        .sidecar(&key("echo-1"))
        .get(type_url::CLUSTER)
        .expect("cds");
    let c7070 = format!(
        "{:?}",
        mesh_proto::envoy::pb::envoy::config::cluster::v3::Cluster::decode(
            cds["inbound|7070||"].body.value.as_slice()
        )
        .expect("cluster")
        .load_assignment
    );
    assert!(
        c7070.contains("10.1.0.5") && c7070.contains("17070"),
        "the pod's address: {c7070}"
    );
    let errors: Vec<String> = (s.sidecar(&key("echo-1")).errors.iter())
        .map(|e| e.to_string())
        .collect();
    for needle in ["ingress[2]", "egress[0].hosts[1]"] {
        assert!(
            errors
                .iter()
                .any(|e| e.contains("Sidecar legacy/echo") && e.contains(needle)),
            "{needle}: {errors:?}"
        );
    }
}

#[test]
fn a_sidecar_change_pushes_only_the_proxies_it_applies_to() {
    let mut m = three_namespaces();
    let mut web = pod_json(
        "shop",
        "web-1",
        "10.1.0.8",
        json!({"app": "web", "security.istio.io/tlsMode": "istio"}),
    );
    web["metadata"]["annotations"] = json!({"sidecar.istio.io/status": "{}"});
    m.apply(obj(web));
    let s1 = m.build();
    let shop_key = WaypointKey {
        namespace: "shop".into(),
        name: "web-1".into(),
    };
    let before = s1.sidecar(&shop_key).changed_in;
    m.apply(sidecar_resource(
        "legacy",
        "default",
        "2024-01-01T00:00:00Z",
        json!({"egress": [{"hosts": ["./*"]}]}),
    ));
    let s2 = m.build();
    assert_eq!(
        s2.sidecar(&shop_key).changed_in,
        before,
        "shop's proxy is not pushed"
    );
    assert!(s2.sidecar(&key("echo-1")).changed_in > before);
}

fn virtual_service(ns: &str, name: &str, spec: serde_json::Value) -> mesh_api::Object {
    obj(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
}

#[test]
fn services_a_scoped_virtual_service_routes_to_come_with_it() {
    let mut m = three_namespaces();
    m.apply(sidecar_resource(
        "legacy",
        "default",
        "2024-01-01T00:00:00Z",
        json!({"egress": [
            {"port": {"number": 9000, "protocol": "TCP"}, "hosts": ["routing/*"]},
            {"hosts": ["./*"]},
        ]}),
    ));
    // Port 9000 is the `routing/*` listener's: echo on 80 and 9090 only.
    let echo = [
        "80||echo.legacy.svc.cluster.local",
        "9090||echo.legacy.svc.cluster.local",
    ];
    assert_eq!(outbound_hosts(&m.build(), "echo-1"), echo);
    // legacy's own VirtualService for echo (imported by `./*` on the catch-all): its
    // destination without a port brings every port of web, its mirror one port of istiod.
    m.apply(virtual_service(
        "legacy",
        "echo",
        json!({"hosts": ["echo"], "http": [{
            "route": [{"destination": {"host": "web.shop.svc.cluster.local"}}],
            "mirror": {"host": "istiod.istio-system.svc.cluster.local", "port": {"number": 9090}},
        }]}),
    ));
    let mut want: Vec<&str> = echo.to_vec();
    want.extend([
        "9090||istiod.istio-system.svc.cluster.local",
        "80||web.shop.svc.cluster.local",
        "9000||web.shop.svc.cluster.local",
        "9090||web.shop.svc.cluster.local",
    ]);
    want.sort();
    assert_eq!(outbound_hosts(&m.build(), "echo-1"), want);
    // A VirtualService in `routing` for shop's web, imported only by the 9000 listener:
    // its destination on that listener's port only.
    m.apply(virtual_service(
        "routing",
        "web",
        json!({"hosts": ["web.shop.svc.cluster.local"], "http": [{
            "route": [{"destination": {"host": "istiod.istio-system.svc.cluster.local", "port": {"number": 9000}}}],
        }]}),
    ));
    want.push("9000||istiod.istio-system.svc.cluster.local");
    want.sort();
    let s = m.build();
    assert_eq!(outbound_hosts(&s, "echo-1"), want);
    let errors = s.sidecar(&key("echo-1")).errors.clone();
    assert!(errors.is_empty(), "{errors:?}");
    // Without the Sidecar nothing is inferred: everything, as before.
    m.delete(&ObjectKey::new(Kind::Sidecar, "legacy", "default"));
    assert_eq!(outbound_hosts(&m.build(), "echo-1").len(), 9);
}

#[test]
fn a_pod_that_loses_its_sidecar_gets_an_empty_push_then_is_forgotten() {
    let mut m = legacy();
    let before = m.build().sidecar(&key("echo-1")).changed_in;
    // The same pod without the injector's annotation (no sidecar any more).
    m.apply(obj(pod_json(
        "legacy",
        "echo-1",
        "10.1.0.5",
        json!({"app": "echo"}),
    )));
    let s = m.build();
    let view = s.sidecar(&key("echo-1"));
    assert!(view.changed_in > before, "its proxy is told");
    assert!(view.by_type.values().all(|r| r.is_empty()));
    m.delete(&ObjectKey::new(Kind::Pod, "legacy", "echo-1"));
    assert_eq!(m.build().sidecars().count(), 0);
}
