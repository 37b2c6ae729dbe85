//! A redirector that also keeps the node's probe SNAT set in step: an enrolled pod's IPs are
//! added to `istio-inpod-probes-*` so the kubelet's probes reach it from 169.254.7.127 and
//! bypass capture; unenrolling removes them.

use std::sync::Arc;

use super::{HostProbeSnat, PodNetwork, RedirectError, Redirector};

/// `inner` plus the host-side probe set.
pub struct WithProbeSnat {
    inner: Arc<dyn Redirector>,
    probes: HostProbeSnat,
}

impl std::fmt::Debug for WithProbeSnat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithProbeSnat")
            .field("inner", &self.inner.name())
            .finish()
    }
}

impl WithProbeSnat {
    /// Installs the host table (idempotent) and wraps `inner`.
    pub fn new(inner: Arc<dyn Redirector>, probes: HostProbeSnat) -> Result<Self, RedirectError> {
        probes.install()?;
        Ok(WithProbeSnat { inner, probes })
    }
}

impl Redirector for WithProbeSnat {
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.inner.enroll(pod)?;
        for ip in &pod.ips {
            if let Err(e) = self.probes.add_pod_ip(*ip) {
                // All or nothing: no capture without its probe exemption.
                for added in &pod.ips {
                    let _ = self.probes.remove_pod_ip(*added);
                }
                let _ = self.inner.unenroll(pod);
                return Err(e);
            }
        }
        Ok(())
    }

    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        let mut first = self.inner.unenroll(pod).err();
        for ip in &pod.ips {
            if let Err(e) = self.probes.remove_pod_ip(*ip) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError> {
        self.inner.is_enrolled(pod)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn adopt(&self, pod: &PodNetwork) {
        self.inner.adopt(pod);
    }
}
