//! xDS server metrics, with Istio's names and labels (pilot/pkg/xds/monitoring.go).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Istio's buckets for `pilot_proxy_convergence_time` (seconds).
const CONVERGENCE_BUCKETS: [f64; 8] = [0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];

/// `version` label of `pilot_xds`: the proxy's Istio version (`ISTIO_VERSION` metadata).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

/// `type` label: the short xDS type (`wds`, `wads`, `cds`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: String,
}

/// The xDS server's metrics. Cloning shares them.
#[derive(Clone, Debug)]
pub struct XdsMetrics {
    connected: Family<VersionLabels, Gauge>,
    pushes: Family<TypeLabels, Counter>,
    rejects: Family<TypeLabels, Counter>,
    expired_nonce: Family<TypeLabels, Counter>,
    convergence: Histogram,
}

impl Default for XdsMetrics {
    fn default() -> Self {
        XdsMetrics {
            connected: Family::default(),
            pushes: Family::default(),
            rejects: Family::default(),
            expired_nonce: Family::default(),
            convergence: Histogram::new(CONVERGENCE_BUCKETS),
        }
    }
}

impl XdsMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> XdsMetrics {
        let m = XdsMetrics::default();
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS.",
            m.connected.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds.",
            m.pushes.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy.",
            m.rejects.clone(),
        );
        registry.register(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce.",
            m.expired_nonce.clone(),
        );
        registry.register(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required \
             configuration.",
            m.convergence.clone(),
        );
        m
    }

    pub(crate) fn connected(&self, version: &str) -> Gauge {
        self.connected
            .get_or_create(&VersionLabels {
                version: version.to_string(),
            })
            .clone()
    }

    pub(crate) fn pushed(&self, type_label: &str) {
        self.pushes.get_or_create(&type_label_set(type_label)).inc();
    }

    pub(crate) fn rejected(&self, type_label: &str) {
        self.rejects
            .get_or_create(&type_label_set(type_label))
            .inc();
    }

    pub(crate) fn expired_nonce(&self, type_label: &str) {
        self.expired_nonce
            .get_or_create(&type_label_set(type_label))
            .inc();
    }

    pub(crate) fn converged(&self, delay: Duration) {
        self.convergence.observe(delay.as_secs_f64());
    }
}

fn type_label_set(type_label: &str) -> TypeLabels {
    TypeLabels {
        r#type: type_label.to_string(),
    }
}
