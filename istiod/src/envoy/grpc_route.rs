//! GRPCRoute on a waypoint: each rule becomes an HTTPRoute rule over the gRPC request path
//! `/<service>/<method>` (every gRPC call is an HTTP/2 POST to that path), so both kinds share
//! one route generator, as istiod converts both into one mesh route table.

use mesh_api::{
    GrpcMethodMatch, GrpcRoute, HttpPathMatch, HttpRoute, HttpRouteMatch, HttpRouteRule,
    HttpRouteSpec,
};

/// The HTTPRoute equivalent of `route` (same metadata, parents, filters and backends).
pub fn as_http_route(route: &GrpcRoute) -> HttpRoute {
    let rules = route
        .spec
        .rules
        .iter()
        .map(|rule| HttpRouteRule {
            matches: rule
                .matches
                .iter()
                .map(|m| HttpRouteMatch {
                    path: m.method.as_ref().map(method_path),
                    headers: m.headers.clone(),
                    ..HttpRouteMatch::default()
                })
                .collect(),
            filters: rule.filters.clone(),
            backend_refs: rule.backend_refs.clone(),
            ..HttpRouteRule::default()
        })
        .collect();
    HttpRoute {
        metadata: route.metadata.clone(),
        spec: HttpRouteSpec {
            parent_refs: route.spec.parent_refs.clone(),
            hostnames: route.spec.hostnames.clone(),
            rules,
        },
    }
}

/// The path match of a method match: exact `/<service>/<method>` when both are exact, else a
/// regular expression (an unset part matches any one path segment).
fn method_path(m: &GrpcMethodMatch) -> HttpPathMatch {
    let regex = m.type_.as_deref() == Some("RegularExpression");
    let (service, method) = (m.service.as_deref(), m.method.as_deref());
    if !regex {
        if let (Some(s), Some(me)) = (service, method) {
            return HttpPathMatch {
                type_: Some("Exact".into()),
                value: Some(format!("/{s}/{me}")),
            };
        }
    }
    let part = |v: Option<&str>| match v {
        Some(v) if regex => v.to_string(),
        Some(v) => regex::escape(v),
        None => "[^/]+".to_string(),
    };
    HttpPathMatch {
        type_: Some("RegularExpression".into()),
        value: Some(format!("/{}/{}", part(service), part(method))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(type_: Option<&str>, service: Option<&str>, m: Option<&str>) -> HttpPathMatch {
        method_path(&GrpcMethodMatch {
            type_: type_.map(str::to_string),
            service: service.map(str::to_string),
            method: m.map(str::to_string),
        })
    }

    #[test]
    fn exact_service_and_method_is_an_exact_path() {
        let p = method(None, Some("echo.Echo"), Some("Say"));
        assert_eq!(p.type_.as_deref(), Some("Exact"));
        assert_eq!(p.value.as_deref(), Some("/echo.Echo/Say"));
    }

    #[test]
    fn a_missing_part_matches_one_segment_and_exact_parts_are_escaped() {
        let p = method(Some("Exact"), Some("echo.Echo"), None);
        assert_eq!(p.type_.as_deref(), Some("RegularExpression"));
        assert_eq!(p.value.as_deref(), Some(r"/echo\.Echo/[^/]+"));
        let p = method(None, None, Some("Say"));
        assert_eq!(p.value.as_deref(), Some("/[^/]+/Say"));
    }

    #[test]
    fn regular_expressions_are_kept() {
        let p = method(Some("RegularExpression"), Some(r"echo\..*"), Some("S.*"));
        assert_eq!(p.value.as_deref(), Some(r"/echo\..*/S.*"));
    }
}
