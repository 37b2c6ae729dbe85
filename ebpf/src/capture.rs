//! Enrolling a pod: programs attached to its interfaces, the rule, the route and the sysctl.

use std::path::Path;

use crate::sysctl::{self, ACCEPT_LOCAL};
use crate::tc::{self, Hook};
use mesh_capture::netns;
use mesh_capture::routing::{self, Family, Link, EBPF_DELIVERY, LOOPBACK_IFINDEX};
use mesh_capture::rtnl::Rtnl;
use mesh_capture::TC_FILTER_PRIORITY;

use crate::{CaptureError, Programs, PROGRAM_NAMES};

/// What a pod's capture covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Capture inbound connections into ztunnel's 15006 (`mesh_capture_in`); false for pods
    /// annotated `ambient.istio.io/bypass-inbound-capture: "true"`.
    pub inbound: bool,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions { inbound: true }
    }
}

/// eBPF capture for pods (see the crate docs). Cheap to share: the programs are loaded once.
#[derive(Debug)]
pub struct Capture {
    programs: Programs,
}

impl Capture {
    /// Loads the programs (fails without the `bpf` feature, or when the kernel refuses them).
    pub fn new() -> Result<Capture, CaptureError> {
        Ok(Capture {
            programs: Programs::load()?,
        })
    }

    /// The loaded programs.
    pub fn programs(&self) -> &Programs {
        &self.programs
    }

    /// Installs the capture in the namespace at `netns` (every interface present now),
    /// replacing an earlier one. On failure nothing of it is left behind.
    pub fn enroll(&self, netns: &Path) -> Result<(), CaptureError> {
        self.enroll_with(netns, CaptureOptions::default())
    }

    /// [`Capture::enroll`] with `options` (a capture without `mesh_capture_in` when inbound is off).
    pub fn enroll_with(&self, netns: &Path, options: CaptureOptions) -> Result<(), CaptureError> {
        netns::run_in(netns, || {
            let result = self.enroll_here(options);
            if result.is_err() {
                if let Err(error) = self.remove_here() {
                    tracing::warn!(netns = %netns.display(), %error, "cannot undo a failed eBPF enrollment");
                }
            }
            result
        })?
    }

    /// Removes the capture from the namespace at `netns`; what is absent is skipped, and a
    /// namespace that no longer exists is not an error.
    pub fn unenroll(&self, netns: &Path) -> Result<(), CaptureError> {
        match netns::run_in(netns, || self.remove_here()) {
            Ok(result) => result,
            Err(error) if error.is_gone() => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Whether the complete capture is present in the namespace at `netns`.
    pub fn is_enrolled(&self, netns: &Path) -> Result<bool, CaptureError> {
        self.is_enrolled_with(netns, CaptureOptions::default())
    }

    /// Whether the capture `options` describe is present (and nothing of inbound capture when
    /// inbound is off).
    pub fn is_enrolled_with(
        &self,
        netns: &Path,
        options: CaptureOptions,
    ) -> Result<bool, CaptureError> {
        netns::run_in(netns, || enrolled_here(options))?
    }

    fn enroll_here(&self, options: CaptureOptions) -> Result<(), CaptureError> {
        let mut nl = Rtnl::open()?;
        sysctl::set_sysctl(ACCEPT_LOCAL, "1")?;
        EBPF_DELIVERY.install(&mut nl, Family::V4)?;
        let [name_in, name_out, name_lo] = PROGRAM_NAMES;
        self.programs.add_clsact(LOOPBACK)?;
        self.programs.attach(name_lo, LOOPBACK, Hook::Ingress)?;
        for link in pod_links(&mut nl)? {
            self.programs.add_clsact(&link.name)?;
            if options.inbound {
                self.programs.attach(name_in, &link.name, Hook::Ingress)?;
            } else {
                // Re-enrolling with inbound off drops an earlier mesh_capture_in.
                self.programs.detach(&link.name, Hook::Ingress, name_in)?;
            }
            self.programs.attach(name_out, &link.name, Hook::Egress)?;
            tracing::debug!(interface = %link.name, "eBPF capture attached");
        }
        Ok(())
    }

    /// Undoes `enroll_here` in the calling thread's namespace, pod interfaces first.
    fn remove_here(&self) -> Result<(), CaptureError> {
        let mut nl = Rtnl::open()?;
        let mut links = pod_links(&mut nl)?;
        links.push(Link {
            index: LOOPBACK_IFINDEX,
            name: LOOPBACK.to_owned(),
            loopback: true,
        });
        for link in &links {
            self.remove_filters(&mut nl, link)?;
        }
        EBPF_DELIVERY.remove(&mut nl, Family::V4)?;
        sysctl::set_sysctl(ACCEPT_LOCAL, "0")
    }

    /// Detaches our filters of `link`, then deletes its clsact qdisc when nothing else uses it.
    fn remove_filters(&self, nl: &mut Rtnl, link: &Link) -> Result<(), CaptureError> {
        let mut others = 0;
        for hook in [Hook::Egress, Hook::Ingress] {
            for filter in tc::filters(nl, link.index, hook)? {
                match filter.name.as_deref() {
                    Some(name) if is_ours(&filter) => {
                        self.programs.detach(&link.name, hook, name)?
                    }
                    _ => others += 1,
                }
            }
        }
        if others == 0 {
            tc::delete_clsact(nl, link.index)?;
        }
        Ok(())
    }
}

/// `lo`'s name (its index is `LOOPBACK_IFINDEX` in every namespace).
const LOOPBACK: &str = "lo";

/// The interfaces other than `lo`.
fn pod_links(nl: &mut Rtnl) -> Result<Vec<Link>, CaptureError> {
    let links = routing::links(nl)?;
    Ok(links.into_iter().filter(|link| !link.loopback).collect())
}

fn is_ours(filter: &tc::Filter) -> bool {
    filter.priority == TC_FILTER_PRIORITY
        && filter
            .name
            .as_deref()
            .is_some_and(|name| PROGRAM_NAMES.contains(&name))
}

/// Whether every piece of the capture is present in the calling thread's namespace.
fn enrolled_here(options: CaptureOptions) -> Result<bool, CaptureError> {
    let mut nl = Rtnl::open()?;
    if sysctl::sysctl(ACCEPT_LOCAL)? != "1" || !EBPF_DELIVERY.present(&mut nl, Family::V4)? {
        return Ok(false);
    }
    let [name_in, name_out, name_lo] = PROGRAM_NAMES;
    let mut wanted = vec![(LOOPBACK_IFINDEX, Hook::Ingress, name_lo)];
    for link in pod_links(&mut nl)? {
        if options.inbound {
            wanted.push((link.index, Hook::Ingress, name_in));
        } else if tc::filters(&mut nl, link.index, Hook::Ingress)?
            .iter()
            .any(is_ours)
        {
            return Ok(false);
        }
        wanted.push((link.index, Hook::Egress, name_out));
    }
    for (ifindex, hook, name) in wanted {
        let filters = tc::filters(&mut nl, ifindex, hook)?;
        if !filters
            .iter()
            .any(|f| is_ours(f) && f.name.as_deref() == Some(name))
        {
            return Ok(false);
        }
    }
    Ok(true)
}
