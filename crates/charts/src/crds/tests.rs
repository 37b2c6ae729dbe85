use super::*;

fn spec_schema(kind: &str) -> Value {
    let crd = crds()
        .expect("generates")
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .expect("known kind");
    let schema = crd.spec.versions[0]
        .schema
        .clone()
        .and_then(|s| s.open_api_v3_schema)
        .expect("has a schema");
    serde_json::to_value(schema).expect("serializes")["properties"]["spec"].clone()
}

/// Walks a schema as the API server checks a structural schema: every node has a type or
/// keeps unknown fields, and no node refers elsewhere, defaults or requires.
fn assert_structural(path: &str, schema: &Value) {
    let fields = schema
        .as_object()
        .unwrap_or_else(|| panic!("{path}: not an object"));
    assert!(
        fields.contains_key("type") || fields.contains_key("x-kubernetes-preserve-unknown-fields"),
        "{path}: no type: {schema}"
    );
    for banned in ["$ref", "default", "anyOf", "oneOf", "allOf", "required"] {
        assert!(
            !fields.contains_key(banned),
            "{path}: has {banned}: {schema}"
        );
    }
    if let Some(Value::Object(properties)) = fields.get("properties") {
        // A typed object keeps the fields the mesh's types do not list.
        assert_eq!(
            fields.get("x-kubernetes-preserve-unknown-fields"),
            Some(&Value::Bool(true)),
            "{path}: would prune unknown fields"
        );
        for (name, property) in properties {
            assert_structural(&format!("{path}.{name}"), property);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = fields.get(key) {
            assert_structural(&format!("{path}[{key}]"), inner);
        }
    }
}

#[test]
fn every_crd_is_istios_name_group_and_versions() {
    let crds = crds().expect("generates");
    assert_eq!(crds.len(), 15);
    let names: Vec<String> = crds
        .iter()
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect();
    for name in [
        "authorizationpolicies.security.istio.io",
        "peerauthentications.security.istio.io",
        "requestauthentications.security.istio.io",
        "virtualservices.networking.istio.io",
        "telemetries.telemetry.istio.io",
        "wasmplugins.extensions.istio.io",
    ] {
        assert!(
            names.contains(&name.to_string()),
            "{name} missing: {names:?}"
        );
    }
    for crd in &crds {
        let storage: Vec<&str> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.storage)
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            storage.len(),
            1,
            "{:?}: one storage version",
            crd.metadata.name
        );
        assert!(crd.spec.versions.iter().all(|v| v.served));
    }
}

#[test]
fn specs_the_mesh_reads_are_typed_and_keep_unknown_fields() {
    let ap = spec_schema("AuthorizationPolicy");
    assert_eq!(
        ap["properties"]["action"]["enum"],
        json!(["ALLOW", "DENY", "AUDIT", "CUSTOM"])
    );
    assert_eq!(ap["properties"]["rules"]["type"], "array");
    assert_eq!(ap["x-kubernetes-preserve-unknown-fields"], true);
    let rule = &ap["properties"]["rules"]["items"];
    assert_eq!(rule["x-kubernetes-preserve-unknown-fields"], true);
    assert_eq!(
        rule["properties"]["from"]["items"]["properties"]["source"]["properties"]["principals"]
            ["items"]["type"],
        "string"
    );

    let se = spec_schema("ServiceEntry");
    assert_eq!(
        se["properties"]["resolution"]["enum"],
        json!(["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"])
    );
    assert_eq!(
        se["properties"]["ports"]["items"]["properties"]["number"]["type"],
        "integer"
    );

    let pa = spec_schema("PeerAuthentication");
    assert_eq!(
        pa["properties"]["portLevelMtls"]["additionalProperties"]["properties"]["mode"]["enum"],
        json!(["UNSET", "DISABLE", "PERMISSIVE", "STRICT"])
    );

    let sc = spec_schema("Sidecar");
    assert_eq!(
        sc["properties"]["egress"]["items"]["properties"]["hosts"]["items"]["type"],
        "string"
    );
    assert_eq!(
        sc["properties"]["egress"]["items"]["properties"]["captureMode"]["enum"],
        json!(["DEFAULT", "IPTABLES", "NONE"])
    );
    assert_eq!(
        sc["properties"]["outboundTrafficPolicy"]["properties"]["mode"]["enum"],
        json!(["REGISTRY_ONLY", "ALLOW_ANY"])
    );
    assert_eq!(
        sc["properties"]["ingress"]["items"]["properties"]["port"]["properties"]["number"]["type"],
        "integer"
    );
}

#[test]
fn the_istio_gateway_schema_has_its_servers() {
    let gw = spec_schema("Gateway");
    let server = &gw["properties"]["servers"]["items"]["properties"];
    assert_eq!(server["hosts"]["items"]["type"], "string");
    assert_eq!(server["port"]["properties"]["number"]["type"], "integer");
    assert_eq!(
        server["tls"]["properties"]["httpsRedirect"]["type"],
        "boolean"
    );
    assert_eq!(
        gw["properties"]["selector"]["additionalProperties"]["type"],
        "string"
    );
}

#[test]
fn kinds_the_mesh_does_not_read_keep_their_spec_as_written() {
    for kind in ["EnvoyFilter", "Telemetry", "WasmPlugin"] {
        let spec = spec_schema(kind);
        assert_eq!(spec["type"], "object", "{kind}");
        assert_eq!(spec["x-kubernetes-preserve-unknown-fields"], true, "{kind}");
        assert!(spec.get("properties").is_none(), "{kind}");
    }
}

#[test]
fn every_schema_is_structural() {
    for crd in crds().expect("generates") {
        for version in &crd.spec.versions {
            let schema = serde_json::to_value(&version.schema).expect("serializes");
            let path = format!("{}/{}", crd.spec.names.kind, version.name);
            let root = &schema["openAPIV3Schema"];
            assert_structural(&path, &root["properties"]["spec"]);
            assert_structural(&path, &root["properties"]["status"]);
        }
    }
}
