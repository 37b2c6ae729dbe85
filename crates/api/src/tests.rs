use serde_json::json;

use crate::*;

#[test]
fn decodes_pod_and_defaults_namespace() {
    let obj = Object::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a", "labels": {"app": "x"}},
        "spec": {"nodeName": "node1", "serviceAccountName": "sa", "containers": []},
        "status": {"podIP": "10.0.0.1", "phase": "Running"}
    }))
    .expect("valid pod");
    assert_eq!(obj.key(), ObjectKey::new(Kind::Pod, "default", "a"));
    let Object::Pod(pod) = obj else {
        panic!("not a pod")
    };
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        pod.status.and_then(|s| s.pod_ip).as_deref(),
        Some("10.0.0.1")
    );
}

#[test]
fn decodes_authorization_policy() {
    let obj = Object::from_value(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"action": "DENY", "selector": {"matchLabels": {"app": "a"}},
                 "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"]}}],
                            "to": [{"operation": {"ports": ["80"]}}],
                            "when": [{"key": "source.ip", "values": ["10.0.0.0/8"]}]}]}
    }))
    .expect("valid policy");
    let Object::AuthorizationPolicy(p) = obj else {
        panic!("not a policy")
    };
    assert_eq!(p.spec.action, AuthorizationAction::Deny);
    let rules = p.spec.rules.expect("rules");
    assert_eq!(rules[0].to[0].operation.ports, vec!["80"]);
    assert_eq!(rules[0].when[0].key, "source.ip");
}

#[test]
fn errors_name_the_field() {
    let err = Object::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "s", "namespace": "ns"},
        "spec": {"ports": [{"port": "eighty"}]}
    }))
    .expect_err("bad port");
    let msg = err.to_string();
    assert!(msg.contains("spec.ports[0].port"), "{msg}");
    assert_eq!(err.reason(), "invalid_field");
}

#[test]
fn rejects_unknown_kinds_and_missing_names() {
    let err = Object::from_value(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "d"}}))
    .expect_err("unsupported");
    assert!(matches!(err, ApiError::UnsupportedKind { .. }), "{err}");
    let err = Object::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {}}))
        .expect_err("no name");
    assert!(
        matches!(err, ApiError::MissingName { kind: Kind::Pod }),
        "{err}"
    );
    let err = Object::from_value(json!({"kind": "Pod"})).expect_err("no apiVersion");
    assert!(matches!(
        err,
        ApiError::MissingTypeField {
            field: "apiVersion"
        }
    ));
}

#[test]
fn accepts_istio_api_versions() {
    assert_eq!(
        Kind::from_type("networking.istio.io/v1alpha3", "ServiceEntry"),
        Some(Kind::ServiceEntry)
    );
    assert_eq!(
        Kind::from_type("security.istio.io/v1beta1", "PeerAuthentication"),
        Some(Kind::PeerAuthentication)
    );
    assert_eq!(Kind::from_type("v1", "ServiceEntry"), None);
}

#[test]
fn selector_matching() {
    let sel = [("app".to_string(), "a".to_string())].into_iter().collect();
    let labels = [
        ("app".to_string(), "a".to_string()),
        ("x".into(), "y".into()),
    ]
    .into_iter()
    .collect();
    assert!(selector_matches(&sel, Some(&labels)));
    assert!(!selector_matches(&sel, None));
    assert!(selector_matches(&Default::default(), None));
}
