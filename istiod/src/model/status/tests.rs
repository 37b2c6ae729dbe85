//! Status conditions through the model: waypoint binding and policy acceptance.

use mesh_api::{Kind, Object, ObjectKey, StatusCondition};
use serde_json::json;

use super::{StatusWriter, WAYPOINT_ACCEPTED, WAYPOINT_BOUND, ZTUNNEL_ACCEPTED};
use crate::model::testing::{namespace, obj};
use crate::model::{Model, ModelConfig};

fn waypoint(ready: bool) -> Object {
    let addresses = if ready {
        json!([{"type": "Hostname", "value": "waypoint.shop.svc.cluster.local"}])
    } else {
        json!([])
    };
    obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "shop", "generation": 1},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
        "status": {"addresses": addresses},
    }))
}

fn labelled_service(name: &str, labels: serde_json::Value) -> Object {
    obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "spec": {"selector": {"app": name}, "clusterIP": "10.96.0.9",
                 "ports": [{"name": "http", "port": 80}]},
    }))
}

fn conditions(m: &mut Model, kind: Kind, name: &str, w: StatusWriter) -> Vec<StatusCondition> {
    let snap = m.build();
    snap.statuses()
        .get(&(ObjectKey::new(kind, "shop", name), w))
        .cloned()
        .unwrap_or_default()
}

fn one(c: &[StatusCondition]) -> (&str, &str, &str, &str) {
    assert_eq!(c.len(), 1, "{c:?}");
    (&c[0].type_, &c[0].status, &c[0].reason, &c[0].message)
}

#[test]
fn a_service_naming_a_waypoint_is_bound_once_the_waypoint_is_ready() {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("shop", json!({})));
    m.apply(labelled_service(
        "reviews",
        json!({"istio.io/use-waypoint": "waypoint"}),
    ));
    m.apply(labelled_service("plain", json!({})));
    let c = conditions(&mut m, Kind::Service, "reviews", StatusWriter::Service);
    assert_eq!(
        one(&c),
        (
            WAYPOINT_BOUND,
            "False",
            "WaypointIsNotReady",
            "waypoint \"shop/waypoint\" is not ready"
        )
    );
    m.apply(waypoint(false));
    let c = conditions(&mut m, Kind::Service, "reviews", StatusWriter::Service);
    assert_eq!(one(&c).2, "WaypointIsNotReady", "no address yet");
    m.apply(waypoint(true));
    let c = conditions(&mut m, Kind::Service, "reviews", StatusWriter::Service);
    assert_eq!(
        one(&c),
        (
            WAYPOINT_BOUND,
            "True",
            "WaypointAccepted",
            "Successfully attached to waypoint shop/waypoint"
        )
    );
    assert!(
        conditions(&mut m, Kind::Service, "plain", StatusWriter::Service).is_empty(),
        "no waypoint, no condition"
    );

    // The namespace's label binds the others; `none` opts one out; ingress is reported.
    m.apply(namespace(
        "shop",
        json!({"istio.io/use-waypoint": "waypoint"}),
    ));
    assert_eq!(
        conditions(&mut m, Kind::Service, "plain", StatusWriter::Service)[0].status,
        "True"
    );
    m.apply(labelled_service(
        "plain",
        json!({"istio.io/use-waypoint": "none"}),
    ));
    assert!(conditions(&mut m, Kind::Service, "plain", StatusWriter::Service).is_empty());
    m.apply(labelled_service(
        "reviews",
        json!({"istio.io/use-waypoint": "waypoint", "istio.io/ingress-use-waypoint": "true"}),
    ));
    let c = conditions(&mut m, Kind::Service, "reviews", StatusWriter::Service);
    assert!(
        one(&c)
            .3
            .ends_with(". Ingress traffic will traverse the waypoint"),
        "{c:?}"
    );
}

fn policy_with_generation(name: &str, spec: serde_json::Value) -> Object {
    obj(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "shop", "generation": 3},
        "spec": spec,
    }))
}

#[test]
fn ztunnel_policies_are_accepted_warned_or_refused() {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("shop", json!({})));
    m.apply(policy_with_generation(
        "l4",
        json!({"action": "ALLOW", "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/a"]}}]}]}),
    ));
    m.apply(policy_with_generation(
        "l7",
        json!({"action": "ALLOW", "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
    ));
    m.apply(policy_with_generation(
        "audit",
        json!({"action": "AUDIT", "rules": [{}]}),
    ));
    let snap = m.build();
    let get = |name: &str| {
        snap.statuses()
            .get(&(
                ObjectKey::new(Kind::AuthorizationPolicy, "shop", name),
                StatusWriter::ZtunnelPolicy,
            ))
            .cloned()
            .unwrap_or_default()
    };
    let l4 = get("l4");
    assert_eq!(
        one(&l4),
        (ZTUNNEL_ACCEPTED, "True", "Accepted", "attached to ztunnel")
    );
    assert_eq!(l4[0].observed_generation, Some(3));
    let l7 = get("l7");
    let (_, status, reason, message) = one(&l7);
    assert_eq!((status, reason), ("True", "UnsupportedValue"));
    assert!(
        message.starts_with("ztunnel does not support HTTP attributes (found: "),
        "{message}"
    );
    let audit = get("audit");
    assert_eq!(
        one(&audit),
        (
            ZTUNNEL_ACCEPTED,
            "False",
            "UnsupportedValue",
            "ztunnel does not support the AUDIT action"
        )
    );
}

#[test]
fn waypoint_policies_report_each_target() {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("shop", json!({})));
    m.apply(waypoint(true));
    m.apply(labelled_service(
        "reviews",
        json!({"istio.io/use-waypoint": "waypoint"}),
    ));
    m.apply(labelled_service("ratings", json!({})));
    let target = |kind: &str, name: &str| {
        let group = if kind.starts_with("Gateway") {
            "gateway.networking.k8s.io"
        } else {
            ""
        };
        json!({"kind": kind, "group": group, "name": name})
    };
    let cases = [
        (
            vec![target("Service", "reviews")],
            ("True", "Accepted", "bound to shop/waypoint".to_string()),
        ),
        (
            vec![target("Gateway", "waypoint")],
            ("True", "Accepted", "bound to shop/waypoint".to_string()),
        ),
        (
            vec![target("Service", "ratings")],
            (
                "False",
                "AncestorNotBound",
                "Service shop/ratings is not bound to a waypoint".to_string(),
            ),
        ),
        (
            vec![target("Service", "gone")],
            (
                "False",
                "TargetNotFound",
                "Service shop/gone was not found".to_string(),
            ),
        ),
        (
            vec![target("GatewayClass", "istio-waypoint")],
            (
                "False",
                "Invalid",
                "GatewayClass targets are only honoured in the root namespace istio-system"
                    .to_string(),
            ),
        ),
        (
            vec![target("Service", "reviews"), target("Service", "gone")],
            (
                "True",
                "PartiallyInvalid",
                "Invalid targetRefs: Service.:shop/gone".to_string(),
            ),
        ),
    ];
    for (i, (targets, want)) in cases.into_iter().enumerate() {
        let name = format!("p{i}");
        m.apply(policy_with_generation(
            &name,
            json!({"targetRefs": targets, "action": "ALLOW", "rules": [{}]}),
        ));
        let c = conditions(
            &mut m,
            Kind::AuthorizationPolicy,
            &name,
            StatusWriter::WaypointPolicy,
        );
        let (type_, status, reason, message) = one(&c);
        assert_eq!(type_, WAYPOINT_ACCEPTED);
        assert_eq!(
            (status, reason, message),
            (want.0, want.1, want.2.as_str()),
            "case {i}"
        );
        assert!(
            conditions(
                &mut m,
                Kind::AuthorizationPolicy,
                &name,
                StatusWriter::ZtunnelPolicy
            )
            .is_empty(),
            "a waypoint policy is not ztunnel's"
        );
    }
}

#[test]
fn conditions_are_worked_out_again_only_after_changes_that_can_move_them() {
    let mut m = Model::new(ModelConfig::default());
    m.apply(namespace("shop", json!({})));
    m.apply(labelled_service(
        "reviews",
        json!({"istio.io/use-waypoint": "waypoint"}),
    ));
    let first = m.build();
    // A pod (the common change) cannot change a condition: the same conditions are kept.
    m.apply(crate::model::testing::pod(
        "shop",
        "p",
        "10.0.0.9",
        json!({}),
    ));
    let second = m.build();
    assert!(std::sync::Arc::ptr_eq(&first.statuses, &second.statuses));
    // The waypoint appearing can.
    m.apply(waypoint(true));
    let third = m.build();
    assert!(!std::sync::Arc::ptr_eq(&second.statuses, &third.statuses));
    let c = &third.statuses()[&(
        ObjectKey::new(Kind::Service, "shop", "reviews"),
        StatusWriter::Service,
    )];
    assert_eq!(one(c).1, "True");
}
