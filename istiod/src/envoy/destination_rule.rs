//! DestinationRule on a waypoint's service clusters: subsets (one cluster each, over the
//! endpoints whose labels match), load balancer, connection pool limits and outlier detection,
//! with the rule's `portLevelSettings` and each subset's own policy merged as Istio merges them.

use std::time::Duration;

use mesh_api::{
    ClientTlsSettings, ConnectionPoolSettings, ConsistentHash, DestinationRule,
    LoadBalancerSettings, OutlierDetection as IstioOutlier, Subset, TrafficPolicy,
};
use mesh_proto::envoy::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::{
        CommonLbConfig, LbConfig, LbPolicy, LeastRequestLbConfig, MaglevLbConfig, RingHashLbConfig,
    },
    CircuitBreakers, Cluster, OutlierDetection,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::HttpProtocolOptions as CommonHttpOptions;
use mesh_proto::envoy::pb::envoy::config::route::v3::route_action::{hash_policy, HashPolicy};
use mesh_proto::envoy::pb::envoy::r#type::v3::Percent;
use mesh_proto::envoy::pb::google::protobuf::UInt64Value;

use super::any::{duration, u32_value};
use super::routes::RouteError;
use super::virtual_service::istio_duration;

/// Istio's ring size when a consistent hash names none.
const DEFAULT_RING_SIZE: u64 = 1024;

/// The four policy parts that apply to one cluster (a port of the host, maybe a subset).
#[derive(Debug, Default, Clone, Copy)]
pub struct ClusterPolicy<'a> {
    pub load_balancer: Option<&'a LoadBalancerSettings>,
    pub connection_pool: Option<&'a ConnectionPoolSettings>,
    pub outlier_detection: Option<&'a IstioOutlier>,
    pub tls: Option<&'a ClientTlsSettings>,
}

impl<'a> ClusterPolicy<'a> {
    /// `policy` for `port`: its top-level parts, each replaced by a matching
    /// `portLevelSettings` entry as a whole (a port entry does not inherit: what it leaves out
    /// is the default).
    fn of(policy: Option<&'a TrafficPolicy>, port: u16) -> Option<ClusterPolicy<'a>> {
        let policy = policy?;
        let at_port = (policy.port_level_settings.iter())
            .find(|p| p.port.as_ref().is_some_and(|s| s.number == port));
        Some(match at_port {
            Some(p) => ClusterPolicy {
                load_balancer: p.load_balancer.as_ref(),
                connection_pool: p.connection_pool.as_ref(),
                outlier_detection: p.outlier_detection.as_ref(),
                tls: p.tls.as_ref(),
            },
            None => ClusterPolicy {
                load_balancer: policy.load_balancer.as_ref(),
                connection_pool: policy.connection_pool.as_ref(),
                outlier_detection: policy.outlier_detection.as_ref(),
                tls: policy.tls.as_ref(),
            },
        })
    }

    /// The policy of the cluster for `port` (and `subset`): the rule's, then each part the
    /// subset's own policy sets replaces the rule's.
    pub fn resolve(
        rule: Option<&'a DestinationRule>,
        subset: Option<&'a Subset>,
        port: u16,
    ) -> ClusterPolicy<'a> {
        let base = ClusterPolicy::of(rule.and_then(|r| r.spec.traffic_policy.as_ref()), port)
            .unwrap_or_default();
        let Some(own) = ClusterPolicy::of(subset.and_then(|s| s.traffic_policy.as_ref()), port)
        else {
            return base;
        };
        ClusterPolicy {
            load_balancer: own.load_balancer.or(base.load_balancer),
            connection_pool: own.connection_pool.or(base.connection_pool),
            outlier_detection: own.outlier_detection.or(base.outlier_detection),
            tls: own.tls.or(base.tls),
        }
    }

    /// The TLS mode (`DISABLE`, `SIMPLE`, `MUTUAL`, `ISTIO_MUTUAL`), if the policy sets one.
    pub fn tls_mode(&self) -> Option<&'a str> {
        self.tls.and_then(|t| t.mode.as_deref())
    }

    fn consistent_hash(&self) -> Option<&'a ConsistentHash> {
        self.load_balancer
            .and_then(|lb| lb.consistent_hash.as_ref())
    }
}

/// The subsets of `rule`, if any.
pub fn subsets(rule: Option<&DestinationRule>) -> &[Subset] {
    rule.map_or(&[], |r| r.spec.subsets.as_slice())
}

/// Whether an endpoint with `labels` belongs to `subset`.
pub fn in_subset(subset: &Subset, labels: &std::collections::BTreeMap<String, String>) -> bool {
    subset
        .labels
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
}

/// Reports problems of one DestinationRule against the field they are in.
pub struct Reporter<'e> {
    pub rule: String,
    pub field: String,
    pub errors: &'e mut Vec<RouteError>,
}

impl Reporter<'_> {
    pub(super) fn error(&mut self, part: &str, problem: String) {
        let field = if self.field.is_empty() {
            part.to_string()
        } else {
            format!("{}.{part}", self.field)
        };
        let e = RouteError::DestinationRule {
            name: self.rule.clone(),
            field,
            problem,
        };
        if !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    fn duration(&mut self, part: &str, value: Option<&String>) -> Option<Duration> {
        let v = value?;
        let parsed = istio_duration(v);
        if parsed.is_none() {
            self.error(
                part,
                format!("{v:?} is not a duration (e.g. 1s, 500ms, 1m); the setting is not applied"),
            );
        }
        parsed
    }
}

/// Sets the load balancer, circuit breakers, HTTP connection options and outlier detection of
/// `cluster`; returns the common HTTP options the cluster's protocol options must carry.
pub fn apply(
    cluster: &mut Cluster,
    policy: &ClusterPolicy<'_>,
    report: &mut Reporter<'_>,
) -> Option<CommonHttpOptions> {
    apply_load_balancer(cluster, policy.load_balancer, report);
    let common = apply_connection_pool(cluster, policy.connection_pool, report);
    if let Some(o) = policy.outlier_detection {
        apply_outlier(cluster, o, report);
    }
    common
}

fn apply_load_balancer(
    cluster: &mut Cluster,
    lb: Option<&LoadBalancerSettings>,
    report: &mut Reporter<'_>,
) {
    if let Some(hash) = lb.and_then(|l| l.consistent_hash.as_ref()) {
        let keyed = hash.http_header_name.is_some()
            || hash.http_cookie.is_some()
            || hash.use_source_ip == Some(true)
            || hash.http_query_parameter_name.is_some();
        if !keyed {
            report.error(
                "trafficPolicy.loadBalancer.consistentHash",
                "names no hash key (httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName); requests spread as by a random hash".into(),
            );
        }
        if let Some(m) = &hash.maglev {
            cluster.lb_policy = LbPolicy::Maglev as i32;
            cluster.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
                table_size: m.table_size.map(|value| UInt64Value { value }),
            }));
        } else {
            let size = (hash.ring_hash.as_ref())
                .and_then(|r| r.minimum_ring_size)
                .or(hash.minimum_ring_size)
                .unwrap_or(DEFAULT_RING_SIZE);
            cluster.lb_policy = LbPolicy::RingHash as i32;
            cluster.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                minimum_ring_size: Some(UInt64Value { value: size }),
                ..RingHashLbConfig::default()
            }));
        }
        return;
    }
    let simple = lb
        .and_then(|l| l.simple.as_deref())
        .unwrap_or("UNSPECIFIED");
    cluster.lb_policy = match simple {
        "ROUND_ROBIN" => LbPolicy::RoundRobin as i32,
        "RANDOM" => LbPolicy::Random as i32,
        // Istio's default, and what LEAST_CONN has always meant in Envoy.
        "LEAST_REQUEST" | "LEAST_CONN" | "UNSPECIFIED" => {
            cluster.lb_config = Some(LbConfig::LeastRequestLbConfig(
                LeastRequestLbConfig::default(),
            ));
            LbPolicy::LeastRequest as i32
        }
        other => {
            report.error(
                "trafficPolicy.loadBalancer.simple",
                format!("{other:?} is not supported on waypoints (ROUND_ROBIN, LEAST_REQUEST, LEAST_CONN, RANDOM are); the default LEAST_REQUEST applies"),
            );
            LbPolicy::LeastRequest as i32
        }
    };
}

/// Istio's thresholds when nothing is set: no limit, remaining capacity tracked.
fn default_thresholds() -> Thresholds {
    Thresholds {
        max_connections: Some(u32_value(u32::MAX)),
        max_pending_requests: Some(u32_value(u32::MAX)),
        max_requests: Some(u32_value(u32::MAX)),
        max_retries: Some(u32_value(u32::MAX)),
        track_remaining: true,
        ..Thresholds::default()
    }
}

/// A positive limit as a `UInt32Value` (values over `u32::MAX` saturate); 0 or less is
/// reported and leaves the default.
fn limit(
    report: &mut Reporter<'_>,
    part: &str,
    value: Option<i64>,
) -> Option<mesh_proto::envoy::pb::google::protobuf::UInt32Value> {
    let v = value?;
    if v <= 0 {
        report.error(
            part,
            format!("{v} is not a positive limit; the default (no limit) applies"),
        );
        return None;
    }
    Some(u32_value(u32::try_from(v).unwrap_or(u32::MAX)))
}

fn apply_connection_pool(
    cluster: &mut Cluster,
    pool: Option<&ConnectionPoolSettings>,
    report: &mut Reporter<'_>,
) -> Option<CommonHttpOptions> {
    let mut t = default_thresholds();
    let mut common = CommonHttpOptions::default();
    let mut any_common = false;
    if let Some(tcp) = pool.and_then(|p| p.tcp.as_ref()) {
        let f = "trafficPolicy.connectionPool.tcp";
        if let Some(v) = limit(report, &format!("{f}.maxConnections"), tcp.max_connections) {
            t.max_connections = Some(v);
        }
        if let Some(d) =
            report.duration(&format!("{f}.connectTimeout"), tcp.connect_timeout.as_ref())
        {
            cluster.connect_timeout = Some(duration(d));
        }
        if let Some(d) = report.duration(
            &format!("{f}.maxConnectionDuration"),
            tcp.max_connection_duration.as_ref(),
        ) {
            common.max_connection_duration = Some(duration(d));
            any_common = true;
        }
    }
    if let Some(http) = pool.and_then(|p| p.http.as_ref()) {
        let f = "trafficPolicy.connectionPool.http";
        if let Some(v) = limit(
            report,
            &format!("{f}.http1MaxPendingRequests"),
            http.http1_max_pending_requests,
        ) {
            t.max_pending_requests = Some(v);
        }
        if let Some(v) = limit(
            report,
            &format!("{f}.http2MaxRequests"),
            http.http2_max_requests,
        ) {
            t.max_requests = Some(v);
        }
        if let Some(v) = limit(report, &format!("{f}.maxRetries"), http.max_retries) {
            t.max_retries = Some(v);
        }
        if let Some(v) = limit(
            report,
            &format!("{f}.maxRequestsPerConnection"),
            http.max_requests_per_connection,
        ) {
            common.max_requests_per_connection = Some(v);
            any_common = true;
        }
        if let Some(d) = report.duration(&format!("{f}.idleTimeout"), http.idle_timeout.as_ref()) {
            common.idle_timeout = Some(duration(d));
            any_common = true;
        }
    }
    cluster.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![t],
        ..CircuitBreakers::default()
    });
    any_common.then_some(common)
}

fn apply_outlier(cluster: &mut Cluster, o: &IstioOutlier, report: &mut Reporter<'_>) {
    let f = "trafficPolicy.outlierDetection";
    // A threshold of 0 turns that kind of ejection off; any other value enforces it fully.
    let enforce = |v: u32| u32_value(if v > 0 { 100 } else { 0 });
    let mut out = OutlierDetection {
        // Istio ejects on consecutive errors only, never on success rate.
        enforcing_success_rate: Some(u32_value(0)),
        ..OutlierDetection::default()
    };
    if let Some(v) = o.consecutive_5xx_errors {
        out.consecutive_5xx = Some(u32_value(v));
        out.enforcing_consecutive_5xx = Some(enforce(v));
    }
    if let Some(v) = o.consecutive_gateway_errors {
        out.consecutive_gateway_failure = Some(u32_value(v));
        out.enforcing_consecutive_gateway_failure = Some(enforce(v));
    }
    if let Some(split) = o.split_external_local_origin_errors {
        out.split_external_local_origin_errors = split;
    }
    if let Some(v) = o.consecutive_local_origin_failures {
        out.consecutive_local_origin_failure = Some(u32_value(v));
        out.enforcing_consecutive_local_origin_failure = Some(enforce(v));
    }
    if let Some(d) = report.duration(&format!("{f}.interval"), o.interval.as_ref()) {
        out.interval = Some(duration(d));
    }
    if let Some(d) = report.duration(
        &format!("{f}.baseEjectionTime"),
        o.base_ejection_time.as_ref(),
    ) {
        out.base_ejection_time = Some(duration(d));
    }
    if let Some(p) = o.max_ejection_percent {
        if (0..=100).contains(&p) {
            out.max_ejection_percent = Some(u32_value(u32::try_from(p).unwrap_or(100)));
        } else {
            report.error(
                &format!("{f}.maxEjectionPercent"),
                format!("{p} is not a percentage (0-100); Envoy's default (10%) applies"),
            );
        }
    }
    let min_health = o.min_health_percent.unwrap_or(0);
    if (0..=100).contains(&min_health) {
        // Below this share of healthy hosts, ejections are ignored (0: never).
        let common = cluster
            .common_lb_config
            .get_or_insert_with(CommonLbConfig::default);
        common.healthy_panic_threshold = Some(Percent {
            value: min_health as f64,
        });
    } else {
        report.error(
            &format!("{f}.minHealthPercent"),
            format!("{min_health} is not a percentage (0-100); Envoy's default (50%) applies"),
        );
    }
    cluster.outlier_detection = Some(out);
}

/// The route hash policy of a cluster whose load balancer is a consistent hash (empty for any
/// other cluster).
pub fn hash_policies(policy: &ClusterPolicy<'_>) -> Vec<HashPolicy> {
    let Some(h) = policy.consistent_hash() else {
        return Vec::new();
    };
    let specifier = if let Some(name) = &h.http_header_name {
        hash_policy::PolicySpecifier::Header(hash_policy::Header {
            header_name: name.clone(),
            ..hash_policy::Header::default()
        })
    } else if let Some(c) = &h.http_cookie {
        hash_policy::PolicySpecifier::Cookie(hash_policy::Cookie {
            name: c.name.clone(),
            path: c.path.clone().unwrap_or_default(),
            ttl: c.ttl.as_deref().and_then(istio_duration).map(duration),
            ..hash_policy::Cookie::default()
        })
    } else if h.use_source_ip == Some(true) {
        hash_policy::PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
            source_ip: true,
        })
    } else if let Some(q) = &h.http_query_parameter_name {
        hash_policy::PolicySpecifier::QueryParameter(hash_policy::QueryParameter {
            name: q.clone(),
        })
    } else {
        return Vec::new();
    };
    vec![HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    }]
}

/// Cluster name -> its route hash policy, for every service-port and subset cluster of the
/// waypoint whose load balancer is a consistent hash.
pub fn hash_policy_index(
    inputs: &super::inputs::WaypointInputs,
) -> std::collections::HashMap<String, Vec<HashPolicy>> {
    let mut out = std::collections::HashMap::new();
    for svc in &inputs.services {
        let rule = svc.destination_rule.as_deref();
        if rule.is_none() {
            continue;
        }
        for port in &svc.ports {
            let mut add = |subset: Option<&Subset>| {
                let policies = hash_policies(&ClusterPolicy::resolve(rule, subset, port.port));
                if !policies.is_empty() {
                    let name = super::clusters::service_cluster(
                        inputs,
                        svc,
                        port,
                        subset.map(|s| s.name.as_str()),
                    );
                    out.insert(name, policies);
                }
            };
            add(None);
            subsets(rule).iter().for_each(|s| add(Some(s)));
        }
    }
    out
}

/// Gives each route to a consistent-hash cluster that cluster's hash policy (for weighted
/// clusters, the first such destination's, as Istio does).
pub fn apply_hash_policies(
    routes: &mut [mesh_proto::envoy::pb::envoy::config::route::v3::Route],
    index: &std::collections::HashMap<String, Vec<HashPolicy>>,
) {
    use mesh_proto::envoy::pb::envoy::config::route::v3::{
        route::Action, route_action::ClusterSpecifier,
    };
    if index.is_empty() {
        return;
    }
    for r in routes {
        let Some(Action::Route(action)) = r.action.as_mut() else {
            continue;
        };
        let found = match &action.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => index.get(c),
            Some(ClusterSpecifier::WeightedClusters(w)) => {
                w.clusters.iter().find_map(|c| index.get(&c.name))
            }
            _ => None,
        };
        if let Some(p) = found {
            action.hash_policy = p.clone();
        }
    }
}
