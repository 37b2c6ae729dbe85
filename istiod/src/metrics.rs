//! istiod's own metrics (push pipeline, configuration, CA) with Istio's names where Istio has
//! them. The xDS server registers its own (`pilot_xds`, `pilot_xds_pushes`, ...).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::ca::CaStats;
use crate::live_ca::ReloadStats;
use crate::push::PushStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigEventLabels {
    /// Object kind (Pod, Service, ...).
    pub r#type: String,
    /// `apply` or `delete`.
    pub event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Push pipeline and configuration metrics.
#[derive(Clone, Debug)]
pub struct PushMetrics {
    debounce_time: Histogram,
    build_time: Histogram,
    config_events: Family<ConfigEventLabels, Counter>,
    config_errors: Family<ReasonLabels, Counter>,
    snapshot_version: Gauge,
    model_errors: Gauge,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

impl PushMetrics {
    pub fn register(reg: &mut Registry) -> PushMetrics {
        let m = PushMetrics {
            debounce_time: seconds_histogram(),
            build_time: seconds_histogram(),
            config_events: Family::default(),
            config_errors: Family::default(),
            snapshot_version: Gauge::default(),
            model_errors: Gauge::default(),
        };
        reg.register(
            "pilot_debounce_time",
            "Delay in seconds between the first config event and the push",
            m.debounce_time.clone(),
        );
        reg.register(
            "pilot_pushcontext_init_seconds",
            "Time in seconds to build a snapshot",
            m.build_time.clone(),
        );
        reg.register(
            "pilot_k8s_cfg_events",
            "Configuration events from the cluster source",
            m.config_events.clone(),
        );
        reg.register(
            "istiod_config_errors",
            "Invalid configuration documents reported by the source, by reason",
            m.config_errors.clone(),
        );
        reg.register(
            "istiod_snapshot_version",
            "Version of the current snapshot",
            m.snapshot_version.clone(),
        );
        reg.register(
            "istiod_model_errors",
            "Current model errors (IP conflicts, invalid fields)",
            m.model_errors.clone(),
        );
        m
    }

    pub fn record_push(&self, stats: &PushStats, model_errors: usize) {
        self.debounce_time.observe(stats.debounce.as_secs_f64());
        self.build_time.observe(stats.build.as_secs_f64());
        self.snapshot_version
            .set(i64::try_from(stats.version).unwrap_or(i64::MAX));
        self.model_errors
            .set(i64::try_from(model_errors).unwrap_or(i64::MAX));
    }

    pub fn record_event(&self, kind: &str, event: &str) {
        self.config_events
            .get_or_create(&ConfigEventLabels {
                r#type: kind.to_string(),
                event: event.to_string(),
            })
            .inc();
    }

    pub fn record_config_error(&self, reason: &str) {
        self.config_errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// One counter family whose values are read at scrape time: a series per (labels, value).
fn encode_counter_family<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (labels, n) in rows {
        ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Exposes the Kubernetes source's counters at scrape time: changes as Istio's
/// `pilot_k8s_reg_events{type,event}` (add, update, delete), and re-lists, watch errors and
/// undecodable objects by kind.
#[derive(Debug)]
pub struct KubeSourceCollector(pub Arc<mesh_source::KubeSourceStats>);

impl Collector for KubeSourceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.0.snapshot();
        let families = [
            (
                "pilot_k8s_reg_events",
                "Changes the Kubernetes API source passed on, by kind and event",
                &["add", "update", "delete"][..],
            ),
            (
                "istiod_kube_relists",
                "Lists started by the Kubernetes watchers (first sync, 410 Gone, reconnects)",
                &["relist"][..],
            ),
            (
                "istiod_kube_watch_errors",
                "Kubernetes watch or list failures (retried with backoff)",
                &["watch_error"][..],
            ),
            (
                "istiod_kube_invalid_objects",
                "Kubernetes objects that do not decode (their last good version is kept)",
                &["invalid"][..],
            ),
        ];
        for (name, help, events) in families {
            let rows =
                counts
                    .iter()
                    .filter(|(_, e, _)| events.contains(e))
                    .map(|(kind, event, n)| {
                        let labels = if events.len() > 1 {
                            vec![("type", kind.as_str()), ("event", *event)]
                        } else {
                            vec![("kind", kind.as_str())]
                        };
                        (labels, *n)
                    });
            encode_counter_family(&mut encoder, name, help, rows)?;
        }
        Ok(())
    }
}

/// Exposes the CA's counters at scrape time under Istio's `citadel_server_*` names.
#[derive(Debug)]
pub struct CaCollector(pub Arc<CaStats>);

impl Collector for CaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let issued = self.0.issued();
        let refused = self.0.refused();
        let total = issued + refused.values().sum::<u64>();
        let simple = [
            ("citadel_server_csr_count", "CSRs received", total),
            (
                "citadel_server_success_cert_issuance_count",
                "Certificates issued",
                issued,
            ),
            (
                "citadel_server_authentication_failure_count",
                "CSRs refused because the caller could not be authenticated",
                self.0.authentication_failures(),
            ),
        ];
        for (name, help, value) in simple {
            let c = ConstCounter::new(value);
            let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(m)?;
        }
        encode_counter_family(
            &mut encoder,
            "istiod_ca_refusals",
            "CSRs refused, by reason",
            refused
                .into_iter()
                .map(|(reason, n)| (vec![("reason", reason)], n)),
        )
    }
}

/// Labels of `istiod_status_writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusWriteLabels {
    /// The kind of the object written (Service, ServiceEntry, AuthorizationPolicy).
    pub kind: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Registers `istiod_status_writes_total`.
pub fn register_status_writes(reg: &mut Registry) -> Family<StatusWriteLabels, Counter> {
    let family = Family::default();
    reg.register(
        "istiod_status_writes",
        "Status writes (server-side apply on /status), by object kind and result",
        family.clone(),
    );
    family
}

/// Reloads of the plugged-in CA: `istiod_cacerts_reloads_total{result="ok|error"}`.
#[derive(Debug)]
pub struct CaReloadCollector(pub Arc<ReloadStats>);

impl Collector for CaReloadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_counter_family(
            &mut encoder,
            "istiod_cacerts_reloads",
            "Changes of the plugged-in CA's files, by whether the new CA loaded",
            [("ok", self.0.reloaded()), ("error", self.0.failed())]
                .map(|(result, n)| (vec![("result", result)], n)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_collector_renders_istio_names() {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(CaCollector(Arc::new(CaStats::default()))));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        assert!(out.contains("citadel_server_csr_count_total 0"), "{out}");
        assert!(
            out.contains("citadel_server_success_cert_issuance_count_total 0"),
            "{out}"
        );
    }
}
