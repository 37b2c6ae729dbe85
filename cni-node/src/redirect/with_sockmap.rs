//! A redirector that also enrolls a pod's IPv4 addresses in the sockmap programs, so the
//! local legs of its mesh connections go socket to socket (`AMBIENT_SOCKMAP`). Acceleration
//! is an optimisation: when adding an address fails, the pod stays captured and its
//! connections keep TCP, with a warning.

use std::net::IpAddr;
use std::sync::Arc;

use mesh_ebpf::Sockmap;
use tracing::warn;

use super::{PodNetwork, RedirectError, Redirector};

/// `inner` plus the sockmap's pod addresses.
pub struct WithSockmap {
    inner: Arc<dyn Redirector>,
    sockmap: Arc<Sockmap>,
}

impl std::fmt::Debug for WithSockmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithSockmap")
            .field("inner", &self.inner.name())
            .field("cgroup", &self.sockmap.cgroup())
            .finish()
    }
}

impl WithSockmap {
    pub fn new(inner: Arc<dyn Redirector>, sockmap: Arc<Sockmap>) -> WithSockmap {
        WithSockmap { inner, sockmap }
    }

    fn add_addresses(&self, pod: &PodNetwork) {
        for ip in &pod.ips {
            if let IpAddr::V4(ip) = ip {
                if let Err(error) = self.sockmap.add_pod(*ip) {
                    warn!(%ip, reason = error.reason(), "{error}; this pod's connections keep TCP");
                }
            }
        }
    }
}

impl Redirector for WithSockmap {
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.inner.enroll(pod)?;
        self.add_addresses(pod);
        Ok(())
    }

    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        for ip in &pod.ips {
            if let IpAddr::V4(ip) = ip {
                if let Err(error) = self.sockmap.remove_pod(*ip) {
                    warn!(%ip, reason = error.reason(), "{error}");
                }
            }
        }
        self.inner.unenroll(pod)
    }

    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError> {
        self.inner.is_enrolled(pod)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn adopt(&self, pod: &PodNetwork) {
        self.inner.adopt(pod);
        self.add_addresses(pod);
    }
}
