//! RequestAuthentications on a waypoint -> Envoy's `jwt_authn` HTTP filter, and the RBAC
//! principals that read what it verified (`requestPrincipals`, `request.auth.*`).
//!
//! As Istio generates it (docs/waypoints.md, "Request authentication"):
//! - every `jwtRules` entry of every attached RequestAuthentication is one provider, named
//!   `origins-<i>` in order of issuer;
//! - one requirement for every path: a valid token of any provider, or no token at all. A
//!   missing token passes (an AuthorizationPolicy decides whether one is needed); a token that
//!   fails verification is answered 401;
//! - the verified payload is kept in the dynamic metadata of `envoy.filters.http.jwt_authn`
//!   under `payload`, where RBAC matches `iss`, `sub`, `aud`, `azp` and any claim.
//!
//! Key sets come from `jwks` (inline). A rule whose key set is missing, invalid or only named
//! by `jwksUri` (not fetched by this istiod yet) keeps its provider with a key set no token
//! verifies against, so tokens of that issuer are rejected with 401, as Istio does when it
//! cannot fetch a key set. Every such problem is reported.

use std::sync::LazyLock;
use std::time::Duration;

use mesh_api::JwtRule;
use mesh_proto::envoy::pb::envoy::config::core::v3::{data_source, DataSource};
use mesh_proto::envoy::pb::envoy::config::rbac::v3::{
    principal, MetadataSource, Principal, SourcedMetadata,
};
use mesh_proto::envoy::pb::envoy::config::route::v3::{route_match::PathSpecifier, RouteMatch};
use mesh_proto::envoy::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    jwt_provider::{JwksSourceSpecifier, NormalizePayload},
    jwt_requirement::RequiresType,
    requirement_rule::RequirementType,
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RequirementRule,
};
use mesh_proto::envoy::pb::envoy::r#type::matcher::v3::{
    list_matcher, metadata_matcher, string_matcher::MatchPattern, value_matcher, ListMatcher,
    MetadataMatcher, OrMatcher, RegexMatcher, StringMatcher, ValueMatcher,
};
use mesh_proto::envoy::pb::google::protobuf::Empty;
use serde::Serialize;

use super::inputs::WaypointRequestAuthn;

/// The filter's name, also the metadata namespace RBAC reads.
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
/// The metadata key under which the verified payload is kept.
const PAYLOAD: &str = "payload";
/// Claims whose space-separated string values are matched as lists.
const SPACE_DELIMITED_CLAIMS: [&str; 2] = ["scope", "permission"];

/// A RequestAuthentication rule the waypoint cannot apply as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum AuthnError {
    #[error("RequestAuthentication {policy}: {field}: {problem}; {effect}")]
    Invalid {
        policy: String,
        field: String,
        problem: String,
        effect: String,
    },
    #[error("RequestAuthentication {policy}: {field} is not supported on this waypoint; {effect}")]
    Unsupported {
        policy: String,
        field: String,
        effect: String,
    },
}

impl AuthnError {
    pub fn reason(&self) -> &'static str {
        match self {
            AuthnError::Invalid { .. } => "invalid_request_authentication",
            AuthnError::Unsupported { .. } => "unsupported_request_authentication",
        }
    }
}

const REJECTED: &str = "tokens of this issuer are rejected (401)";

/// The `jwt_authn` filter for a service's RequestAuthentications (`None` without any rule).
pub fn filter(
    authns: &[WaypointRequestAuthn],
    errors: &mut Vec<AuthnError>,
) -> Option<JwtAuthentication> {
    let mut rules: Vec<(&str, usize, &JwtRule)> = Vec::new();
    for a in authns {
        for (i, rule) in a.policy.spec.jwt_rules.iter().enumerate() {
            if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
                errors.push(AuthnError::Invalid {
                    policy: a.key.clone(),
                    field: format!("jwtRules[{i}]"),
                    problem: "issuer or jwksUri must be set".into(),
                    effect: "the rule is ignored".into(),
                });
                continue;
            }
            rules.push((&a.key, i, rule));
        }
    }
    if rules.is_empty() {
        return None;
    }
    rules.sort_by(|a, b| a.2.issuer.cmp(&b.2.issuer));
    let mut providers = Vec::new();
    for (n, (policy, i, rule)) in rules.into_iter().enumerate() {
        let mut p = Provider {
            policy,
            path: format!("jwtRules[{i}]"),
            errors: &mut *errors,
        };
        if let Some(provider) = p.provider(rule) {
            providers.push((format!("origins-{n}"), provider));
        }
    }
    if providers.is_empty() {
        return None;
    }
    let names: Vec<String> = providers.iter().map(|(n, _)| n.clone()).collect();
    Some(JwtAuthentication {
        providers: super::any::stable_map(providers),
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".into())),
                ..RouteMatch::default()
            }),
            requirement_type: Some(RequirementType::Requires(requirement(&names))),
        }],
        bypass_cors_preflight: true,
        ..JwtAuthentication::default()
    })
}

/// Any one provider's valid token, or none: `requires_any [p, allow_missing]` for one
/// provider; for several, any provider's or none of them (each missing or valid).
fn requirement(names: &[String]) -> JwtRequirement {
    let provider = |n: &String| JwtRequirement {
        requires_type: Some(RequiresType::ProviderName(n.clone())),
    };
    let allow_missing = JwtRequirement {
        requires_type: Some(RequiresType::AllowMissing(Empty::default())),
    };
    let any = |requirements: Vec<JwtRequirement>| JwtRequirement {
        requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
            requirements,
        })),
    };
    if let [one] = names {
        return any(vec![provider(one), allow_missing]);
    }
    let each_missing_or_valid = JwtRequirement {
        requires_type: Some(RequiresType::RequiresAll(JwtRequirementAndList {
            requirements: names
                .iter()
                .map(|n| any(vec![provider(n), allow_missing.clone()]))
                .collect(),
        })),
    };
    let mut all = names.iter().map(provider).collect::<Vec<_>>();
    all.push(each_missing_or_valid);
    any(all)
}

struct Provider<'a> {
    policy: &'a str,
    path: String,
    errors: &'a mut Vec<AuthnError>,
}

impl Provider<'_> {
    fn invalid(&mut self, field: &str, problem: String, effect: &str) {
        self.errors.push(AuthnError::Invalid {
            policy: self.policy.to_string(),
            field: format!("{}.{field}", self.path),
            problem,
            effect: effect.to_string(),
        });
    }

    fn provider(&mut self, rule: &JwtRule) -> Option<JwtProvider> {
        let Some(jwks) = self.key_set(rule) else {
            tracing::error!(
                policy = self.policy,
                "no key could be drawn for a rejecting key set; the rule is left out"
            );
            return None;
        };
        let mut from_headers = Vec::new();
        for (i, h) in rule.from_headers.iter().enumerate() {
            if !is_header_name(&h.name) {
                self.invalid(
                    &format!("fromHeaders[{i}].name"),
                    format!("{:?} is not a header name", h.name),
                    "the location is ignored",
                );
                continue;
            }
            from_headers.push(JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            });
        }
        let mut claim_to_headers = Vec::new();
        for (i, c) in rule.output_claim_to_headers.iter().enumerate() {
            if !is_header_name(&c.header) || c.claim.is_empty() {
                self.invalid(
                    &format!("outputClaimToHeaders[{i}]"),
                    format!(
                        "needs a header name and a claim (header {:?}, claim {:?})",
                        c.header, c.claim
                    ),
                    "the claim is not copied",
                );
                continue;
            }
            claim_to_headers.push(JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..JwtClaimToHeader::default()
            });
        }
        let mut forward_payload_header = rule.output_payload_to_header.clone();
        if !forward_payload_header.is_empty() && !is_header_name(&forward_payload_header) {
            self.invalid(
                "outputPayloadToHeader",
                format!("{forward_payload_header:?} is not a header name"),
                "the payload is not copied",
            );
            forward_payload_header.clear();
        }
        let audiences: Vec<String> = rule
            .audiences
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect();
        if audiences.len() != rule.audiences.len() {
            self.invalid(
                "audiences",
                "an audience is empty".into(),
                "empty audiences are ignored",
            );
        }
        if let Some(t) = &rule.timeout {
            if super::virtual_service::istio_duration(t).is_none_or(|d| d == Duration::ZERO) {
                self.invalid(
                    "timeout",
                    format!("{t:?} is not a positive duration"),
                    "it is ignored",
                );
            }
        }
        Some(JwtProvider {
            issuer: rule.issuer.clone(),
            audiences,
            forward: rule.forward_original_token,
            from_headers,
            from_params: rule.from_params.clone(),
            from_cookies: rule.from_cookies.clone(),
            forward_payload_header,
            payload_in_metadata: PAYLOAD.into(),
            normalize_payload_in_metadata: Some(NormalizePayload {
                space_delimited_claims: SPACE_DELIMITED_CLAIMS.map(String::from).to_vec(),
            }),
            claim_to_headers,
            clear_route_cache: true,
            jwks_source_specifier: Some(JwksSourceSpecifier::LocalJwks(DataSource {
                specifier: Some(data_source::Specifier::InlineString(jwks)),
                ..DataSource::default()
            })),
            ..JwtProvider::default()
        })
    }

    /// The inline key set; or, with the problem reported, one that verifies nothing (`None`
    /// if even that cannot be made).
    fn key_set(&mut self, rule: &JwtRule) -> Option<String> {
        if !rule.jwks.is_empty() {
            return match check_jwks(&rule.jwks) {
                Ok(()) => Some(rule.jwks.clone()),
                Err(problem) => {
                    self.invalid("jwks", problem, REJECTED);
                    unusable_jwks()
                }
            };
        }
        let field = if rule.jwks_uri.is_empty() {
            "issuer discovery (no jwks or jwksUri)"
        } else {
            "jwksUri (key sets are not fetched yet; give them inline in jwks)"
        };
        self.errors.push(AuthnError::Unsupported {
            policy: self.policy.to_string(),
            field: format!("{}.{field}", self.path),
            effect: REJECTED.into(),
        });
        unusable_jwks()
    }
}

/// Istio's validation of a RequestAuthentication (what its webhook refuses), as the first
/// problem found.
pub fn validate(ra: &mesh_api::RequestAuthentication) -> Result<(), String> {
    let spec = &ra.spec;
    let refs: Vec<&mesh_api::PolicyTargetReference> =
        spec.target_ref.iter().chain(&spec.target_refs).collect();
    if spec.selector.is_some() && !refs.is_empty() {
        return Err("only one of targetRefs or workloadSelector can be set".into());
    }
    for (i, r) in refs.iter().enumerate() {
        let kind_ok = matches!(
            (r.group.as_str(), r.kind.as_str()),
            ("", "Service")
                | ("networking.istio.io", "ServiceEntry")
                | ("gateway.networking.k8s.io" | "", "Gateway" | "GatewayClass")
        );
        if !kind_ok {
            return Err(format!(
                "targetRefs[{i}]: {}/{} is not a Service, ServiceEntry, Gateway or GatewayClass",
                r.group, r.kind
            ));
        }
        if r.name.is_empty() {
            return Err(format!("targetRefs[{i}]: name is required"));
        }
        if r.namespace
            .as_deref()
            .is_some_and(|ns| !ns.is_empty() && Some(ns) != ra.metadata.namespace.as_deref())
        {
            return Err(format!(
                "targetRefs[{i}]: cross namespace referencing is not supported"
            ));
        }
    }
    for (i, rule) in spec.jwt_rules.iter().enumerate() {
        let at = |what: String| format!("jwtRules[{i}]: {what}");
        if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
            return Err(at("issuer or jwksUri must be set".into()));
        }
        if rule.audiences.iter().any(String::is_empty) {
            return Err(at("audiences must not be empty".into()));
        }
        if !rule.jwks_uri.is_empty() && !is_http_url(&rule.jwks_uri) {
            return Err(at(format!(
                "jwksUri {:?} is not an http(s) URL",
                rule.jwks_uri
            )));
        }
        if !rule.jwks.is_empty() {
            check_jwks(&rule.jwks).map_err(|e| at(format!("jwks: {e}")))?;
        }
        if let Some(h) = rule.from_headers.iter().find(|h| !is_header_name(&h.name)) {
            return Err(at(format!(
                "fromHeaders: {:?} is not a header name",
                h.name
            )));
        }
        if rule.from_params.iter().any(String::is_empty) {
            return Err(at("fromParams must not be empty".into()));
        }
        if rule.from_cookies.iter().any(String::is_empty) {
            return Err(at("fromCookies must not be empty".into()));
        }
        if let Some(c) = (rule.output_claim_to_headers.iter())
            .find(|c| !is_header_name(&c.header) || c.claim.is_empty())
        {
            return Err(at(format!(
                "outputClaimToHeaders needs a header name and a claim (header {:?}, claim {:?})",
                c.header, c.claim
            )));
        }
        if let Some(t) = &rule.timeout {
            if super::virtual_service::istio_duration(t).is_none_or(|d| d == Duration::ZERO) {
                return Err(at(format!("timeout {t:?} is not a positive duration")));
            }
        }
    }
    Ok(())
}

/// `http://` or `https://` with a host.
fn is_http_url(uri: &str) -> bool {
    let rest = uri
        .strip_prefix("https://")
        .or_else(|| uri.strip_prefix("http://"));
    rest.and_then(|r| r.split(['/', '?', '#']).next())
        .is_some_and(|host| !host.is_empty() && !host.contains(char::is_whitespace))
}

/// A JSON Web Key Set Envoy will load: an object whose `keys` is a non-empty list, each key
/// complete for its type. Envoy refuses a whole listener over one bad key, so anything it
/// might refuse is caught here and reported instead.
fn check_jwks(jwks: &str) -> Result<(), String> {
    let value: serde_json::Value =
        serde_json::from_str(jwks).map_err(|e| format!("not JSON: {e}"))?;
    let keys = value
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("not a key set (no \"keys\" list)")?;
    if keys.is_empty() {
        return Err("the key set has no keys".into());
    }
    for (i, k) in keys.iter().enumerate() {
        check_jwk(k).map_err(|e| format!("keys[{i}]: {e}"))?;
    }
    Ok(())
}

fn check_jwk(key: &serde_json::Value) -> Result<(), String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let field = |name: &str| -> Result<Vec<u8>, String> {
        let text = key
            .get(name)
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("no \"{name}\""))?;
        let bytes = URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|e| format!("\"{name}\" is not base64url: {e}"))?;
        if bytes.is_empty() {
            return Err(format!("\"{name}\" is empty"));
        }
        Ok(bytes)
    };
    for name in ["kid", "alg", "use"] {
        if key.get(name).is_some_and(|v| !v.is_string()) {
            return Err(format!("\"{name}\" is not a string"));
        }
    }
    match key.get("kty").and_then(|t| t.as_str()) {
        Some("RSA") => {
            let n = field("n")?;
            let e = field("e")?;
            // Keys below 1024 bits and exponents beyond 32 bits are refused.
            if n.iter().skip_while(|b| **b == 0).count() < 128 {
                return Err("\"n\" is shorter than 1024 bits".into());
            }
            if e.iter().skip_while(|b| **b == 0).count() > 4 {
                return Err("\"e\" is longer than 32 bits".into());
            }
            Ok(())
        }
        Some("EC") => {
            let crv = key.get("crv").and_then(|c| c.as_str()).unwrap_or("P-256");
            let (alg, size) = match crv {
                "P-256" => (&ring::agreement::ECDH_P256, 32),
                "P-384" => (&ring::agreement::ECDH_P384, 48),
                other => return Err(format!("curve {other:?} is not supported (P-256, P-384)")),
            };
            let (x, y) = (field("x")?, field("y")?);
            if x.len() != size || y.len() != size {
                return Err(format!("\"x\" and \"y\" must be {size} bytes for {crv}"));
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            on_curve(alg, &point)
                .then_some(())
                .ok_or_else(|| format!("the point is not on {crv}"))
        }
        Some("OKP") => match key.get("crv").and_then(|c| c.as_str()) {
            Some("Ed25519") if field("x")?.len() == 32 => Ok(()),
            Some("Ed25519") => Err("\"x\" must be 32 bytes for Ed25519".into()),
            other => Err(format!("OKP curve {other:?} is not supported (Ed25519)")),
        },
        Some("oct") => field("k").map(|_| ()),
        Some(other) => Err(format!("key type {other:?} is not supported")),
        None => Err("no \"kty\"".into()),
    }
}

/// Whether `point` (uncompressed) is a valid public key on the curve of `alg`: an ECDH
/// agreement with it succeeds only then.
fn on_curve(alg: &'static ring::agreement::Algorithm, point: &[u8]) -> bool {
    let rng = ring::rand::SystemRandom::new();
    let Ok(ours) = ring::agreement::EphemeralPrivateKey::generate(alg, &rng) else {
        return false;
    };
    let peer = ring::agreement::UnparsedPublicKey::new(alg, point);
    ring::agreement::agree_ephemeral(ours, &peer, |_| ()).is_ok()
}

/// A key set no token verifies against: the public half of a P-256 key drawn when istiod
/// starts, whose private half was dropped at once. `None` if no key could be drawn.
fn unusable_jwks() -> Option<String> {
    static KEY_SET: LazyLock<Option<String>> = LazyLock::new(|| {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).ok()?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .ok()?;
        // An uncompressed point: 0x04, x, y.
        let point = key.public_key().as_ref();
        let (x, y) = (point.get(1..33)?, point.get(33..65)?);
        Some(
            serde_json::json!({"keys": [{
                "kty": "EC", "crv": "P-256", "kid": "unusable",
                "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
            }]})
            .to_string(),
        )
    });
    KEY_SET.clone()
}

/// An HTTP header name (an RFC 9110 token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn string_matcher(pattern: MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ..StringMatcher::default()
    }
}

fn present() -> MatchPattern {
    MatchPattern::SafeRegex(RegexMatcher {
        regex: ".+".into(),
        ..RegexMatcher::default()
    })
}

/// The verified payload's value at `claim_path` matching `value`.
fn payload_matcher(claim_path: &[&str], value: value_matcher::MatchPattern) -> Principal {
    let path = std::iter::once(PAYLOAD)
        .chain(claim_path.iter().copied())
        .map(|k| metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(k.to_string())),
        })
        .collect();
    Principal {
        identifier: Some(principal::Identifier::SourcedMetadata(SourcedMetadata {
            metadata_matcher: Some(MetadataMatcher {
                filter: JWT_FILTER.into(),
                path,
                value: Some(ValueMatcher {
                    match_pattern: Some(value),
                }),
                invert: false,
            }),
            metadata_source: MetadataSource::Dynamic as i32,
        })),
    }
}

/// A claim that is the string `pattern`, or a list holding such a string.
pub fn claim(claim_path: &[&str], pattern: MatchPattern) -> Principal {
    let string = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(string_matcher(
            pattern,
        ))),
    };
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(string.clone()))),
            },
        ))),
    };
    payload_matcher(
        claim_path,
        value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: vec![list, string],
        }),
    )
}

/// A `requestPrincipals` value (`<iss>/<sub>`, split at the last `/`, as issuers are often
/// URLs) as a match of both claims; `*` is any principal, a leading or trailing `*` a suffix
/// of the issuer or a prefix of the subject.
pub fn request_principal(value: &str) -> Principal {
    let (iss, sub) = match value.rsplit_once('/') {
        Some((i, s)) => (i, Some(s)),
        None => (value, None),
    };
    let exact = |s: &str| MatchPattern::Exact(s.to_string());
    let (iss, sub) = if value == "*" {
        (present(), present())
    } else if value.starts_with('*') {
        match sub {
            Some(sub) if iss == "*" => (present(), exact(sub)),
            Some(sub) => (
                MatchPattern::Suffix(iss.strip_prefix('*').unwrap_or(iss).to_string()),
                exact(sub),
            ),
            None => (
                present(),
                MatchPattern::Suffix(value.strip_prefix('*').unwrap_or(value).to_string()),
            ),
        }
    } else if value.ends_with('*') {
        match sub {
            Some("*") => (exact(iss), present()),
            Some(sub) => (
                exact(iss),
                MatchPattern::Prefix(sub.strip_suffix('*').unwrap_or(sub).to_string()),
            ),
            None => (
                MatchPattern::Prefix(value.strip_suffix('*').unwrap_or(value).to_string()),
                present(),
            ),
        }
    } else {
        (exact(iss), exact(sub.unwrap_or_default()))
    };
    let string = |p| value_matcher::MatchPattern::StringMatch(string_matcher(p));
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set {
            ids: vec![
                payload_matcher(&["iss"], string(iss)),
                payload_matcher(&["sub"], string(sub)),
            ],
        })),
    }
}

/// The claim path of a `request.auth.claims[a][b]...` condition key (`None`: malformed).
pub fn claim_path(key: &str) -> Option<Vec<&str>> {
    let mut rest = key.strip_prefix("request.auth.claims")?;
    let mut path = Vec::new();
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[')?;
        let (name, after) = inner.split_once(']')?;
        if name.is_empty() || name.contains('[') {
            return None;
        }
        path.push(name);
        rest = after;
    }
    (!path.is_empty()).then_some(path)
}

#[cfg(test)]
mod tests;
