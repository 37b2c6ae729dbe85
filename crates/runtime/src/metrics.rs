//! Prometheus metrics: one shared registry and its text rendering.

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;

/// A registry shared between the components that register metrics and the HTTP handler.
#[derive(Clone, Default)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with the registry to register metrics.
    pub fn register<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut reg)
    }

    /// Renders every metric in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
            tracing::warn!(error = %e, "failed to encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    #[test]
    fn renders_registered_counters() {
        let m = Metrics::new();
        let c: Counter = Counter::default();
        m.register(|r| r.register("pilot_xds_pushes", "Pushes", c.clone()));
        c.inc();
        let text = m.render();
        assert!(text.contains("pilot_xds_pushes_total 1"), "{text}");
    }
}
