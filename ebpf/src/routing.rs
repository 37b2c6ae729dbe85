//! The policy routing of captured outbound packets (`ip rule add iif lo fwmark 0x111/0xfff pref
//! 32763 lookup 101`, `ip route replace local 0.0.0.0/0 dev lo table 101`), the pod's links,
//! and the `accept_local` sysctl, over rtnetlink and `/proc/sys`.

use std::io;

use nix::errno::Errno;

use crate::netlink::{self, Netlink, Request, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use mesh_capture::{CAPTURE_MARK, EBPF_ROUTE_TABLE, EBPF_RULE_PREF, MARK_MASK};

use crate::CaptureError;

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const RTM_GETRULE: u16 = 34;
const AF_INET: u8 = 2;
const IFLA_IFNAME: u16 = 3;
const IFF_LOOPBACK: u32 = 0x8;
const IFINFOMSG_LEN: usize = 16;
const RTMSG_LEN: usize = 12;
const FRA_IIFNAME: u16 = 3;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const FR_ACT_TO_TBL: u8 = 1;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;
const RTN_LOCAL: u8 = 2;
const RT_SCOPE_HOST: u8 = 254;
const RTPROT_STATIC: u8 = 4;
/// `RT_TABLE_UNSPEC`: the real table is in the `RTA_TABLE` / `FRA_TABLE` attribute.
const RT_TABLE_UNSPEC: u8 = 0;
/// The loopback interface's index in every network namespace.
pub(crate) const LOOPBACK_IFINDEX: u32 = 1;
/// Lets captured packets, whose source is the pod's own address, in through `lo`.
pub(crate) const ACCEPT_LOCAL: &str = "/proc/sys/net/ipv4/conf/lo/accept_local";

/// A network interface of the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub index: u32,
    pub name: String,
    pub loopback: bool,
}

/// Every interface of the namespace.
pub(crate) fn links(nl: &mut Netlink) -> io::Result<Vec<Link>> {
    let request = Request::new(RTM_GETLINK, 0).header(&[0u8; IFINFOMSG_LEN]);
    let answers = nl.dump(request, RTM_NEWLINK)?;
    Ok(answers
        .iter()
        .filter(|payload| payload.len() >= IFINFOMSG_LEN)
        .map(|payload| Link {
            index: netlink::read_u32(payload, 4),
            loopback: netlink::read_u32(payload, 8) & IFF_LOOPBACK != 0,
            name: netlink::attrs(payload, IFINFOMSG_LEN)
                .find(|(ty, _)| *ty == IFLA_IFNAME)
                .map(|(_, name)| netlink::attr_string(name))
                .unwrap_or_default(),
        })
        .collect())
}

/// `struct fib_rule_hdr` / `struct rtmsg` (same 12-byte layout).
fn rtmsg(table: u8, protocol: u8, scope: u8, ty: u8) -> [u8; RTMSG_LEN] {
    [AF_INET, 0, 0, 0, table, protocol, scope, ty, 0, 0, 0, 0]
}

fn rule_request(ty: u16, flags: u16) -> Request {
    Request::new(ty, flags)
        .header(&rtmsg(RT_TABLE_UNSPEC, 0, 0, FR_ACT_TO_TBL))
        .attr_str(FRA_IIFNAME, "lo")
        .attr_u32(FRA_PRIORITY, EBPF_RULE_PREF)
        .attr_u32(FRA_FWMARK, CAPTURE_MARK)
        .attr_u32(FRA_FWMASK, MARK_MASK)
        .attr_u32(FRA_TABLE, EBPF_ROUTE_TABLE)
}

/// Adds the capture rule unless it is there.
pub(crate) fn add_rule(nl: &mut Netlink) -> io::Result<()> {
    match nl.ack(rule_request(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL)) {
        Err(error) if error.raw_os_error() == Some(Errno::EEXIST as i32) => Ok(()),
        other => other,
    }
}

/// Deletes every copy of the capture rule.
pub(crate) fn delete_rule(nl: &mut Netlink) -> io::Result<()> {
    while rule_present(nl)? {
        nl.ack(rule_request(RTM_DELRULE, 0))?;
    }
    Ok(())
}

/// Whether a rule at our preference sends our mark to our table.
pub(crate) fn rule_present(nl: &mut Netlink) -> io::Result<bool> {
    let request = Request::new(RTM_GETRULE, 0).header(&rtmsg(0, 0, 0, 0));
    let answers = nl.dump(request, RTM_NEWRULE)?;
    Ok(answers.iter().any(|payload| {
        let mut found = (None, None, None, None);
        for (ty, data) in netlink::attrs(payload, RTMSG_LEN) {
            match ty {
                FRA_PRIORITY => found.0 = netlink::attr_u32(data),
                FRA_TABLE => found.1 = netlink::attr_u32(data),
                FRA_FWMARK => found.2 = netlink::attr_u32(data),
                FRA_FWMASK => found.3 = netlink::attr_u32(data),
                _ => {}
            }
        }
        found
            == (
                Some(EBPF_RULE_PREF),
                Some(EBPF_ROUTE_TABLE),
                Some(CAPTURE_MARK),
                Some(MARK_MASK),
            )
    }))
}

fn route_request(ty: u16, flags: u16) -> Request {
    Request::new(ty, flags)
        .header(&rtmsg(
            RT_TABLE_UNSPEC,
            RTPROT_STATIC,
            RT_SCOPE_HOST,
            RTN_LOCAL,
        ))
        .attr_u32(RTA_TABLE, EBPF_ROUTE_TABLE)
        .attr_u32(RTA_OIF, LOOPBACK_IFINDEX)
}

/// `ip route replace local 0.0.0.0/0 dev lo table 101`.
pub(crate) fn replace_route(nl: &mut Netlink) -> io::Result<()> {
    nl.ack(route_request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE))
}

/// Deletes the capture route; absent is fine.
pub(crate) fn delete_route(nl: &mut Netlink) -> io::Result<()> {
    match nl.ack(route_request(RTM_DELROUTE, 0)) {
        Err(error)
            if matches!(
                error.raw_os_error().map(Errno::from_raw),
                Some(Errno::ESRCH | Errno::ENOENT)
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Whether table 101 has the `local 0.0.0.0/0 dev lo` route.
pub(crate) fn route_present(nl: &mut Netlink) -> io::Result<bool> {
    let request = Request::new(RTM_GETROUTE, 0).header(&rtmsg(0, 0, 0, 0));
    let answers = nl.dump(request, RTM_NEWROUTE)?;
    Ok(answers.iter().any(|payload| {
        if payload.len() < RTMSG_LEN || payload[1] != 0 || payload[7] != RTN_LOCAL {
            return false;
        }
        let mut table = u32::from(payload[4]);
        let mut oif = None;
        for (ty, data) in netlink::attrs(payload, RTMSG_LEN) {
            match ty {
                RTA_TABLE => table = netlink::attr_u32(data).unwrap_or(table),
                RTA_OIF => oif = netlink::attr_u32(data),
                _ => {}
            }
        }
        table == EBPF_ROUTE_TABLE && oif == Some(LOOPBACK_IFINDEX)
    }))
}

/// Writes a sysctl of the calling thread's network namespace.
pub(crate) fn set_sysctl(path: &'static str, value: &str) -> Result<(), CaptureError> {
    std::fs::write(path, value).map_err(|source| CaptureError::Sysctl { path, source })
}

/// Reads a sysctl of the calling thread's network namespace, trimmed.
pub(crate) fn sysctl(path: &'static str) -> Result<String, CaptureError> {
    std::fs::read_to_string(path)
        .map(|value| value.trim().to_owned())
        .map_err(|source| CaptureError::Sysctl { path, source })
}
