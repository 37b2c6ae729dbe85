//! HTTPRoutes attached to a service (`parentRefs` of kind Service) -> Envoy routes for that
//! service's HTTP ports on the waypoint.
//!
//! Gateway API semantics: rules are ordered by match precedence (exact path, then the longest
//! prefix, then method, then the most header and query matches; ties keep route age and rule
//! order); a service with routes answers 404 to requests no rule matches; a service without
//! routes sends everything to itself; backends that cannot be resolved answer 500.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use mesh_api::{HttpBackendRef, HttpHeaderFilter, HttpRoute, HttpRouteMatch, HttpRouteRule};
use mesh_proto::envoy::pb::envoy::config::core::v3::{data_source, DataSource};
use mesh_proto::envoy::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption,
};
use mesh_proto::envoy::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier,
    redirect_action,
    route::Action,
    route_action::{ClusterSpecifier, HashPolicy, RequestMirrorPolicy},
    route_match::PathSpecifier,
    weighted_cluster::ClusterWeight,
    DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction, RetryPolicy, Route,
    RouteAction, RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
};
use mesh_proto::envoy::pb::envoy::r#type::matcher::v3::{
    string_matcher::MatchPattern, RegexMatcher, StringMatcher,
};
use serde::Serialize;

use super::any::{duration, object_name, u32_value};
use super::inputs::{BoundService, Protocol, WaypointInputs};
pub use super::tcp_route::TcpClusters;

/// A part of a route the waypoint cannot serve; the rest of the route still applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum RouteError {
    #[error("{route_kind} {route}: {field} = {value:?} is not a valid regular expression ({detail}); the match is left out and never matches")]
    InvalidRegex {
        /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`.
        route_kind: &'static str,
        route: String,
        field: String,
        value: String,
        detail: String,
    },
    #[error("{route_kind} {route}: {field} = {value:?} is not a Gateway API duration (e.g. 10s, 500ms, 1h30m); the timeout is not applied")]
    InvalidDuration {
        /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`.
        route_kind: &'static str,
        route: String,
        field: String,
        value: String,
    },
    #[error("{route_kind} {route}: {field} refers to {backend}, which is not a service of waypoint {waypoint} (or has no such port); requests to it get 500. Bind the service to the waypoint (istio.io/use-waypoint) or fix the reference")]
    UnknownBackend {
        /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`.
        route_kind: &'static str,
        route: String,
        field: String,
        backend: String,
        waypoint: String,
    },
    #[error("{route_kind} {route}: {field} of type {kind:?} is not supported by this waypoint; the filter is ignored")]
    UnsupportedFilter {
        /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`.
        route_kind: &'static str,
        route: String,
        field: String,
        kind: String,
    },
    #[error("VirtualService {name}: {field}: {problem}")]
    VirtualService {
        name: String,
        field: String,
        problem: String,
    },
    #[error("DestinationRule {name}: {field}: {problem}")]
    DestinationRule {
        name: String,
        field: String,
        problem: String,
    },
    /// A part of an AuthorizationPolicy attached to the waypoint.
    #[error(transparent)]
    Policy(#[from] super::rbac::PolicyError),
    /// A part of a RequestAuthentication attached to the waypoint.
    #[error(transparent)]
    Authn(#[from] super::jwt::AuthnError),
    /// A part of a sidecar's inbound configuration.
    #[error(transparent)]
    Sidecar(#[from] super::sidecar::SidecarError),
}

impl RouteError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::InvalidRegex { .. } => "invalid_regex",
            RouteError::InvalidDuration { .. } => "invalid_duration",
            RouteError::UnknownBackend { .. } => "unknown_backend",
            RouteError::UnsupportedFilter { .. } => "unsupported_filter",
            RouteError::VirtualService { .. } => "virtual_service",
            RouteError::DestinationRule { .. } => "destination_rule",
            RouteError::Policy(e) => e.reason(),
            RouteError::Authn(e) => e.reason(),
            RouteError::Sidecar(_) => "sidecar",
        }
    }
}

/// The route configuration of each HTTP port of one service.
#[derive(Debug)]
pub struct ServiceRoutes {
    /// Service port -> its inline route configuration (HTTP ports only).
    pub by_port: BTreeMap<u16, RouteConfiguration>,
    /// TCP service port -> the clusters a TCPRoute sends it to (absent: the port's own).
    pub tcp_by_port: BTreeMap<u16, TcpClusters>,
    /// The JWT filter of the service's RequestAuthentications (HTTP ports).
    pub jwt: Option<
        mesh_proto::envoy::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication,
    >,
    /// The RBAC HTTP filters of the service's policies (name, config).
    pub rbac: Vec<(
        String,
        mesh_proto::envoy::pb::envoy::extensions::filters::http::rbac::v3::Rbac,
    )>,
    /// The network RBAC filters for the service's TCP ports.
    pub rbac_tcp: Vec<(
        String,
        mesh_proto::envoy::pb::envoy::extensions::filters::network::rbac::v3::Rbac,
    )>,
}

impl ServiceRoutes {
    pub fn build(
        inputs: &WaypointInputs,
        svc: &BoundService,
        hashes: &HashMap<String, Vec<HashPolicy>>,
        errors: &mut Vec<RouteError>,
    ) -> ServiceRoutes {
        let mut by_port = BTreeMap::new();
        let mut policy_errors = Vec::new();
        let mut authn_errors = Vec::new();
        let jwt = super::jwt::filter(&svc.request_authns, &mut authn_errors);
        errors.extend(authn_errors.into_iter().map(RouteError::Authn));
        let rbac = super::rbac::http_filters(&svc.policies, &mut policy_errors);
        let rbac_tcp = if svc.ports.iter().any(|p| p.protocol == Protocol::Tcp) {
            super::rbac::tcp_filters(&svc.policies, &mut policy_errors)
        } else {
            Vec::new()
        };
        // Problems not specific to a layer show up in both conversions: report each once.
        let mut seen = Vec::new();
        for e in policy_errors {
            if !seen.contains(&e) {
                seen.push(e);
            }
        }
        errors.extend(seen.into_iter().map(RouteError::Policy));
        let grpc: Vec<HttpRoute> = (svc.grpc_routes.iter())
            .map(|r| super::grpc_route::as_http_route(r))
            .collect();
        for port in svc.ports.iter().filter(|p| p.protocol != Protocol::Tcp) {
            let cluster = inputs.cluster_name(&svc.hostname, port, None);
            let attached: Vec<(&'static str, &HttpRoute)> = (svc.routes.iter())
                .map(|r| ("HTTPRoute", &**r))
                .chain(grpc.iter().map(|r| ("GRPCRoute", r)))
                .filter(|(_, r)| attaches_to_port(r, svc, port.port))
                .collect();
            let virtual_services: Vec<&mesh_api::VirtualService> =
                svc.virtual_services.iter().map(|v| &**v).collect();
            let mut routes = if attached.is_empty() && !virtual_services.is_empty() {
                // HTTPRoutes win; without them the VirtualServices for this host apply.
                let mut routes = super::virtual_service::routes(
                    inputs,
                    port.port,
                    None,
                    &virtual_services,
                    errors,
                );
                if routes.is_empty() {
                    routes.push(default_route(&cluster));
                }
                routes
            } else if attached.is_empty() {
                vec![default_route(&cluster)]
            } else {
                let mut ctx = Ctx {
                    inputs,
                    port: port.port,
                    kind: "HTTPRoute",
                    errors: &mut *errors,
                };
                ctx.routes(&attached)
            };
            super::destination_rule::apply_hash_policies(&mut routes, hashes);
            by_port.insert(
                port.port,
                RouteConfiguration {
                    name: cluster.clone(),
                    validate_clusters: Some(mesh_proto::envoy::pb::google::protobuf::BoolValue {
                        value: false,
                    }),
                    virtual_hosts: vec![VirtualHost {
                        name: format!("inbound|http|{}", port.port),
                        domains: vec!["*".to_string()],
                        routes,
                        ..VirtualHost::default()
                    }],
                    ..RouteConfiguration::default()
                },
            );
        }
        let tcp_by_port = (svc.ports.iter())
            .filter(|p| p.protocol == Protocol::Tcp)
            .filter_map(|p| {
                let clusters = super::tcp_route::clusters(inputs, svc, p.port, errors)?;
                Some((p.port, clusters))
            })
            .collect();
        ServiceRoutes {
            by_port,
            tcp_by_port,
            jwt,
            rbac,
            rbac_tcp,
        }
    }
}

/// Whether `route` has a parentRef naming `svc` (and, if it names a port, this one).
fn attaches_to_port(route: &HttpRoute, svc: &BoundService, port: u16) -> bool {
    parents_name_port(&route.metadata, &route.spec.parent_refs, svc, port)
}

/// Whether `refs` (of a route with `meta`) name `svc` (and, if a port is named, this one).
pub(super) fn parents_name_port(
    meta: &mesh_api::ObjectMeta,
    refs: &[mesh_api::ParentReference],
    svc: &BoundService,
    port: u16,
) -> bool {
    let route_ns = meta.namespace.as_deref().unwrap_or("default");
    refs.iter().any(|p| {
        p.is_service()
            && p.name == svc.name
            && p.namespace.as_deref().unwrap_or(route_ns) == svc.namespace
            && p.port.is_none_or(|p| p == port)
    })
}

pub(super) fn default_route(cluster: &str) -> Route {
    Route {
        name: "default".to_string(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".to_string())),
            ..RouteMatch::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
            timeout: Some(duration(Duration::ZERO)),
            ..RouteAction::default()
        })),
        ..Route::default()
    }
}

struct Ctx<'a> {
    inputs: &'a WaypointInputs,
    port: u16,
    /// The kind of the route being converted, for messages.
    kind: &'static str,
    errors: &'a mut Vec<RouteError>,
}

/// Gateway API precedence of one match, larger first.
fn precedence(m: &HttpRouteMatch) -> (u8, usize, bool, usize, usize) {
    let (kind, len) = match &m.path {
        Some(p) => {
            let len = p.value.as_deref().map_or(1, str::len);
            match p.type_.as_deref() {
                Some("Exact") => (2, len),
                Some("RegularExpression") => (0, len),
                _ => (1, len),
            }
        }
        None => (1, 1),
    };
    (
        kind,
        len,
        m.method.is_some(),
        m.headers.len(),
        m.query_params.len(),
    )
}

impl Ctx<'_> {
    fn routes(&mut self, attached: &[(&'static str, &HttpRoute)]) -> Vec<Route> {
        let mut entries = Vec::new();
        for (order, (kind, route)) in attached.iter().enumerate() {
            self.kind = kind;
            let name = object_name(&route.metadata);
            for (i, rule) in route.spec.rules.iter().enumerate() {
                let field = format!("spec.rules[{i}]");
                let action = self.action(&name, &field, rule);
                let matches = if rule.matches.is_empty() {
                    vec![HttpRouteMatch::default()]
                } else {
                    rule.matches.clone()
                };
                for (j, m) in matches.iter().enumerate() {
                    let mfield = format!("{field}.matches[{j}]");
                    let Some(route_match) = self.route_match(&name, &mfield, m) else {
                        continue;
                    };
                    let mut r = action.clone();
                    r.name = format!("{name}.{i}.{j}");
                    r.r#match = Some(route_match);
                    entries.push((precedence(m), order, i, r));
                }
            }
        }
        entries.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        entries.into_iter().map(|e| e.3).collect()
    }

    /// The action and header changes of one rule (without its match).
    fn action(&mut self, route: &str, field: &str, rule: &HttpRouteRule) -> Route {
        let mut out = Route::default();
        let mut redirect = None;
        let mut mirrors = Vec::new();
        for (k, f) in rule.filters.iter().enumerate() {
            let ffield = format!("{field}.filters[{k}]");
            match f.type_.as_str() {
                "RequestHeaderModifier" => {
                    if let Some(m) = &f.request_header_modifier {
                        let (add, remove) = header_changes(m);
                        out.request_headers_to_add.extend(add);
                        out.request_headers_to_remove.extend(remove);
                    }
                }
                "ResponseHeaderModifier" => {
                    if let Some(m) = &f.response_header_modifier {
                        let (add, remove) = header_changes(m);
                        out.response_headers_to_add.extend(add);
                        out.response_headers_to_remove.extend(remove);
                    }
                }
                "RequestRedirect" => redirect = f.request_redirect.as_ref().map(redirect_action),
                "RequestMirror" => {
                    if let Some(m) = &f.request_mirror {
                        let mfield = format!("{ffield}.requestMirror.backendRef");
                        if let Some(cluster) = self.backend_cluster(route, &mfield, &m.backend_ref)
                        {
                            mirrors.push(RequestMirrorPolicy {
                                cluster,
                                ..RequestMirrorPolicy::default()
                            });
                        }
                    }
                }
                other => self.errors.push(RouteError::UnsupportedFilter {
                    route_kind: self.kind,
                    route: route.to_string(),
                    field: ffield,
                    kind: other.to_string(),
                }),
            }
        }
        if let Some(r) = redirect {
            out.action = Some(Action::Redirect(r));
            return out;
        }
        let mut timeout = Duration::ZERO;
        if let Some(v) = rule.timeouts.as_ref().and_then(|t| t.request.as_ref()) {
            match parse_duration(v) {
                Some(d) => timeout = d,
                None => self.errors.push(RouteError::InvalidDuration {
                    route_kind: self.kind,
                    route: route.to_string(),
                    field: format!("{field}.timeouts.request"),
                    value: v.clone(),
                }),
            }
        }
        let retry_policy = rule.retry.as_ref().map(|r| self.retry(route, field, r));
        let Some(cluster_specifier) = self.backends(route, field, &rule.backend_refs) else {
            out.action = Some(Action::DirectResponse(DirectResponseAction {
                status: 500,
                body: Some(DataSource {
                    specifier: Some(data_source::Specifier::InlineString(
                        "no valid backend for this route".to_string(),
                    )),
                    ..DataSource::default()
                }),
                ..DirectResponseAction::default()
            }));
            return out;
        };
        let action = RouteAction {
            cluster_specifier: Some(cluster_specifier),
            timeout: Some(duration(timeout)),
            retry_policy,
            request_mirror_policies: mirrors,
            ..RouteAction::default()
        };
        out.action = Some(Action::Route(action));
        out
    }

    fn retry(&mut self, route: &str, field: &str, retry: &mesh_api::HttpRouteRetry) -> RetryPolicy {
        let mut policy = RetryPolicy {
            retry_on: if retry.codes.is_empty() {
                "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
                    .to_string()
            } else {
                "connect-failure,refused-stream,retriable-status-codes".to_string()
            },
            retriable_status_codes: if retry.codes.is_empty() {
                vec![503]
            } else {
                retry.codes.iter().map(|c| u32::from(*c)).collect()
            },
            num_retries: Some(u32_value(retry.attempts.unwrap_or(2))),
            ..RetryPolicy::default()
        };
        if let Some(b) = &retry.backoff {
            match parse_duration(b) {
                Some(d) => policy.retry_back_off = Some(
                    mesh_proto::envoy::pb::envoy::config::route::v3::retry_policy::RetryBackOff {
                        base_interval: Some(duration(d)),
                        ..Default::default()
                    },
                ),
                None => self.errors.push(RouteError::InvalidDuration {
                    route_kind: self.kind,
                    route: route.to_string(),
                    field: format!("{field}.retry.backoff"),
                    value: b.clone(),
                }),
            }
        }
        policy
    }

    /// One cluster, or weighted clusters; `None` when no backend is usable.
    fn backends(
        &mut self,
        route: &str,
        field: &str,
        refs: &[HttpBackendRef],
    ) -> Option<ClusterSpecifier> {
        let mut clusters = Vec::new();
        for (k, b) in refs.iter().enumerate() {
            let bfield = format!("{field}.backendRefs[{k}]");
            let weight = b.weight.unwrap_or(1);
            if weight == 0 {
                continue;
            }
            if let Some(name) = self.backend_cluster(route, &bfield, b) {
                clusters.push(ClusterWeight {
                    name,
                    weight: Some(u32_value(weight)),
                    ..ClusterWeight::default()
                });
            }
        }
        match clusters.len() {
            0 => None,
            1 => clusters.pop().map(|c| ClusterSpecifier::Cluster(c.name)),
            _ => Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters,
                ..WeightedCluster::default()
            })),
        }
    }

    /// The cluster of a backendRef: a service bound to this waypoint, on one of its ports.
    fn backend_cluster(&mut self, route: &str, field: &str, b: &HttpBackendRef) -> Option<String> {
        let route_ns = route.split('/').next().unwrap_or_default();
        let ns = b.namespace.as_deref().unwrap_or(route_ns);
        let port = b.port.unwrap_or(self.port);
        let found = b
            .is_service()
            .then(|| self.inputs.service(ns, &b.name))
            .flatten()
            .and_then(|s| s.ports.iter().find(|p| p.port == port).map(|p| (s, p)));
        match found {
            Some((s, p)) => Some(self.inputs.cluster_name(&s.hostname, p, None)),
            None => {
                self.errors.push(RouteError::UnknownBackend {
                    route_kind: self.kind,
                    route: route.to_string(),
                    field: field.to_string(),
                    backend: format!("{ns}/{}:{port}", b.name),
                    waypoint: self.inputs.key.to_string(),
                });
                None
            }
        }
    }

    fn route_match(&mut self, route: &str, field: &str, m: &HttpRouteMatch) -> Option<RouteMatch> {
        let mut out = RouteMatch::default();
        let path = m.path.as_ref();
        let value = path
            .and_then(|p| p.value.clone())
            .unwrap_or_else(|| "/".into());
        out.path_specifier = Some(match path.and_then(|p| p.type_.as_deref()) {
            Some("Exact") => PathSpecifier::Path(value),
            Some("RegularExpression") => {
                PathSpecifier::SafeRegex(self.regex(route, &format!("{field}.path"), &value)?)
            }
            _ => {
                let trimmed = value.trim_end_matches('/');
                if trimmed.is_empty() {
                    PathSpecifier::Prefix("/".to_string())
                } else {
                    PathSpecifier::PathSeparatedPrefix(trimmed.to_string())
                }
            }
        });
        for (k, h) in m.headers.iter().enumerate() {
            let pattern = self.pattern(route, &format!("{field}.headers[{k}]"), h)?;
            out.headers.push(header_matcher(&h.name, pattern));
        }
        if let Some(method) = &m.method {
            out.headers.push(header_matcher(
                ":method",
                MatchPattern::Exact(method.clone()),
            ));
        }
        for (k, q) in m.query_params.iter().enumerate() {
            let pattern = self.pattern(route, &format!("{field}.queryParams[{k}]"), q)?;
            out.query_parameters.push(QueryParameterMatcher {
                name: q.name.clone(),
                query_parameter_match_specifier: Some(
                    mesh_proto::envoy::pb::envoy::config::route::v3::query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(
                        StringMatcher {
                            match_pattern: Some(pattern),
                            ..StringMatcher::default()
                        },
                    ),
                ),
            });
        }
        Some(out)
    }

    fn pattern(
        &mut self,
        route: &str,
        field: &str,
        h: &mesh_api::HttpHeaderMatch,
    ) -> Option<MatchPattern> {
        Some(match h.type_.as_deref() {
            Some("RegularExpression") => {
                MatchPattern::SafeRegex(self.regex(route, field, &h.value)?)
            }
            _ => MatchPattern::Exact(h.value.clone()),
        })
    }

    /// A regex Envoy accepts (RE2 syntax); checked here so that Envoy never NACKs it.
    fn regex(&mut self, route: &str, field: &str, value: &str) -> Option<RegexMatcher> {
        match regex::Regex::new(value) {
            Ok(_) if !has_unsupported_re2(value) => Some(RegexMatcher {
                regex: value.to_string(),
                ..RegexMatcher::default()
            }),
            result => {
                let detail = result.err().map_or_else(
                    || "look-around and backreferences are not RE2".into(),
                    |e| e.to_string(),
                );
                self.errors.push(RouteError::InvalidRegex {
                    route_kind: self.kind,
                    route: route.to_string(),
                    field: field.to_string(),
                    value: value.to_string(),
                    detail,
                });
                None
            }
        }
    }
}

/// RE2 (Envoy) lacks some constructs the `regex` crate also rejects; backreferences like `\1`
/// are refused by both. This catches what `regex` accepts but RE2 does not: `\C`.
pub(super) fn has_unsupported_re2(value: &str) -> bool {
    value.contains("\\C")
}

pub(super) fn header_matcher(name: &str, pattern: MatchPattern) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ..StringMatcher::default()
        })),
        ..HeaderMatcher::default()
    }
}

/// One header to set (`OverwriteIfExistsOrAdd`) or add (`AppendIfExistsOrAdd`).
pub(super) fn header_option(
    key: &str,
    value: &str,
    action: HeaderAppendAction,
) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: value.to_string(),
            ..HeaderValue::default()
        }),
        append_action: action as i32,
        ..HeaderValueOption::default()
    }
}

fn header_changes(m: &HttpHeaderFilter) -> (Vec<HeaderValueOption>, Vec<String>) {
    let option = |h: &mesh_api::HttpHeader, action| header_option(&h.name, &h.value, action);
    let mut add: Vec<HeaderValueOption> = m
        .set
        .iter()
        .map(|h| option(h, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .collect();
    add.extend(
        m.add
            .iter()
            .map(|h| option(h, HeaderAppendAction::AppendIfExistsOrAdd)),
    );
    (add, m.remove.clone())
}

fn redirect_action(r: &mesh_api::HttpRequestRedirect) -> RedirectAction {
    use redirect_action::{RedirectResponseCode, SchemeRewriteSpecifier};
    let code = match r.status_code {
        Some(301) => RedirectResponseCode::MovedPermanently,
        _ => RedirectResponseCode::Found,
    };
    RedirectAction {
        host_redirect: r.hostname.clone().unwrap_or_default(),
        port_redirect: r.port.map_or(0, u32::from),
        response_code: code as i32,
        scheme_rewrite_specifier: r.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
        ..RedirectAction::default()
    }
}

/// A Gateway API duration: one to four `<number><unit>` parts, units `h`, `m`, `s`, `ms`.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let mut rest = value;
    let mut total = Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total += unit * u32::try_from(n).ok()?;
        parts += 1;
    }
    (parts > 0 && parts <= 4).then_some(total)
}
