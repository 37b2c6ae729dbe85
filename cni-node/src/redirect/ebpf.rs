//! [`EbpfRedirector`]: in-pod capture with tc eBPF programs instead of nftables (crate
//! `mesh-ebpf`; its docs explain the mechanism). Same listeners and exemptions as the
//! nftables rules; no NAT, so ztunnel reads the original destination from the accepted
//! socket's local address, and its outbound listener needs `IP_TRANSPARENT`.
//!
//! Not covered yet: IPv6 and DNS capture (`dns_capture` is ignored with a warning).

use std::path::Path;

use mesh_ebpf::{Capture, CaptureError, CaptureOptions};

use super::{PodNetwork, RedirectError, Redirector};

/// Capture with eBPF; the programs are loaded once, in [`EbpfRedirector::new`].
#[derive(Debug)]
pub struct EbpfRedirector {
    capture: Capture,
}

impl EbpfRedirector {
    /// Loads the programs: fails when the kernel or the privileges do not allow it (or the
    /// crate was built without BPF programs).
    pub fn new() -> Result<EbpfRedirector, CaptureError> {
        Ok(EbpfRedirector {
            capture: Capture::new()?,
        })
    }
}

impl Redirector for EbpfRedirector {
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        if pod.dns_capture {
            tracing::warn!(netns = %pod.netns.display(), "the eBPF redirector does not capture DNS yet; use the nftables redirector for DNS capture");
        }
        self.capture
            .enroll_with(&pod.netns, options(pod))
            .map_err(|error| redirect_error(&pod.netns, error))
    }

    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError> {
        self.capture
            .unenroll(&pod.netns)
            .map_err(|error| redirect_error(&pod.netns, error))
    }

    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError> {
        self.capture
            .is_enrolled_with(&pod.netns, options(pod))
            .map_err(|error| redirect_error(&pod.netns, error))
    }

    fn name(&self) -> &'static str {
        "ebpf"
    }
}

fn options(pod: &PodNetwork) -> CaptureOptions {
    CaptureOptions {
        inbound: !pod.bypass_inbound,
    }
}

fn redirect_error(netns: &Path, error: CaptureError) -> RedirectError {
    let path = netns.to_owned();
    match error {
        CaptureError::Enter(error) => error.into(),
        CaptureError::Netlink { what, source } => RedirectError::Netlink { what, path, source },
        CaptureError::Sysctl { source, .. } => RedirectError::Netlink {
            what: "set net.ipv4.conf.lo.accept_local",
            path,
            source,
        },
        source => RedirectError::Ebpf {
            path,
            source: Box::new(source),
        },
    }
}
