//! Istio's validation of a RequestAuthentication, as its webhook applies it.

use std::time::Duration;

/// Istio's validation of a RequestAuthentication (what its webhook refuses), as the first
/// problem found.
pub fn validate(ra: &mesh_api::RequestAuthentication) -> Result<(), String> {
    let spec = &ra.spec;
    let refs: Vec<&mesh_api::PolicyTargetReference> = spec.targets().collect();
    if spec.target_ref.is_some() && !spec.target_refs.is_empty() {
        return Err("only one of targetRef or targetRefs can be set".into());
    }
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
            super::check_jwks(&rule.jwks).map_err(|e| at(format!("jwks: {e}")))?;
        }
        if let Some(h) = rule
            .from_headers
            .iter()
            .find(|h| !super::is_header_name(&h.name))
        {
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
            .find(|c| !super::is_header_name(&c.header) || c.claim.is_empty())
        {
            return Err(at(format!(
                "outputClaimToHeaders needs a header name and a claim (header {:?}, claim {:?})",
                c.header, c.claim
            )));
        }
        if let Some(t) = &rule.timeout {
            if super::super::virtual_service::istio_duration(t).is_none_or(|d| d == Duration::ZERO)
            {
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
