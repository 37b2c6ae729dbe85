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
    MetadataMatcher, OrMatcher, ValueMatcher,
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
        let Some(mut jwks) = self.key_set(rule) else {
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
        // Without any location left Envoy would read the default ones instead: where the rule
        // named only bad locations, its tokens are rejected rather than read elsewhere.
        let no_location_left = !rule.from_headers.is_empty()
            && from_headers.is_empty()
            && rule.from_params.is_empty()
            && rule.from_cookies.is_empty();
        if no_location_left {
            self.invalid(
                "fromHeaders",
                "no valid token location is left".into(),
                REJECTED,
            );
            jwks = unusable_jwks()?;
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

/// An HTTP header name (an RFC 9110 token).
fn is_header_name(name: &str) -> bool {
    http::HeaderName::from_bytes(name.as_bytes()).is_ok()
}

use super::rbac::string_matcher;

/// A claim that is present (Istio's `*`).
fn present() -> MatchPattern {
    super::rbac::glob("*")
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

mod jwks;
mod validate;

use jwks::{check_jwks, unusable_jwks};
pub use validate::validate;

#[cfg(test)]
mod tests;
