//! clsact qdiscs and direct-action `bpf` filters over rtnetlink (what `tc qdisc add dev X
//! clsact` and `tc filter replace dev X ingress pref 1337 handle 1 bpf da fd N` do).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

use crate::netlink::{self, Netlink, Request, NLM_F_CREATE, NLM_F_EXCL};
use mesh_capture::TC_FILTER_PRIORITY;

const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_NEWTFILTER: u16 = 44;
const RTM_DELTFILTER: u16 = 45;
const RTM_GETTFILTER: u16 = 46;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_FD: u16 = 6;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
/// `TC_H_CLSACT` (= `TC_H_INGRESS`): the clsact qdisc's parent.
const TC_H_CLSACT: u32 = 0xffff_fff1;
const CLSACT_HANDLE: u32 = 0xffff_0000;
const ETH_P_ALL: u16 = 0x0003;
const FILTER_HANDLE: u32 = 1;
const TCMSG_LEN: usize = 20;

/// Which clsact hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    /// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`.
    fn parent(self) -> u32 {
        match self {
            Hook::Ingress => 0xffff_fff2,
            Hook::Egress => 0xffff_fff3,
        }
    }
}

/// A filter found on a hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    pub priority: u16,
    pub handle: u32,
    pub kind: String,
    /// `TCA_BPF_NAME` of a `bpf` filter.
    pub name: Option<String>,
}

/// `struct tcmsg`.
fn tcmsg(ifindex: u32, handle: u32, parent: u32, info: u32) -> [u8; TCMSG_LEN] {
    let mut msg = [0u8; TCMSG_LEN];
    msg[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    msg[8..12].copy_from_slice(&handle.to_ne_bytes());
    msg[12..16].copy_from_slice(&parent.to_ne_bytes());
    msg[16..20].copy_from_slice(&info.to_ne_bytes());
    msg
}

/// `tcm_info` of our filters: priority in the upper half, protocol (network order) below.
fn filter_info() -> u32 {
    (u32::from(TC_FILTER_PRIORITY) << 16) | u32::from(ETH_P_ALL.to_be())
}

/// Adds the clsact qdisc to `ifindex`; an existing one is kept.
pub(crate) fn add_clsact(nl: &mut Netlink, ifindex: u32) -> io::Result<()> {
    let request = Request::new(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL)
        .header(&tcmsg(ifindex, CLSACT_HANDLE, TC_H_CLSACT, 0))
        .attr_str(TCA_KIND, "clsact");
    match nl.ack(request) {
        Err(error) if error.raw_os_error() == Some(Errno::EEXIST as i32) => Ok(()),
        other => other,
    }
}

/// Removes the clsact qdisc of `ifindex` (and every filter on it); absent is fine.
pub(crate) fn delete_clsact(nl: &mut Netlink, ifindex: u32) -> io::Result<()> {
    let request = Request::new(RTM_DELQDISC, 0)
        .header(&tcmsg(ifindex, CLSACT_HANDLE, TC_H_CLSACT, 0))
        .attr_str(TCA_KIND, "clsact");
    match nl.ack(request) {
        Err(error) if is_absent(&error) => Ok(()),
        other => other,
    }
}

/// Creates or atomically replaces our filter on `hook` with the program `prog`.
pub(crate) fn replace_filter(
    nl: &mut Netlink,
    ifindex: u32,
    hook: Hook,
    prog: BorrowedFd<'_>,
    name: &str,
) -> io::Result<()> {
    let fd = u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?;
    // NLM_F_CREATE without NLM_F_EXCL: create, or replace the filter with this handle.
    let request = Request::new(RTM_NEWTFILTER, NLM_F_CREATE)
        .header(&tcmsg(ifindex, FILTER_HANDLE, hook.parent(), filter_info()))
        .attr_str(TCA_KIND, "bpf")
        .nested(TCA_OPTIONS, |options| {
            options
                .attr_u32(TCA_BPF_FD, fd)
                .attr_str(TCA_BPF_NAME, name)
                .attr_u32(TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT)
        });
    nl.ack(request)
}

/// Deletes the filter at our priority and handle on `hook`; absent is fine.
pub(crate) fn delete_filter(nl: &mut Netlink, ifindex: u32, hook: Hook) -> io::Result<()> {
    let request = Request::new(RTM_DELTFILTER, 0)
        .header(&tcmsg(ifindex, FILTER_HANDLE, hook.parent(), filter_info()))
        .attr_str(TCA_KIND, "bpf");
    match nl.ack(request) {
        Err(error) if is_absent(&error) => Ok(()),
        other => other,
    }
}

/// The filters on `hook` of `ifindex` (none when there is no clsact qdisc).
pub(crate) fn filters(nl: &mut Netlink, ifindex: u32, hook: Hook) -> io::Result<Vec<Filter>> {
    let request = Request::new(RTM_GETTFILTER, 0).header(&tcmsg(ifindex, 0, hook.parent(), 0));
    let answers = match nl.dump(request, RTM_NEWTFILTER) {
        Err(error) if is_absent(&error) => return Ok(Vec::new()),
        other => other?,
    };
    Ok(answers
        .iter()
        .filter_map(|payload| parse_filter(payload))
        .collect())
}

fn parse_filter(payload: &[u8]) -> Option<Filter> {
    if payload.len() < TCMSG_LEN {
        return None;
    }
    let handle = netlink::read_u32(payload, 8);
    let info = netlink::read_u32(payload, 16);
    // The dump also lists each priority's classifier itself, with handle 0.
    if handle == 0 {
        return None;
    }
    let mut filter = Filter {
        priority: u16::try_from(info >> 16).unwrap_or(0),
        handle,
        kind: String::new(),
        name: None,
    };
    for (ty, data) in netlink::attrs(payload, TCMSG_LEN) {
        match ty {
            TCA_KIND => filter.kind = netlink::attr_string(data),
            TCA_OPTIONS => {
                filter.name = netlink::attrs(data, 0)
                    .find(|(ty, _)| *ty == TCA_BPF_NAME)
                    .map(|(_, name)| netlink::attr_string(name));
            }
            _ => {}
        }
    }
    Some(filter)
}

/// The object (qdisc, filter) is not there: `ENOENT`, or `EINVAL` for a missing parent qdisc.
fn is_absent(error: &io::Error) -> bool {
    let errno = error.raw_os_error().map(Errno::from_raw);
    matches!(errno, Some(Errno::ENOENT | Errno::EINVAL))
}
