//! `istio_dns_requests_total`, `istio_dns_upstream_requests_total` and
//! `istio_dns_upstream_failures_total`, with upstream ztunnel's labels.
//!
//! [`serve`](super::serve) has a fixed signature without a metrics handle, so the counters
//! live in a process-global `OnceLock`: [`DnsMetrics::register`] creates them, registers them
//! and installs them for every DNS proxy of the process (the first registration is the one
//! counted in). Before any registration, counting does nothing.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::message::Transport;

static GLOBAL: OnceLock<DnsMetrics> = OnceLock::new();

/// Label value of an attribute that is not known.
const UNKNOWN: &str = "unknown";

/// Labels of every DNS counter (upstream `DnsLabels`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DnsLabels {
    /// Lower-case record type, `a`, `aaaa`, `srv`...
    pub request_query_type: String,
    /// `udp` or `tcp`.
    pub request_protocol: String,
    /// The pod's canonical service, `unknown` until its workload is known.
    pub source_canonical_service: String,
    /// The pod's canonical revision, `unknown` until its workload is known.
    pub source_canonical_revision: String,
}

impl DnsLabels {
    pub(super) fn new(
        qtype: hickory_proto::rr::RecordType,
        transport: Transport,
        canonical_service: &str,
        canonical_revision: &str,
    ) -> DnsLabels {
        let or_unknown = |s: &str| {
            if s.is_empty() {
                UNKNOWN.to_string()
            } else {
                s.to_string()
            }
        };
        DnsLabels {
            request_query_type: qtype.to_string().to_ascii_lowercase(),
            request_protocol: match transport {
                Transport::Udp => "udp",
                Transport::Tcp => "tcp",
            }
            .to_string(),
            source_canonical_service: or_unknown(canonical_service),
            source_canonical_revision: or_unknown(canonical_revision),
        }
    }
}

/// Handles to the DNS counters.
#[derive(Clone, Debug, Default)]
pub struct DnsMetrics {
    requests: Family<DnsLabels, Counter>,
    upstream_requests: Family<DnsLabels, Counter>,
    upstream_failures: Family<DnsLabels, Counter>,
}

impl DnsMetrics {
    /// Creates the counters, registers them in `registry` and, if no DNS metrics were
    /// installed yet, installs them for every DNS proxy of this process.
    pub fn register(registry: &mesh_runtime::metrics::Metrics) -> DnsMetrics {
        let m = DnsMetrics::default();
        registry.register(|r| {
            r.register(
                "istio_dns_requests",
                "Total number of DNS requests (unstable)",
                m.requests.clone(),
            );
            r.register(
                "istio_dns_upstream_requests",
                "Total number of DNS requests forwarded to upstream (unstable)",
                m.upstream_requests.clone(),
            );
            r.register(
                "istio_dns_upstream_failures",
                "Total number of DNS requests that failed to forward upstream (unstable)",
                m.upstream_failures.clone(),
            );
        });
        if GLOBAL.set(m.clone()).is_err() {
            tracing::debug!("DNS metrics already installed; these handles are not counted in");
        }
        m
    }
}

/// What happened to one query, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counted {
    /// Answered by ztunnel.
    Local,
    /// Forwarded, answered upstream.
    Forwarded,
    /// Forwarded, upstream failed.
    Failed,
}

/// Counts one query in the installed metrics, if any. `labels` is only built when needed.
pub(super) fn count(what: Counted, labels: impl FnOnce() -> DnsLabels) {
    let Some(m) = GLOBAL.get() else {
        return;
    };
    let labels = labels();
    m.requests.get_or_create(&labels).inc();
    if what != Counted::Local {
        m.upstream_requests.get_or_create(&labels).inc();
    }
    if what == Counted::Failed {
        m.upstream_failures.get_or_create(&labels).inc();
    }
}
