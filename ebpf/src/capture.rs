//! Enrolling a pod: programs attached to its interfaces, the rule, the route and the sysctl.

use std::path::Path;

use crate::netlink::Netlink;
use crate::routing::{self, Link, ACCEPT_LOCAL, LOOPBACK_IFINDEX};
use crate::tc::{self, Hook};
use mesh_capture::netns;
use mesh_capture::TC_FILTER_PRIORITY;

use crate::{netlink_error, CaptureError, Programs, FILTER_NAMES};

/// What a pod's capture covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Capture inbound connections into ztunnel's 15006 (`capture_in`); false for pods
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

    /// [`Capture::enroll`] with `options` (a capture without `capture_in` when inbound is off).
    pub fn enroll_with(&self, netns: &Path, options: CaptureOptions) -> Result<(), CaptureError> {
        netns::run_in(netns, || {
            let result = self.enroll_here(options);
            if result.is_err() {
                if let Err(error) = remove_here() {
                    tracing::warn!(netns = %netns.display(), %error, "cannot undo a failed eBPF enrollment");
                }
            }
            result
        })?
    }

    /// Removes the capture from the namespace at `netns`; what is absent is skipped, and a
    /// namespace that no longer exists is not an error.
    pub fn unenroll(&self, netns: &Path) -> Result<(), CaptureError> {
        match netns::run_in(netns, remove_here) {
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
        let mut nl = Netlink::open().map_err(netlink_error("open a netlink socket"))?;
        routing::set_sysctl(ACCEPT_LOCAL, "1")?;
        routing::replace_route(&mut nl).map_err(netlink_error("add the local capture route"))?;
        routing::add_rule(&mut nl).map_err(netlink_error("add the capture rule"))?;
        let [name_in, name_out, name_lo] = FILTER_NAMES;
        tc::add_clsact(&mut nl, LOOPBACK_IFINDEX).map_err(netlink_error("add clsact to lo"))?;
        tc::replace_filter(
            &mut nl,
            LOOPBACK_IFINDEX,
            Hook::Ingress,
            self.programs.capture_lo(),
            name_lo,
        )
        .map_err(netlink_error("attach capture_lo"))?;
        for link in pod_links(&mut nl)? {
            tc::add_clsact(&mut nl, link.index).map_err(netlink_error("add clsact"))?;
            if options.inbound {
                tc::replace_filter(
                    &mut nl,
                    link.index,
                    Hook::Ingress,
                    self.programs.capture_in(),
                    name_in,
                )
                .map_err(netlink_error("attach capture_in"))?;
            } else {
                // Re-enrolling with inbound off drops an earlier capture_in.
                delete_named(&mut nl, link.index, Hook::Ingress, name_in)?;
            }
            tc::replace_filter(
                &mut nl,
                link.index,
                Hook::Egress,
                self.programs.capture_out(),
                name_out,
            )
            .map_err(netlink_error("attach capture_out"))?;
            tracing::debug!(interface = %link.name, "eBPF capture attached");
        }
        Ok(())
    }
}

/// The interfaces other than `lo`.
fn pod_links(nl: &mut Netlink) -> Result<Vec<Link>, CaptureError> {
    let links = routing::links(nl).map_err(netlink_error("list interfaces"))?;
    Ok(links.into_iter().filter(|link| !link.loopback).collect())
}

/// Undoes `enroll_here` in the calling thread's namespace, pod interfaces first.
fn remove_here() -> Result<(), CaptureError> {
    let mut nl = Netlink::open().map_err(netlink_error("open a netlink socket"))?;
    let mut indexes: Vec<u32> = pod_links(&mut nl)?.iter().map(|l| l.index).collect();
    indexes.push(LOOPBACK_IFINDEX);
    for index in indexes {
        remove_filters(&mut nl, index)?;
    }
    routing::delete_rule(&mut nl).map_err(netlink_error("delete the capture rule"))?;
    routing::delete_route(&mut nl).map_err(netlink_error("delete the local capture route"))?;
    routing::set_sysctl(ACCEPT_LOCAL, "0")
}

/// Deletes our filters of `ifindex`, then its clsact qdisc when nothing else uses it.
fn remove_filters(nl: &mut Netlink, ifindex: u32) -> Result<(), CaptureError> {
    let mut others = 0;
    for hook in [Hook::Egress, Hook::Ingress] {
        for filter in tc::filters(nl, ifindex, hook).map_err(netlink_error("list tc filters"))? {
            if is_ours(&filter) {
                tc::delete_filter(nl, ifindex, hook)
                    .map_err(netlink_error("delete a capture filter"))?;
            } else {
                others += 1;
            }
        }
    }
    if others == 0 {
        tc::delete_clsact(nl, ifindex).map_err(netlink_error("delete clsact"))?;
    }
    Ok(())
}

fn is_ours(filter: &tc::Filter) -> bool {
    filter.priority == TC_FILTER_PRIORITY
        && filter
            .name
            .as_deref()
            .is_some_and(|name| FILTER_NAMES.contains(&name))
}

/// Deletes our filter `name` on `ifindex`'s `hook`, if present.
fn delete_named(
    nl: &mut Netlink,
    ifindex: u32,
    hook: Hook,
    name: &str,
) -> Result<(), CaptureError> {
    let filters = tc::filters(nl, ifindex, hook).map_err(netlink_error("list tc filters"))?;
    if filters
        .iter()
        .any(|f| is_ours(f) && f.name.as_deref() == Some(name))
    {
        tc::delete_filter(nl, ifindex, hook).map_err(netlink_error("delete a capture filter"))?;
    }
    Ok(())
}

/// Whether every piece of the capture is present in the calling thread's namespace.
fn enrolled_here(options: CaptureOptions) -> Result<bool, CaptureError> {
    let mut nl = Netlink::open().map_err(netlink_error("open a netlink socket"))?;
    if routing::sysctl(ACCEPT_LOCAL)? != "1"
        || !routing::rule_present(&mut nl).map_err(netlink_error("list rules"))?
        || !routing::route_present(&mut nl).map_err(netlink_error("list routes"))?
    {
        return Ok(false);
    }
    let [name_in, name_out, name_lo] = FILTER_NAMES;
    let mut wanted = vec![(LOOPBACK_IFINDEX, Hook::Ingress, name_lo)];
    for link in pod_links(&mut nl)? {
        if options.inbound {
            wanted.push((link.index, Hook::Ingress, name_in));
        } else {
            let ingress = tc::filters(&mut nl, link.index, Hook::Ingress)
                .map_err(netlink_error("list tc filters"))?;
            if ingress.iter().any(is_ours) {
                return Ok(false);
            }
        }
        wanted.push((link.index, Hook::Egress, name_out));
    }
    for (ifindex, hook, name) in wanted {
        let filters =
            tc::filters(&mut nl, ifindex, hook).map_err(netlink_error("list tc filters"))?;
        if !filters
            .iter()
            .any(|f| is_ours(f) && f.name.as_deref() == Some(name))
        {
            return Ok(false);
        }
    }
    Ok(true)
}
