//! Istio's request metrics without Istio's Envoy filters: Envoy streams one access log entry
//! per HTTP request to this service (gRPC ALS over a unix socket), and the agent counts them
//! as `istio_requests_total`, `istio_request_duration_milliseconds`, `istio_request_bytes` and
//! `istio_response_bytes` with Istio's labels, served on 15020. The `reporter` tag of the chain
//! says which side the proxy is: `waypoint` (no tag), `source` (a sidecar's outbound) or
//! `destination` (a sidecar's inbound); a sidecar fills in its own side from its own workload.
//!
//! Where the other labels come from: the source principal is the identity HBONE carried (filter
//! state set by the HBONE listener) or the client certificate of the connection; the
//! destination service is a literal tag of the chain, or the upstream cluster's host; the
//! destination workload and principal are the upstream endpoint's metadata. A peer's workload
//! names are not known without Istio's peer metadata exchange, and are reported as `unknown`,
//! as Istio does for peers without metadata.

use std::sync::Arc;

use mesh_proto::envoy::pb::envoy::data::accesslog::v3::{
    AccessLogCommon, HttpAccessLogEntry, HttpRequestProperties, HttpResponseProperties,
    ResponseFlags,
};
use mesh_proto::envoy::pb::envoy::service::accesslog::v3::access_log_service_server::{
    AccessLogService, AccessLogServiceServer,
};
use mesh_proto::envoy::pb::envoy::service::accesslog::v3::{
    stream_access_logs_message::LogEntries, StreamAccessLogsMessage, StreamAccessLogsResponse,
};
use mesh_runtime::metrics::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tokio_stream::StreamExt;

/// Filter state, tags and log name istiod configures the waypoint's access logs with.
pub const PEER_PRINCIPAL_STATE: &str = "io.istio.peer_principal";
pub const TAG_DESTINATION_SERVICE: &str = "destination_service";
pub const TAG_DESTINATION_WORKLOAD: &str = "destination_workload";
pub const TAG_DESTINATION_PRINCIPAL: &str = "destination_principal";
pub const TAG_REPORTER: &str = "reporter";
pub const TAG_SECURITY_POLICY: &str = "connection_security_policy";

/// The proxy's own workload: the side of a request a sidecar reports for itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalWorkload {
    pub workload: String,
    pub namespace: String,
    pub principal: String,
    pub canonical_service: String,
    pub canonical_revision: String,
    pub app: String,
    pub version: String,
    pub cluster: String,
}

impl LocalWorkload {
    /// From the agent's configuration and its pod's labels, as Istio's stats name a workload.
    pub fn of(
        cfg: &crate::config::Config,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> LocalWorkload {
        let label = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
        let workload = (cfg.metadata.get("WORKLOAD_NAME"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| cfg.pod_name.clone());
        LocalWorkload {
            canonical_service: label(&[
                "service.istio.io/canonical-name",
                "app.kubernetes.io/name",
                "app",
            ])
            .unwrap_or_else(|| workload.clone()),
            canonical_revision: label(&[
                "service.istio.io/canonical-revision",
                "app.kubernetes.io/version",
                "version",
            ])
            .unwrap_or_else(|| "latest".into()),
            app: label(&["app"]).unwrap_or_default(),
            version: label(&["version"]).unwrap_or_default(),
            namespace: cfg.pod_namespace.clone(),
            principal: format!(
                "spiffe://{}/ns/{}/sa/{}",
                cfg.trust_domain, cfg.pod_namespace, cfg.service_account
            ),
            cluster: cfg.cluster_id.clone(),
            workload,
        }
    }
}

/// Istio's default buckets: milliseconds for durations, bytes for sizes.
const DURATION_BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];
const BYTES_BUCKETS: [f64; 9] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8];

const UNKNOWN: &str = "unknown";

/// Istio's standard request labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub reporter: String,
    pub source_workload: String,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
    pub source_workload_namespace: String,
    pub source_principal: String,
    pub source_app: String,
    pub source_version: String,
    pub source_cluster: String,
    pub destination_workload: String,
    pub destination_workload_namespace: String,
    pub destination_principal: String,
    pub destination_app: String,
    pub destination_version: String,
    pub destination_service: String,
    pub destination_service_name: String,
    pub destination_service_namespace: String,
    pub destination_canonical_service: String,
    pub destination_canonical_revision: String,
    pub destination_cluster: String,
    pub request_protocol: String,
    pub response_code: String,
    pub grpc_response_status: String,
    pub response_flags: String,
    pub connection_security_policy: String,
}

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// The request metric families.
#[derive(Clone)]
pub struct RequestMetrics {
    local: Arc<LocalWorkload>,
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
    request_bytes: HistogramFamily,
    response_bytes: HistogramFamily,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

fn bytes_histogram() -> Histogram {
    Histogram::new(BYTES_BUCKETS)
}

impl RequestMetrics {
    /// Registers the families in `metrics`; `local` is the proxy's own workload.
    pub fn new(metrics: &Metrics, local: LocalWorkload) -> RequestMetrics {
        let m = RequestMetrics {
            local: Arc::new(local),
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            request_bytes: Family::new_with_constructor(bytes_histogram),
            response_bytes: Family::new_with_constructor(bytes_histogram),
        };
        metrics.register(|r| {
            r.register(
                "istio_requests",
                "Requests handled by the proxy",
                m.requests.clone(),
            );
            r.register(
                "istio_request_duration_milliseconds",
                "Request duration",
                m.duration.clone(),
            );
            r.register(
                "istio_request_bytes",
                "Request size",
                m.request_bytes.clone(),
            );
            r.register(
                "istio_response_bytes",
                "Response size",
                m.response_bytes.clone(),
            );
        });
        m
    }

    /// Counts one request.
    pub fn record(&self, entry: &HttpAccessLogEntry) {
        let labels = labels(entry, &self.local);
        let parts = Parts::of(entry);
        let ms = (parts.common.time_to_last_downstream_tx_byte.as_ref())
            .or(parts.common.duration.as_ref())
            .map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6);
        let (request, response) = (parts.request, parts.response);
        self.requests.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(ms);
        self.request_bytes
            .get_or_create(&labels)
            .observe((request.request_headers_bytes + request.request_body_bytes) as f64);
        self.response_bytes
            .get_or_create(&labels)
            .observe((response.response_headers_bytes + response.response_body_bytes) as f64);
    }
}

/// The parts of an entry, borrowed (an absent part reads as empty); entries come per request,
/// so nothing is copied.
struct Parts<'a> {
    common: &'a AccessLogCommon,
    request: &'a HttpRequestProperties,
    response: &'a HttpResponseProperties,
}

impl<'a> Parts<'a> {
    fn of(entry: &'a HttpAccessLogEntry) -> Parts<'a> {
        static COMMON: std::sync::OnceLock<AccessLogCommon> = std::sync::OnceLock::new();
        static REQUEST: std::sync::OnceLock<HttpRequestProperties> = std::sync::OnceLock::new();
        static RESPONSE: std::sync::OnceLock<HttpResponseProperties> = std::sync::OnceLock::new();
        Parts {
            common: (entry.common_properties.as_ref())
                .unwrap_or_else(|| COMMON.get_or_init(AccessLogCommon::default)),
            request: (entry.request.as_ref())
                .unwrap_or_else(|| REQUEST.get_or_init(HttpRequestProperties::default)),
            response: (entry.response.as_ref())
                .unwrap_or_else(|| RESPONSE.get_or_init(HttpResponseProperties::default)),
        }
    }
}

/// A `google.protobuf.StringValue` (how Envoy serializes string filter state).
#[derive(Clone, PartialEq, prost::Message)]
struct StringValue {
    #[prost(string, tag = "1")]
    value: String,
}

fn or_unknown(s: &str) -> String {
    if s.is_empty() {
        UNKNOWN.into()
    } else {
        s.into()
    }
}

/// `spiffe://<td>/ns/<ns>/sa/<sa>` -> `<ns>`.
fn principal_namespace(principal: &str) -> Option<&str> {
    let rest = principal.strip_prefix("spiffe://")?;
    let mut parts = rest.split('/').skip(1);
    match (parts.next(), parts.next()) {
        (Some("ns"), Some(ns)) => Some(ns),
        _ => None,
    }
}

/// The labels of one request, reported by the proxy of `local`.
pub fn labels(entry: &HttpAccessLogEntry, local: &LocalWorkload) -> RequestLabels {
    let Parts {
        common,
        request,
        response,
    } = Parts::of(entry);
    let tag = |k: &str| common.custom_tags.get(k).cloned().unwrap_or_default();
    let tunnel_peer = (common.filter_state_objects.get(PEER_PRINCIPAL_STATE))
        .and_then(|any| <StringValue as prost::Message>::decode(any.value.as_slice()).ok())
        .map(|s| s.value)
        .filter(|p| !p.is_empty());
    let tls_peer = || {
        let cert = common
            .tls_properties
            .as_ref()?
            .peer_certificate_properties
            .as_ref()?;
        cert.subject_alt_name.iter().find_map(|san| match &san.san {
            Some(mesh_proto::envoy::pb::envoy::data::accesslog::v3::tls_properties::certificate_properties::subject_alt_name::San::Uri(u)) => Some(u.clone()),
            _ => None,
        })
    };
    let source_principal = tunnel_peer.or_else(tls_peer).unwrap_or_default();
    let reporter = Some(tag(TAG_REPORTER))
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "waypoint".into());
    let mut destination_service = tag(TAG_DESTINATION_SERVICE);
    if destination_service.is_empty() {
        destination_service = common
            .upstream_cluster
            .rsplit('|')
            .next()
            .unwrap_or_default()
            .to_string();
    }
    let mut host = destination_service.split('.');
    let (svc_name, svc_ns) = (
        host.next().unwrap_or_default(),
        host.next().unwrap_or_default(),
    );
    // `workload;namespace;canonical service;canonical revision;cluster`.
    let workload = tag(TAG_DESTINATION_WORKLOAD);
    let w: Vec<&str> = workload.split(';').collect();
    let part = |i: usize| or_unknown(w.get(i).copied().unwrap_or_default());
    let grpc = request
        .request_headers
        .get("content-type")
        .is_some_and(|c| c.starts_with("application/grpc"));
    let grpc_status = (response.response_trailers.get("grpc-status"))
        .or_else(|| response.response_headers.get("grpc-status"))
        .cloned()
        .unwrap_or_default();
    let security = Some(tag(TAG_SECURITY_POLICY))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "mutual_tls".into());
    let mut l = RequestLabels {
        reporter: reporter.clone(),
        source_workload: UNKNOWN.into(),
        source_canonical_service: UNKNOWN.into(),
        source_canonical_revision: UNKNOWN.into(),
        source_workload_namespace: or_unknown(
            principal_namespace(&source_principal).unwrap_or_default(),
        ),
        source_principal: or_unknown(&source_principal),
        source_app: UNKNOWN.into(),
        source_version: UNKNOWN.into(),
        source_cluster: UNKNOWN.into(),
        destination_workload: part(0),
        destination_workload_namespace: part(1),
        destination_principal: or_unknown(&tag(TAG_DESTINATION_PRINCIPAL)),
        destination_app: part(2),
        destination_version: part(3),
        destination_service: or_unknown(&destination_service),
        destination_service_name: or_unknown(svc_name),
        destination_service_namespace: or_unknown(svc_ns),
        destination_canonical_service: part(2),
        destination_canonical_revision: part(3),
        destination_cluster: part(4),
        request_protocol: if grpc { "grpc" } else { "http" }.into(),
        response_code: response.response_code.map_or(0, |c| c.value).to_string(),
        grpc_response_status: grpc_status,
        response_flags: response_flags(common.response_flags.as_ref()),
        connection_security_policy: security,
    };
    let own_side = match reporter.as_str() {
        "source" => Some([
            &mut l.source_workload,
            &mut l.source_workload_namespace,
            &mut l.source_principal,
            &mut l.source_canonical_service,
            &mut l.source_canonical_revision,
            &mut l.source_app,
            &mut l.source_version,
            &mut l.source_cluster,
        ]),
        "destination" => Some([
            &mut l.destination_workload,
            &mut l.destination_workload_namespace,
            &mut l.destination_principal,
            &mut l.destination_canonical_service,
            &mut l.destination_canonical_revision,
            &mut l.destination_app,
            &mut l.destination_version,
            &mut l.destination_cluster,
        ]),
        _ => None,
    };
    let own = [
        &local.workload,
        &local.namespace,
        &local.principal,
        &local.canonical_service,
        &local.canonical_revision,
        &local.app,
        &local.version,
        &local.cluster,
    ];
    for (field, value) in own_side.into_iter().flatten().zip(own) {
        *field = or_unknown(value);
    }
    l
}

/// Envoy's short response flags (`-` for none), comma-separated as `%RESPONSE_FLAGS%`.
fn response_flags(f: Option<&ResponseFlags>) -> String {
    let Some(f) = f else {
        return "-".into();
    };
    let flags = [
        (f.failed_local_healthcheck, "LH"),
        (f.no_healthy_upstream, "UH"),
        (f.upstream_request_timeout, "UT"),
        (f.local_reset, "LR"),
        (f.upstream_remote_reset, "UR"),
        (f.upstream_connection_failure, "UF"),
        (f.upstream_connection_termination, "UC"),
        (f.upstream_overflow, "UO"),
        (f.no_route_found, "NR"),
        (f.delay_injected, "DI"),
        (f.fault_injected, "FI"),
        (f.rate_limited, "RL"),
        (f.unauthorized_details.is_some(), "UAEX"),
        (f.rate_limit_service_error, "RLSE"),
        (f.downstream_connection_termination, "DC"),
        (f.upstream_retry_limit_exceeded, "URX"),
        (f.stream_idle_timeout, "SI"),
        (f.invalid_envoy_request_headers, "IH"),
        (f.downstream_protocol_error, "DPE"),
        (f.upstream_max_stream_duration_reached, "UMSDR"),
        (f.response_from_cache_filter, "RFCF"),
        (f.no_filter_config_found, "NFCF"),
        (f.duration_timeout, "DT"),
        (f.upstream_protocol_error, "UPE"),
        (f.no_cluster_found, "NC"),
        (f.overload_manager, "OM"),
        (f.dns_resolution_failure, "DF"),
        (f.downstream_remote_reset, "DR"),
    ];
    let set: Vec<&str> = flags
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, s)| *s)
        .collect();
    if set.is_empty() {
        "-".into()
    } else {
        set.join(",")
    }
}

/// The access log service Envoy streams to.
#[derive(Clone)]
pub struct AccessLogServer {
    metrics: Arc<RequestMetrics>,
}

impl AccessLogServer {
    pub fn new(metrics: RequestMetrics) -> AccessLogServer {
        AccessLogServer {
            metrics: Arc::new(metrics),
        }
    }

    pub fn into_service(self) -> AccessLogServiceServer<AccessLogServer> {
        AccessLogServiceServer::new(self)
    }

    fn take(&self, message: StreamAccessLogsMessage) {
        if let Some(LogEntries::HttpLogs(logs)) = message.log_entries {
            for entry in &logs.log_entry {
                self.metrics.record(entry);
            }
        }
    }
}

#[tonic::async_trait]
impl AccessLogService for AccessLogServer {
    async fn stream_access_logs(
        &self,
        request: tonic::Request<tonic::Streaming<StreamAccessLogsMessage>>,
    ) -> Result<tonic::Response<StreamAccessLogsResponse>, tonic::Status> {
        let mut stream = request.into_inner();
        while let Some(message) = stream.next().await {
            match message {
                Ok(message) => self.take(message),
                Err(status) => {
                    tracing::debug!(%status, "access log stream ended");
                    break;
                }
            }
        }
        Ok(tonic::Response::new(StreamAccessLogsResponse::default()))
    }
}

#[cfg(test)]
mod tests;
