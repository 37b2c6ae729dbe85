//! VirtualService `http` routes on a waypoint, for a service port no HTTPRoute attaches to:
//! matches (uri, method, headers, query parameters), weighted destinations among the
//! waypoint's services, timeout, retries, fault injection (per-route config of Envoy's fault
//! filter), header changes, redirect and mirror. Istio evaluates VirtualService routes in order,
//! and so do these. Bad parts are reported per field and left out; the rest still applies.

use std::time::Duration;

use mesh_api::{
    Destination, HeaderOperations, HttpFaultInjection, StringMatch, VirtualService, VsHttpMatch,
    VsHttpRoute,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::{
    data_source, header_value_option::HeaderAppendAction, DataSource, HeaderValueOption,
};
use mesh_proto::envoy::pb::envoy::config::route::v3::{
    query_parameter_matcher::QueryParameterMatchSpecifier,
    redirect_action,
    route::Action,
    route_action::{ClusterSpecifier, RequestMirrorPolicy},
    route_match::PathSpecifier,
    weighted_cluster::ClusterWeight,
    DirectResponseAction, QueryParameterMatcher, RedirectAction, RetryPolicy, Route, RouteAction,
    RouteMatch, WeightedCluster,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::common::fault::v3::{
    fault_delay::FaultDelaySecifier, FaultDelay,
};
use mesh_proto::envoy::pb::envoy::extensions::filters::http::fault::v3::{
    fault_abort::ErrorType, FaultAbort, HttpFault,
};
use mesh_proto::envoy::pb::envoy::r#type::matcher::v3::{
    string_matcher::MatchPattern, RegexMatcher, StringMatcher,
};
use mesh_proto::envoy::pb::envoy::r#type::v3::{
    fractional_percent::DenominatorType, FractionalPercent,
};

use super::any::{duration, object_name, pack, u32_value};
use super::clusters::service_cluster;
use super::inputs::WaypointInputs;
use super::routes::{
    has_unsupported_re2, header_matcher, header_option, parse_duration, RouteError,
};

/// The name of Envoy's fault filter, whose per-route config carries a route's faults.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";

/// Whether VirtualService `host` (relative to the VirtualService's namespace `vs_ns`) names the
/// service `name.namespace` (short name, `name.namespace`, `.svc` or any longer FQDN).
pub fn host_names(host: &str, vs_ns: &str, namespace: &str, name: &str) -> bool {
    let mut parts = host.split('.');
    let first = parts.next().unwrap_or_default();
    let ns = parts.next();
    first == name
        && match ns {
            None => vs_ns == namespace,
            Some(n) => n == namespace && parts.next().is_none_or(|s| s == "svc"),
        }
}

/// The (namespace, name) a destination host names, relative to `vs_ns`.
pub fn resolve_host<'a>(host: &'a str, vs_ns: &'a str) -> (&'a str, &'a str) {
    let mut parts = host.split('.');
    let name = parts.next().unwrap_or_default();
    (parts.next().unwrap_or(vs_ns), name)
}

/// A VirtualService's name for a Gateway as `namespace/name`: `namespace/name`, `./name` or a
/// bare `name` (both in the VirtualService's namespace `vs_ns`), or the older
/// `name.namespace...`; `mesh` stays `mesh`.
pub fn gateway_name(g: &str, vs_ns: &str) -> String {
    match g.split_once('/') {
        Some((".", name)) => format!("{vs_ns}/{name}"),
        Some(_) => g.to_string(),
        None if g == "mesh" => g.to_string(),
        None => match g.split_once('.') {
            Some((name, rest)) => {
                let ns = rest.split('.').next().unwrap_or(vs_ns);
                format!("{ns}/{name}")
            }
            None => format!("{vs_ns}/{g}"),
        },
    }
}

struct Conv<'a> {
    inputs: &'a WaypointInputs,
    port: u16,
    /// The Gateway (`namespace/name`) the routes are for; `None`: the mesh (sidecars and
    /// waypoints).
    gateway: Option<&'a str>,
    vs: String,
    ns: String,
    errors: &'a mut Vec<RouteError>,
}

/// The Envoy routes of the VirtualServices `vss` (in order) for one service port (or gateway
/// server port), in the mesh or on `gateway` (`namespace/name`), which matches may name.
pub fn routes(
    inputs: &WaypointInputs,
    port: u16,
    gateway: Option<&str>,
    vss: &[&VirtualService],
    errors: &mut Vec<RouteError>,
) -> Vec<Route> {
    let mut out = Vec::new();
    for vs in vss {
        let mut c = Conv {
            inputs,
            port,
            gateway,
            vs: object_name(&vs.metadata),
            ns: vs
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            errors: &mut *errors,
        };
        for (i, http) in vs.spec.http.iter().enumerate() {
            let field = format!("spec.http[{i}]");
            let action = c.action(&field, http);
            let matches = if http.matches.is_empty() {
                vec![VsHttpMatch::default()]
            } else {
                http.matches.clone()
            };
            for (j, m) in matches.iter().enumerate() {
                let Some(route_match) = c.route_match(&format!("{field}.match[{j}]"), m) else {
                    continue;
                };
                let mut r = action.clone();
                r.name = format!("{}.{i}.{j}", c.vs);
                r.r#match = Some(route_match);
                out.push(r);
            }
        }
    }
    out
}

fn header_options(ops: &HeaderOperations) -> (Vec<HeaderValueOption>, Vec<String>) {
    let mut add: Vec<HeaderValueOption> = (ops.set.iter())
        .map(|(k, v)| header_option(k, v, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .collect();
    add.extend(
        (ops.add.iter()).map(|(k, v)| header_option(k, v, HeaderAppendAction::AppendIfExistsOrAdd)),
    );
    (add, ops.remove.clone())
}

/// Istio's durations: Gateway API style (`1s`, `500ms`, `1h30m`) or decimal seconds (`1.5s`).
pub(super) fn istio_duration(value: &str) -> Option<Duration> {
    parse_duration(value).or_else(|| {
        let secs: f64 = value.strip_suffix('s')?.parse().ok()?;
        (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
    })
}

/// A percentage (0-100, fractions allowed) as a fraction of a million.
fn percent(value: Option<f64>) -> FractionalPercent {
    let v = value.unwrap_or(100.0).clamp(0.0, 100.0);
    FractionalPercent {
        numerator: (v * 10_000.0).round() as u32,
        denominator: DenominatorType::Million as i32,
    }
}

impl Conv<'_> {
    fn error(&mut self, field: &str, problem: String) {
        self.errors.push(RouteError::VirtualService {
            name: self.vs.clone(),
            field: field.to_string(),
            problem,
        });
    }

    fn action(&mut self, field: &str, http: &VsHttpRoute) -> Route {
        let mut out = Route::default();
        if let Some(h) = &http.headers {
            if let Some(req) = &h.request {
                let (add, remove) = header_options(req);
                out.request_headers_to_add = add;
                out.request_headers_to_remove = remove;
            }
            if let Some(resp) = &h.response {
                let (add, remove) = header_options(resp);
                out.response_headers_to_add = add;
                out.response_headers_to_remove = remove;
            }
        }
        if let Some(fault) = &http.fault {
            if let Some(config) = self.fault(&format!("{field}.fault"), fault) {
                out.typed_per_filter_config
                    .insert(FAULT_FILTER.to_string(), pack(&config));
            }
        }
        if let Some(r) = &http.redirect {
            use redirect_action::{PathRewriteSpecifier, RedirectResponseCode};
            // Istio's default redirect code is 301.
            let code = match r.redirect_code {
                Some(302) => RedirectResponseCode::Found,
                Some(303) => RedirectResponseCode::SeeOther,
                Some(307) => RedirectResponseCode::TemporaryRedirect,
                Some(308) => RedirectResponseCode::PermanentRedirect,
                _ => RedirectResponseCode::MovedPermanently,
            };
            out.action = Some(Action::Redirect(RedirectAction {
                host_redirect: r.authority.clone().unwrap_or_default(),
                path_rewrite_specifier: r.uri.clone().map(PathRewriteSpecifier::PathRedirect),
                response_code: code as i32,
                ..RedirectAction::default()
            }));
            return out;
        }
        let mut action = RouteAction {
            timeout: Some(duration(Duration::ZERO)),
            ..RouteAction::default()
        };
        if let Some(t) = &http.timeout {
            match istio_duration(t) {
                Some(d) => action.timeout = Some(duration(d)),
                None => self.error(
                    &format!("{field}.timeout"),
                    format!("{t:?} is not a duration (e.g. 1s, 500ms); the timeout is not applied"),
                ),
            }
        }
        if let Some(r) = &http.retries {
            action.retry_policy = Some(self.retry(field, r));
        }
        if let Some(m) = &http.mirror {
            if let Some(cluster) = self.cluster(&format!("{field}.mirror"), m) {
                let mut policy = RequestMirrorPolicy {
                    cluster,
                    ..RequestMirrorPolicy::default()
                };
                if let Some(p) = &http.mirror_percentage {
                    policy.runtime_fraction = Some(
                        mesh_proto::envoy::pb::envoy::config::core::v3::RuntimeFractionalPercent {
                            default_value: Some(percent(Some(p.value))),
                            ..Default::default()
                        },
                    );
                }
                action.request_mirror_policies.push(policy);
            }
        }
        let mut clusters = Vec::new();
        for (k, d) in http.route.iter().enumerate() {
            let dfield = format!("{field}.route[{k}]");
            if d.headers.is_some() {
                self.error(
                    &format!("{dfield}.headers"),
                    "per-destination header changes are not supported; set them on the route"
                        .into(),
                );
            }
            let weight = d
                .weight
                .unwrap_or(if http.route.len() == 1 { 100 } else { 0 });
            if weight == 0 && http.route.len() > 1 {
                continue;
            }
            if let Some(name) = self.cluster(&format!("{dfield}.destination"), &d.destination) {
                clusters.push(ClusterWeight {
                    name,
                    weight: Some(u32_value(weight.max(1))),
                    ..ClusterWeight::default()
                });
            }
        }
        action.cluster_specifier = match clusters.len() {
            0 => None,
            1 => clusters.pop().map(|c| ClusterSpecifier::Cluster(c.name)),
            _ => Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters,
                ..WeightedCluster::default()
            })),
        };
        if action.cluster_specifier.is_none() {
            out.action = Some(Action::DirectResponse(DirectResponseAction {
                status: 500,
                body: Some(DataSource {
                    specifier: Some(data_source::Specifier::InlineString(
                        "no valid destination for this route".into(),
                    )),
                    ..DataSource::default()
                }),
                ..DirectResponseAction::default()
            }));
            return out;
        }
        out.action = Some(Action::Route(action));
        out
    }

    fn retry(&mut self, field: &str, r: &mesh_api::HttpRetry) -> RetryPolicy {
        let mut policy = RetryPolicy {
            retry_on: r.retry_on.clone().unwrap_or_else(|| {
                "connect-failure,refused-stream,unavailable,cancelled,503".into()
            }),
            num_retries: Some(u32_value(r.attempts)),
            ..RetryPolicy::default()
        };
        // Istio lets status codes stand in retryOn; Envoy wants them as retriable codes.
        let (codes, conditions): (Vec<&str>, Vec<&str>) = policy
            .retry_on
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .partition(|s| s.parse::<u32>().is_ok());
        let mut conditions: Vec<String> = conditions.iter().map(|s| s.to_string()).collect();
        if !codes.is_empty() {
            conditions.push("retriable-status-codes".into());
            policy.retriable_status_codes = codes.iter().filter_map(|c| c.parse().ok()).collect();
        }
        policy.retry_on = conditions.join(",");
        if let Some(t) = &r.per_try_timeout {
            match istio_duration(t) {
                Some(d) => policy.per_try_timeout = Some(duration(d)),
                None => self.error(
                    &format!("{field}.retries.perTryTimeout"),
                    format!("{t:?} is not a duration; the per-try timeout is not applied"),
                ),
            }
        }
        policy
    }

    fn fault(&mut self, field: &str, f: &HttpFaultInjection) -> Option<HttpFault> {
        let mut out = HttpFault::default();
        if let Some(d) = &f.delay {
            match d.fixed_delay.as_deref().map(|v| (v, istio_duration(v))) {
                Some((_, Some(delay))) => {
                    out.delay = Some(FaultDelay {
                        percentage: Some(percent(d.percentage.as_ref().map(|p| p.value))),
                        fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(duration(delay))),
                    });
                }
                Some((v, None)) => self.error(
                    &format!("{field}.delay.fixedDelay"),
                    format!("{v:?} is not a duration; no delay is injected"),
                ),
                None => self.error(
                    &format!("{field}.delay"),
                    "needs fixedDelay; no delay is injected".into(),
                ),
            }
        }
        if let Some(a) = &f.abort {
            match a.http_status {
                Some(code) if (200..600).contains(&code) => {
                    out.abort = Some(FaultAbort {
                        percentage: Some(percent(a.percentage.as_ref().map(|p| p.value))),
                        error_type: Some(ErrorType::HttpStatus(code)),
                        ..FaultAbort::default()
                    });
                }
                other => self.error(
                    &format!("{field}.abort.httpStatus"),
                    format!("{other:?} is not an HTTP status (200-599); no abort is injected"),
                ),
            }
        }
        (out.delay.is_some() || out.abort.is_some()).then_some(out)
    }

    /// The cluster of a destination: a service of this waypoint, on a port it has.
    fn cluster(&mut self, field: &str, d: &Destination) -> Option<String> {
        let (ns, name) = resolve_host(&d.host, &self.ns);
        let port = d.port.as_ref().map_or(self.port, |p| p.number);
        let found = self.inputs.service(ns, name).and_then(|s| {
            let p = (s.ports.iter().find(|p| p.port == port))
                .or_else(|| (s.ports.len() == 1).then(|| &s.ports[0]))?;
            Some((s, p))
        });
        if let (Some((svc, p)), Some(subset)) = (found, &d.subset) {
            let known = super::destination_rule::subsets(svc.destination_rule.as_deref())
                .iter()
                .any(|s| &s.name == subset);
            if !known {
                self.error(
                    &format!("{field}.subset"),
                    format!("subset {subset:?} is not defined by a DestinationRule for {}; the destination is left out", svc.hostname),
                );
                return None;
            }
            return Some(service_cluster(self.inputs, svc, p, Some(subset)));
        }
        let found = found.map(|(svc, p)| service_cluster(self.inputs, svc, p, None));
        if found.is_none() {
            self.error(
                field,
                format!(
                    "{}:{port} is not a service of waypoint {} (or has no such port); requests to it get 500",
                    d.host, self.inputs.key
                ),
            );
        }
        found
    }

    fn string_match(&mut self, field: &str, m: &StringMatch) -> Option<MatchPattern> {
        match (&m.exact, &m.prefix, &m.regex) {
            (Some(v), _, _) => Some(MatchPattern::Exact(v.clone())),
            (None, Some(v), _) => Some(MatchPattern::Prefix(v.clone())),
            (None, None, Some(v)) => self.regex(field, v).map(MatchPattern::SafeRegex),
            (None, None, None) => {
                self.error(
                    field,
                    "needs exact, prefix or regex; the match is left out".into(),
                );
                None
            }
        }
    }

    fn regex(&mut self, field: &str, value: &str) -> Option<RegexMatcher> {
        match regex::Regex::new(value) {
            Ok(_) if !has_unsupported_re2(value) => Some(RegexMatcher {
                regex: value.to_string(),
                ..RegexMatcher::default()
            }),
            result => {
                let detail = result
                    .err()
                    .map_or_else(|| "not RE2".into(), |e| e.to_string());
                self.error(
                    field,
                    format!("{value:?} is not a valid regular expression ({detail}); the match is left out"),
                );
                None
            }
        }
    }

    fn route_match(&mut self, field: &str, m: &VsHttpMatch) -> Option<RouteMatch> {
        // A match for another port, or (by `gateways`) for other gateways or the mesh, does
        // not apply here.
        if m.port.is_some_and(|p| p != u32::from(self.port)) {
            return None;
        }
        if !m.gateways.is_empty() {
            let here = self.gateway.unwrap_or("mesh");
            if !(m.gateways.iter()).any(|g| gateway_name(g, &self.ns) == here) {
                return None;
            }
        }
        let mut out = RouteMatch {
            case_sensitive: m.ignore_uri_case.then(|| super::any::bool_value(false)),
            ..RouteMatch::default()
        };
        out.path_specifier = Some(match &m.uri {
            None => PathSpecifier::Prefix("/".into()),
            Some(u) => match self.string_match(&format!("{field}.uri"), u)? {
                MatchPattern::Exact(v) => PathSpecifier::Path(v),
                MatchPattern::Prefix(v) => PathSpecifier::Prefix(v),
                MatchPattern::SafeRegex(r) => PathSpecifier::SafeRegex(r),
                _ => PathSpecifier::Prefix("/".into()),
            },
        });
        if let Some(method) = &m.method {
            let p = self.string_match(&format!("{field}.method"), method)?;
            out.headers.push(header_matcher(":method", p));
        }
        for (name, h) in &m.headers {
            let p = self.string_match(&format!("{field}.headers.{name}"), h)?;
            out.headers.push(header_matcher(name, p));
        }
        for (name, q) in &m.query_params {
            let p = self.string_match(&format!("{field}.queryParams.{name}"), q)?;
            out.query_parameters.push(QueryParameterMatcher {
                name: name.clone(),
                query_parameter_match_specifier: Some(QueryParameterMatchSpecifier::StringMatch(
                    StringMatcher {
                        match_pattern: Some(p),
                        ..StringMatcher::default()
                    },
                )),
            });
        }
        Some(out)
    }
}
