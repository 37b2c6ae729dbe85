//! ztunnel's connection metrics and access log, with Istio's names and labels (docs/compatibility.md, metrics).
//!
//! - [`Metrics`]: `istio_tcp_connections_opened_total`, `istio_tcp_connections_closed_total`,
//!   `istio_tcp_received_bytes_total`, `istio_tcp_sent_bytes_total`,
//!   `istio_tcp_connections_failed_total` (one typed label set, [`ConnectionLabels`]) and
//!   `istio_build`, registered through [`mesh_runtime::metrics::Metrics`].
//! - [`ConnectionRecord`]: one proxied connection from the moment its route is known until it
//!   ends; opening it counts the connection, [`ConnectionRecord::finish`] counts bytes and the
//!   close, and writes the access log line (tracing target `access`, "connection complete").

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mesh_identity::Identity;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::hbone::Transferred;
use crate::state::Workload;

#[cfg(test)]
mod tests;

/// Value of labels whose attribute is not known.
pub const UNKNOWN: &str = "unknown";

/// Which side of the connection reports it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Reporter {
    /// The client's ztunnel (outbound).
    Source,
    /// The server's ztunnel (inbound).
    Destination,
}

/// Whether the connection was carried over mutual TLS.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum SecurityPolicy {
    MutualTls,
    None,
}

/// Istio's `response_flags`: why a connection failed, `-` when it did not.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ResponseFlags {
    None,
    /// Denied by an authorization policy.
    Denied,
    /// The upstream could not be reached.
    ConnectFailure,
}

macro_rules! label_values {
    ($($t:ty { $($variant:ident => $value:literal),* })*) => {
        $(impl $t {
            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $value),*
                }
            }
        }

        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        })*
    };
}

label_values! {
    Reporter { Source => "source", Destination => "destination" }
    SecurityPolicy { MutualTls => "mutual_tls", None => "none" }
    ResponseFlags { None => "-", Denied => "DENY", ConnectFailure => "CONNECT" }
}

/// Labels of the `istio_tcp_*` metrics (Istio's standard set); missing values are `unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    pub reporter: Reporter,
    pub source_workload: String,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
    pub source_workload_namespace: String,
    pub source_principal: String,
    pub source_app: String,
    pub source_version: String,
    pub source_cluster: String,
    pub destination_service: String,
    pub destination_service_namespace: String,
    pub destination_service_name: String,
    pub destination_workload: String,
    pub destination_canonical_service: String,
    pub destination_canonical_revision: String,
    pub destination_workload_namespace: String,
    pub destination_principal: String,
    pub destination_app: String,
    pub destination_version: String,
    pub destination_cluster: String,
    pub request_protocol: String,
    pub response_flags: ResponseFlags,
    pub connection_security_policy: SecurityPolicy,
}

/// Labels of `istio_build`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub component: String,
    pub tag: String,
}

/// The connection metrics of the proxy.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    opened: Family<ConnectionLabels, Counter>,
    closed: Family<ConnectionLabels, Counter>,
    received_bytes: Family<ConnectionLabels, Counter>,
    sent_bytes: Family<ConnectionLabels, Counter>,
    failed: Family<ConnectionLabels, Counter>,
    build: Family<BuildLabels, Gauge>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mesh_runtime::metrics::Metrics) -> Metrics {
        let m = Metrics::default();
        registry.register(|r| {
            r.register(
                "istio_tcp_connections_opened",
                "The total number of TCP connections opened",
                m.opened.clone(),
            );
            r.register(
                "istio_tcp_connections_closed",
                "The total number of TCP connections closed",
                m.closed.clone(),
            );
            r.register(
                "istio_tcp_received_bytes",
                "The size of total bytes received during request in case of a TCP connection",
                m.received_bytes.clone(),
            );
            r.register(
                "istio_tcp_sent_bytes",
                "The size of total bytes sent during response in case of a TCP connection",
                m.sent_bytes.clone(),
            );
            r.register(
                "istio_tcp_connections_failed",
                "The total number of TCP connections that failed to establish (unstable)",
                m.failed.clone(),
            );
            r.register("istio_build", "Istio component build info", m.build.clone());
        });
        m.build
            .get_or_create(&BuildLabels {
                component: "ztunnel".to_string(),
                tag: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        m
    }

    /// Connections opened with `labels` so far (for tests and debugging).
    pub fn opened(&self, labels: &ConnectionLabels) -> u64 {
        self.opened.get_or_create(labels).get()
    }
}

/// A workload's attributes as metric labels and log fields see them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub workload: Option<String>,
    pub namespace: Option<String>,
    pub identity: Option<Identity>,
    pub canonical_service: Option<String>,
    pub canonical_revision: Option<String>,
    pub cluster: Option<String>,
}

impl Peer {
    /// From a workload in the state; `identity` is the verified or expected identity.
    pub fn of_workload(w: &Workload, identity: Option<Identity>) -> Peer {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Peer {
            workload: non_empty(&w.workload_name).or_else(|| non_empty(&w.name)),
            namespace: non_empty(&w.namespace),
            identity,
            canonical_service: non_empty(&w.canonical_name),
            canonical_revision: non_empty(&w.canonical_revision),
            cluster: non_empty(&w.cluster_id),
        }
    }

    /// Only an identity is known (e.g. a peer not in the state).
    pub fn of_identity(identity: Identity) -> Peer {
        Peer {
            namespace: Some(identity.namespace().to_string()),
            identity: Some(identity),
            ..Peer::default()
        }
    }
}

/// A destination service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceName {
    pub hostname: String,
    pub namespace: String,
    pub name: String,
}

/// Whether the connection left (outbound) or arrived (inbound, HBONE or plaintext).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Outbound,
    Inbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }

    fn reporter(self) -> Reporter {
        match self {
            Direction::Outbound => Reporter::Source,
            Direction::Inbound => Reporter::Destination,
        }
    }
}

/// Everything known about one connection, for labels and the access log.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    pub direction: Direction,
    /// Address of the client (the original source).
    pub src_addr: SocketAddr,
    pub src: Peer,
    /// The address the client asked for (or the tunnel's target inbound).
    pub dst_addr: SocketAddr,
    /// HBONE endpoint the connection was tunnelled to (outbound) or arrived on (inbound).
    pub hbone_addr: Option<SocketAddr>,
    pub dst: Peer,
    pub dst_service: Option<ServiceName>,
    pub security: SecurityPolicy,
}

impl ConnectionInfo {
    /// The metric labels of this connection.
    pub fn labels(&self, flags: ResponseFlags) -> ConnectionLabels {
        let or_unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| UNKNOWN.to_string());
        let principal = |p: &Peer| {
            p.identity
                .as_ref()
                .map_or_else(|| UNKNOWN.to_string(), |i| i.to_string())
        };
        let svc = self.dst_service.as_ref();
        let svc_field = |f: fn(&ServiceName) -> &str| {
            svc.map_or_else(|| UNKNOWN.to_string(), |s| f(s).to_string())
        };
        ConnectionLabels {
            reporter: self.direction.reporter(),
            source_workload: or_unknown(&self.src.workload),
            source_canonical_service: or_unknown(&self.src.canonical_service),
            source_canonical_revision: or_unknown(&self.src.canonical_revision),
            source_workload_namespace: or_unknown(&self.src.namespace),
            source_principal: principal(&self.src),
            source_app: or_unknown(&self.src.canonical_service),
            source_version: or_unknown(&self.src.canonical_revision),
            source_cluster: or_unknown(&self.src.cluster),
            destination_service: svc_field(|s| &s.hostname),
            destination_service_namespace: svc_field(|s| &s.namespace),
            destination_service_name: svc_field(|s| &s.name),
            destination_workload: or_unknown(&self.dst.workload),
            destination_canonical_service: or_unknown(&self.dst.canonical_service),
            destination_canonical_revision: or_unknown(&self.dst.canonical_revision),
            destination_workload_namespace: or_unknown(&self.dst.namespace),
            destination_principal: principal(&self.dst),
            destination_app: or_unknown(&self.dst.canonical_service),
            destination_version: or_unknown(&self.dst.canonical_revision),
            destination_cluster: or_unknown(&self.dst.cluster),
            request_protocol: "tcp".to_string(),
            response_flags: flags,
            connection_security_policy: self.security,
        }
    }
}

/// How a connection ended, for [`ConnectionRecord::finish`].
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Bytes were copied until both sides closed.
    Completed(Transferred),
    /// The connection failed; `transferred` is what was copied before.
    Failed {
        flags: ResponseFlags,
        error: &'a (dyn std::error::Error + 'a),
        transferred: Transferred,
    },
}

/// One connection between its routing and its end. Dropping it without
/// [`ConnectionRecord::finish`] (a task aborted at the drain deadline) records a failure.
#[derive(Debug)]
pub struct ConnectionRecord {
    metrics: Metrics,
    /// The labels are made from it again at the close rather than kept: a record lives as
    /// long as its connection, and their strings would double its size.
    info: ConnectionInfo,
    start: Instant,
    finished: bool,
}

/// The error a record dropped without [`ConnectionRecord::finish`] reports.
#[derive(Debug, thiserror::Error)]
#[error("connection closed before it completed (proxy drained or task aborted)")]
struct Aborted;

impl ConnectionRecord {
    /// Counts the connection as opened.
    pub fn open(metrics: &Metrics, info: ConnectionInfo) -> ConnectionRecord {
        let labels = info.labels(ResponseFlags::None);
        metrics.opened.get_or_create(&labels).inc();
        ConnectionRecord {
            metrics: metrics.clone(),
            info,
            start: Instant::now(),
            finished: false,
        }
    }

    /// The connection's attributes.
    pub fn info(&self) -> &ConnectionInfo {
        &self.info
    }

    /// Counts the close and the bytes, and writes the access log line.
    pub fn finish(mut self, outcome: Outcome<'_>) {
        self.finished = true;
        self.record(outcome);
    }

    fn record(&self, outcome: Outcome<'_>) {
        let (transferred, failure) = match outcome {
            Outcome::Completed(t) => (t, None),
            Outcome::Failed {
                flags,
                error,
                transferred,
            } => (transferred, Some((flags, error))),
        };
        let flags = failure.map_or(ResponseFlags::None, |(flags, _)| flags);
        let labels = self.info.labels(flags);
        self.metrics.closed.get_or_create(&labels).inc();
        if failure.is_some() {
            self.metrics.failed.get_or_create(&labels).inc();
        }
        // Istio: received = bytes from the client (request), sent = bytes back (response).
        self.metrics
            .received_bytes
            .get_or_create(&labels)
            .inc_by(transferred.sent);
        self.metrics
            .sent_bytes
            .get_or_create(&labels)
            .inc_by(transferred.received);
        access_log(
            &self.info,
            transferred,
            self.start.elapsed(),
            failure.map(|(_, e)| e),
        );
    }
}

impl Drop for ConnectionRecord {
    fn drop(&mut self) {
        if !self.finished {
            self.record(Outcome::Failed {
                flags: ResponseFlags::None,
                error: &Aborted,
                transferred: Transferred::default(),
            });
        }
    }
}

fn display_opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(String::new, |v| v.to_string())
}

/// The access log line of a finished connection.
fn access_log(
    info: &ConnectionInfo,
    t: Transferred,
    duration: Duration,
    error: Option<&(dyn std::error::Error + '_)>,
) {
    let src_workload = display_opt(&info.src.workload);
    let src_namespace = display_opt(&info.src.namespace);
    let src_identity = display_opt(&info.src.identity);
    let dst_hbone = display_opt(&info.hbone_addr);
    let dst_service = info
        .dst_service
        .as_ref()
        .map_or_else(String::new, |s| s.hostname.clone());
    let dst_workload = display_opt(&info.dst.workload);
    let dst_namespace = display_opt(&info.dst.namespace);
    let dst_identity = display_opt(&info.dst.identity);
    let duration = format!("{}ms", duration.as_millis());
    macro_rules! log {
        ($level:expr, $($extra:tt)*) => {
            tracing::event!(
                target: "access",
                $level,
                src.addr = %info.src_addr,
                src.workload = %src_workload,
                src.namespace = %src_namespace,
                src.identity = %src_identity,
                dst.addr = %info.dst_addr,
                dst.hbone_addr = %dst_hbone,
                dst.service = %dst_service,
                dst.workload = %dst_workload,
                dst.namespace = %dst_namespace,
                dst.identity = %dst_identity,
                direction = info.direction.as_str(),
                bytes_sent = t.sent,
                bytes_recv = t.received,
                duration = %duration,
                $($extra)*
            )
        };
    }
    match error {
        None => log!(tracing::Level::INFO, "connection complete"),
        Some(e) => log!(tracing::Level::ERROR, error = %e, "connection complete"),
    }
}
