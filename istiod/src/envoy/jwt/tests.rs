//! RequestAuthentication -> `jwt_authn`, and the RBAC principals that read its payload.

use std::sync::Arc;

use mesh_proto::envoy::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    jwt_provider::JwksSourceSpecifier, jwt_requirement::RequiresType,
    requirement_rule::RequirementType, JwtAuthentication,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::http::rbac::v3::Rbac as RbacFilter;
use prost::Message;

use super::*;
use crate::envoy::generate_waypoint;
use crate::envoy::tests::{chain_hcm, envoy_or_skip, envoy_validates, http_filter_names, inputs};
use crate::envoy::{RouteError, WaypointPolicy};

const CHAIN: &str = "inbound-vip|80|http|echo.shop.svc.cluster.local";

const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;

fn authn(yaml: &str) -> WaypointRequestAuthn {
    let ra: mesh_api::RequestAuthentication = serde_yaml::from_str(yaml).expect("yaml");
    WaypointRequestAuthn {
        key: format!("shop/{}", ra.metadata.name.clone().unwrap_or_default()),
        policy: Arc::new(ra),
    }
}

fn two_issuers() -> Vec<WaypointRequestAuthn> {
    vec![
        authn(&format!(
            r#"
metadata: {{name: later, namespace: shop}}
spec:
  targetRefs: [{{kind: Service, name: echo}}]
  jwtRules:
  - issuer: https://z.example
    jwks: '{JWKS}'
    audiences: [echo]
    forwardOriginalToken: true
    fromHeaders: [{{name: x-token, prefix: "Token "}}]
    outputClaimToHeaders: [{{header: x-user, claim: sub}}]
"#
        )),
        authn(&format!(
            r#"
metadata: {{name: first, namespace: shop}}
spec:
  targetRefs: [{{kind: Service, name: echo}}]
  jwtRules:
  - issuer: https://a.example
    jwks: '{JWKS}'
"#
        )),
    ]
}

fn jwt_of(res: &crate::envoy::ProxyResources) -> JwtAuthentication {
    let hcm = chain_hcm(res, CHAIN);
    let f = (hcm.http_filters.iter())
        .find(|f| f.name == JWT_FILTER)
        .expect("jwt_authn filter");
    let Some(mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("typed config");
    };
    JwtAuthentication::decode(any.value.as_slice()).expect("decodes")
}

#[test]
fn rules_become_providers_in_issuer_order_ahead_of_rbac() {
    let mut inp = inputs();
    inp.services[0].request_authns = two_issuers();
    let res = generate_waypoint(&inp, 1);
    let names = http_filter_names(&res, CHAIN);
    assert_eq!(
        names.first().map(String::as_str),
        Some(JWT_FILTER),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.contains("rbac")), "{names:?}");
    let jwt = jwt_of(&res);
    let a = &jwt.providers["origins-0"];
    let z = &jwt.providers["origins-1"];
    assert_eq!(
        (a.issuer.as_str(), z.issuer.as_str()),
        ("https://a.example", "https://z.example")
    );
    assert_eq!(z.audiences, ["echo"]);
    assert!(z.forward && !a.forward);
    assert_eq!(z.from_headers[0].name, "x-token");
    assert_eq!(z.from_headers[0].value_prefix, "Token ");
    assert_eq!(z.claim_to_headers[0].header_name, "x-user");
    for p in [a, z] {
        assert_eq!(p.payload_in_metadata, "payload");
        assert!(matches!(
            &p.jwks_source_specifier,
            Some(JwksSourceSpecifier::LocalJwks(d)) if format!("{d:?}").contains("f83OJ3D2")
        ));
    }
    // One rule for every path: either provider's token, or none at all.
    let [rule] = jwt.rules.as_slice() else {
        panic!("{:?}", jwt.rules)
    };
    let Some(RequirementType::Requires(req)) = &rule.requirement_type else {
        panic!("{rule:?}")
    };
    let Some(RequiresType::RequiresAny(any)) = &req.requires_type else {
        panic!("{req:?}")
    };
    let kinds: Vec<String> = (any.requirements.iter())
        .map(|r| match &r.requires_type {
            Some(RequiresType::ProviderName(n)) => n.clone(),
            Some(RequiresType::RequiresAll(all)) => format!("all of {}", all.requirements.len()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["origins-0", "origins-1", "all of 2"]);
    assert!(
        res.errors
            .iter()
            .all(|e| !matches!(e, RouteError::Authn(_))),
        "{:?}",
        res.errors
    );
}

#[test]
fn one_provider_accepts_its_token_or_none() {
    let one = two_issuers().remove(1);
    let mut errors = Vec::new();
    let jwt = filter(&[one], &mut errors).expect("filter");
    let Some(RequirementType::Requires(req)) = &jwt.rules[0].requirement_type else {
        panic!()
    };
    let dump = format!("{req:?}");
    assert!(
        dump.contains("ProviderName(\"origins-0\")") && dump.contains("AllowMissing"),
        "{dump}"
    );
    assert!(
        !dump.contains("AllowMissingOrFailed"),
        "a bad token must fail: {dump}"
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(filter(&[], &mut errors).is_none());
}

#[test]
fn unusable_rules_are_reported_and_reject_their_tokens() {
    let bad = authn(&format!(
        r#"
metadata: {{name: bad, namespace: shop}}
spec:
  targetRefs: [{{kind: Service, name: echo}}]
  jwtRules:
  - issuer: https://broken.example
    jwks: '{{"keys": "nope"}}'
  - issuer: https://remote.example
    jwksUri: https://remote.example/keys
  - audiences: [x]
  - issuer: https://headers.example
    jwks: '{JWKS}'
    fromHeaders: [{{name: "bad header"}}]
    fromParams: [token]
    outputClaimToHeaders: [{{header: x-ok, claim: ""}}]
    timeout: soon
  - issuer: https://nowhere.example
    jwks: '{JWKS}'
    fromHeaders: [{{name: ""}}]
"#
    ));
    let mut errors = Vec::new();
    let jwt = filter(&[bad], &mut errors).expect("filter");
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let has = |needle: &str| text.iter().any(|t| t.contains(needle));
    assert!(has("jwtRules[0].jwks: not a key set"), "{text:#?}");
    assert!(has("jwtRules[1].jwksUri"), "{text:#?}");
    assert!(
        has("jwtRules[2]: issuer or jwksUri must be set; the rule is ignored"),
        "{text:#?}"
    );
    assert!(has("fromHeaders[0].name"), "{text:#?}");
    assert!(has("outputClaimToHeaders[0]"), "{text:#?}");
    assert!(has("timeout"), "{text:#?}");
    assert!(
        has("fromHeaders: no valid token location is left"),
        "{text:#?}"
    );
    // Four providers stay (the rule without issuer or key source is dropped); the broken, the
    // remote and the one without a valid location verify nothing.
    assert_eq!(jwt.providers.len(), 4);
    for p in jwt.providers.values() {
        let Some(JwksSourceSpecifier::LocalJwks(d)) = &p.jwks_source_specifier else {
            panic!("{p:?}")
        };
        let dump = format!("{d:?}");
        let unusable = dump.contains("\\\"kid\\\":\\\"unusable\\\"");
        assert_eq!(
            unusable,
            p.issuer != "https://headers.example",
            "{}: {dump}",
            p.issuer
        );
        if p.issuer == "https://headers.example" {
            assert!(p.from_headers.is_empty() && p.claim_to_headers.is_empty());
        }
    }
    for e in &errors {
        assert!(e.reason().ends_with("request_authentication"));
    }
}

/// The (issuer, subject) patterns of a `requestPrincipals` value, checking the metadata paths.
fn principal_patterns(value: &str) -> (MatchPattern, MatchPattern) {
    let Some(principal::Identifier::AndIds(set)) = request_principal(value).identifier else {
        panic!("{value}: not an and of two claims")
    };
    let claim = |p: &Principal, want: &str| {
        let Some(principal::Identifier::SourcedMetadata(sm)) = &p.identifier else {
            panic!("{value}: {p:?}")
        };
        let m = sm.metadata_matcher.as_ref().expect("matcher");
        assert_eq!(m.filter, JWT_FILTER);
        let path: Vec<String> = (m.path.iter())
            .filter_map(|s| {
                let metadata_matcher::path_segment::Segment::Key(k) = s.segment.as_ref()?;
                Some(k.clone())
            })
            .collect();
        assert_eq!(path, ["payload", want], "{value}");
        match m.value.as_ref().and_then(|v| v.match_pattern.clone()) {
            Some(value_matcher::MatchPattern::StringMatch(s)) => s.match_pattern.expect("pattern"),
            other => panic!("{value}: {other:?}"),
        }
    };
    let [iss, sub] = set.ids.as_slice() else {
        panic!("{value}: {set:?}")
    };
    (claim(iss, "iss"), claim(sub, "sub"))
}

#[test]
fn request_principals_split_at_the_last_slash() {
    let exact = |s: &str| MatchPattern::Exact(s.into());
    let any = present();
    for (value, iss, sub) in [
        (
            "https://issuer.example/tenant/alice",
            exact("https://issuer.example/tenant"),
            exact("alice"),
        ),
        ("*", any.clone(), any.clone()),
        ("*/alice", any.clone(), exact("alice")),
        (
            "*.example/alice",
            MatchPattern::Suffix(".example".into()),
            exact("alice"),
        ),
        (
            "*@example.com",
            any.clone(),
            MatchPattern::Suffix("@example.com".into()),
        ),
        (
            "https://issuer.example/*",
            exact("https://issuer.example"),
            any.clone(),
        ),
        (
            "https://issuer.example/svc-*",
            exact("https://issuer.example"),
            MatchPattern::Prefix("svc-".into()),
        ),
        ("https*", MatchPattern::Prefix("https".into()), any.clone()),
        ("no-slash", exact("no-slash"), exact("")),
    ] {
        assert_eq!(principal_patterns(value), (iss, sub), "{value}");
    }
}

#[test]
fn claim_paths_come_from_nested_brackets() {
    assert_eq!(
        claim_path("request.auth.claims[groups]"),
        Some(vec!["groups"])
    );
    assert_eq!(
        claim_path("request.auth.claims[realm][roles]"),
        Some(vec!["realm", "roles"])
    );
    for bad in [
        "request.auth.claims",
        "request.auth.claims[",
        "request.auth.claims[]",
        "request.auth.claims[a]b",
        "request.auth.claimsx",
        "request.auth.claims[a[b]]",
    ] {
        assert_eq!(claim_path(bad), None, "{bad}");
    }
}

fn allow_alice() -> WaypointPolicy {
    let policy: mesh_api::AuthorizationPolicy = serde_yaml::from_str(
        r#"
metadata: {name: alice, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: echo}]
  rules:
  - from: [{source: {requestPrincipals: ["https://a.example/alice"], notRequestPrincipals: ["*/mallory"]}}]
    when:
    - {key: "request.auth.claims[groups]", values: ["admins"]}
    - {key: request.auth.audiences, values: ["echo"]}
    - {key: request.auth.presenter, notValues: ["bad-client"]}
    - {key: request.auth.principal, values: ["https://a.example/*"]}
  - when: [{key: "request.auth.claims[", values: ["x"]}]
"#,
    )
    .expect("policy");
    WaypointPolicy {
        key: "shop/alice".into(),
        policy: Arc::new(policy),
    }
}

#[test]
fn token_attributes_become_rbac_matches_on_the_verified_payload() {
    let mut inp = inputs();
    inp.services[0].request_authns = two_issuers();
    inp.services[0].policies = vec![allow_alice()];
    let res = generate_waypoint(&inp, 1);
    let hcm = chain_hcm(&res, CHAIN);
    let rbac = (hcm.http_filters.iter())
        .find(|f| f.name.contains("rbac"))
        .and_then(|f| match &f.config_type {
            Some(mesh_proto::envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(a)) => {
                RbacFilter::decode(a.value.as_slice()).ok()
            }
            _ => None,
        })
        .expect("rbac filter");
    let dump = format!("{rbac:?}");
    for needle in [
        "\"payload\"",
        "\"groups\"",
        "\"aud\"",
        "\"azp\"",
        "Exact(\"admins\")",
        "Exact(\"mallory\")",
        "NotId",
        "ListMatch",
        "SourcedMetadata",
    ] {
        assert!(dump.contains(needle), "{needle} missing from {dump}");
    }
    // The malformed claim key fails its ALLOW rule closed, and says so.
    let text: Vec<String> = res.errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("request.auth.claims[") && t.contains("never matches")),
        "{text:#?}"
    );
    // On the TCP port token attributes cannot be checked: reported, the rule never matches.
    assert!(
        text.iter()
            .any(|t| t.contains("requestPrincipals on a TCP port")),
        "{text:#?}"
    );
}

#[test]
fn envoy_validates_jwt_authentication_and_token_policies() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    let mut inp = inputs();
    inp.services[0].request_authns = two_issuers();
    inp.services[0].policies = vec![allow_alice()];
    inp.services[1].request_authns = vec![authn(
        r#"
metadata: {name: remote, namespace: shop}
spec:
  targetRefs: [{kind: Service, name: echo-v1}]
  jwtRules:
  - issuer: https://remote.example
    jwksUri: https://remote.example/keys
"#,
    )];
    envoy_validates(&envoy, &generate_waypoint(&inp, 1));
}

#[test]
fn key_sets_envoy_would_refuse_are_caught() {
    let off_curve = JWKS.replace("f83OJ3D2", "f83OJ3D3");
    let short_rsa = r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#;
    let cases = [
        (
            r#"{"keys":[{"kty":"EC","crv":"P-256"}]}"#,
            "keys[0]: no \"x\"",
        ),
        (off_curve.as_str(), "the point is not on P-256"),
        (short_rsa, "shorter than 1024 bits"),
        (
            r#"{"keys":[{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}]}"#,
            "not supported",
        ),
        (r#"{"keys":[{"kty":"oct","k":"!!"}]}"#, "not base64url"),
        (
            r#"{"keys":[{"kty":"RSA","kid":7}]}"#,
            "\"kid\" is not a string",
        ),
        (r#"{"keys":[]}"#, "no keys"),
        ("not json", "not JSON"),
    ];
    for (jwks, want) in cases {
        let got = check_jwks(jwks).expect_err(jwks);
        assert!(got.contains(want), "{jwks}: {got}");
    }
    assert_eq!(check_jwks(JWKS), Ok(()));
    let unusable = unusable_jwks().expect("a key");
    assert_eq!(check_jwks(&unusable), Ok(()), "{unusable}");
}

/// Keys of every type the check accepts, as a key set Envoy must load.
fn every_key_type() -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P384_SHA384_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let p384 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, &rng).expect("p384");
    let p384 = EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, p384.as_ref(), &rng)
        .expect("p384 key");
    let point = p384.public_key().as_ref();
    let ed = Ed25519KeyPair::generate_pkcs8(&rng).expect("ed25519");
    let ed = Ed25519KeyPair::from_pkcs8(ed.as_ref()).expect("ed25519 key");
    // The RSA public key of RFC 7517's example (appendix A.1).
    let rsa_n = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWWRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";
    let jwks: serde_json::Value = serde_json::from_str(JWKS).expect("jwks");
    let mut keys = jwks["keys"].as_array().cloned().expect("keys");
    keys.extend([
        serde_json::json!({"kty": "EC", "alg": "ES384", "kid": "p384",
            "x": URL_SAFE_NO_PAD.encode(&point[1..49]), "y": URL_SAFE_NO_PAD.encode(&point[49..97])}),
        serde_json::json!({"kty": "RSA", "alg": "RS256", "kid": "rsa", "n": rsa_n, "e": "AQAB"}),
        serde_json::json!({"kty": "RSA", "alg": "PS384", "kid": "rsa-pss", "n": rsa_n, "e": "AQAB"}),
        serde_json::json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "kid": "ed",
            "x": URL_SAFE_NO_PAD.encode(ed.public_key().as_ref())}),
        serde_json::json!({"kty": "oct", "alg": "HS256", "kid": "hmac", "k": "c2VjcmV0LWtleQ"}),
    ]);
    serde_json::json!({"keys": keys}).to_string()
}

#[test]
fn key_types_and_algorithms_must_fit() {
    let every = every_key_type();
    assert_eq!(check_jwks(&every), Ok(()), "{every}");
    let rsa = |e: &str, alg: &str| {
        let mut k: serde_json::Value = serde_json::from_str(&every).expect("json");
        let rsa = k["keys"][2].clone();
        let mut rsa = rsa.as_object().cloned().expect("rsa");
        rsa.insert("e".into(), e.into());
        rsa.insert("alg".into(), alg.into());
        k["keys"] = serde_json::json!([rsa]);
        k.to_string()
    };
    for (jwks, want) in [
        (rsa("BQ", "RS256"), "3 or 65537"),
        (rsa("AQAB", "ES256"), "does not fit"),
        (
            JWKS.replace("\"crv\":\"P-256\"", "\"crv\":1"),
            "\"crv\" is not a string",
        ),
        (
            JWKS.replace("\"crv\":\"P-256\"", "\"alg\":\"ES384\""),
            "must be 48 bytes",
        ),
        (
            JWKS.replace("\"crv\":\"P-256\"", "\"crv\":\"P-256\",\"alg\":\"ES384\""),
            "does not fit",
        ),
        (
            r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","alg":"RS256"}]}"#.to_string(),
            "does not fit",
        ),
    ] {
        let got = check_jwks(&jwks).expect_err(&jwks);
        assert!(got.contains(want), "{jwks}: {got}");
    }
}

#[test]
fn envoy_loads_every_key_set_the_check_accepts() {
    let Some(envoy) = envoy_or_skip() else {
        return;
    };
    let mut inp = inputs();
    inp.services[0].request_authns = vec![authn(&format!(
        r#"
metadata: {{name: every, namespace: shop}}
spec:
  targetRefs: [{{kind: Service, name: echo}}]
  jwtRules:
  - issuer: https://every.example
    jwks: '{}'
"#,
        every_key_type()
    ))];
    let res = generate_waypoint(&inp, 1);
    assert!(
        res.errors
            .iter()
            .all(|e| !matches!(e, RouteError::Authn(_))),
        "{:?}",
        res.errors
    );
    envoy_validates(&envoy, &res);
}
