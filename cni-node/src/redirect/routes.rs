//! The policy routing that goes with the capture rules, over rtnetlink in the calling thread's
//! netns: `ip rule add fwmark 0x111/0xfff pref 32764 lookup 100` and
//! `ip route replace local 0.0.0.0/0 dev lo table 100` (`::/0` for IPv6), so that replies of
//! connections ztunnel accepted (connmark restored into the packet mark) are delivered locally.

use std::io;

use nix::errno::Errno;
use nix::sys::socket::SockProtocol;

use mesh_capture::{CAPTURE_MARK, MARK_MASK, NFT_ROUTE_TABLE, NFT_RULE_PREF};

use super::netlink::{self, Msg, Socket, CREATE, EXCL, REPLACE, REQUEST};

const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const FR_ACT_TO_TBL: u8 = 1;
const RTA_OIF: u16 = libc::RTA_OIF;
const RTA_TABLE: u16 = libc::RTA_TABLE;
/// `sizeof(struct rtmsg)` = `sizeof(struct fib_rule_hdr)`.
const HDR_LEN: usize = 12;

/// The address families the routing is programmed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    V4,
    V6,
}

impl Family {
    fn af(self) -> u8 {
        match self {
            Family::V4 => libc::AF_INET as u8,
            Family::V6 => libc::AF_INET6 as u8,
        }
    }
}

/// `fib_rule_hdr` of the capture rule (table 100, action "to table").
fn rule_msg(ty: u16, flags: u16, family: Family) -> Msg {
    let table = NFT_ROUTE_TABLE as u8;
    let hdr = [family.af(), 0, 0, 0, table, 0, 0, FR_ACT_TO_TBL, 0, 0, 0, 0];
    let mut m = Msg::new(ty, flags, &hdr);
    m.put_u32(FRA_PRIORITY, NFT_RULE_PREF)
        .put_u32(FRA_FWMARK, CAPTURE_MARK)
        .put_u32(FRA_FWMASK, MARK_MASK)
        .put_u32(FRA_TABLE, NFT_ROUTE_TABLE);
    m
}

/// `rtmsg` of the `local default dev lo table 100` route. `scope` is `RT_SCOPE_HOST` to add
/// and `RT_SCOPE_NOWHERE` (any) to delete.
fn route_msg(ty: u16, flags: u16, family: Family, protocol: u8, scope: u8, lo: u32) -> Msg {
    let table = NFT_ROUTE_TABLE as u8;
    let local = libc::RTN_LOCAL;
    let hdr = [
        family.af(),
        0,
        0,
        0,
        table,
        protocol,
        scope,
        local,
        0,
        0,
        0,
        0,
    ];
    let mut m = Msg::new(ty, flags, &hdr);
    m.put_u32(RTA_TABLE, NFT_ROUTE_TABLE).put_u32(RTA_OIF, lo);
    m
}

fn loopback_index() -> io::Result<u32> {
    Ok(nix::net::if_::if_nametoindex("lo")?)
}

/// One rtnetlink request; `ok` lists errnos that count as success.
fn request(socket: &mut Socket, msg: Msg, ok: &[Errno]) -> io::Result<()> {
    let failures = socket.request(&mut [msg])?;
    match failures.first() {
        Some((_, errno)) if !ok.contains(errno) => Err(io::Error::from(*errno)),
        _ => Ok(()),
    }
}

/// Adds the fwmark rule (unless an identical one exists) and replaces the route.
pub(super) fn install(families: &[Family]) -> Result<(), (&'static str, io::Error)> {
    let mut socket = Socket::open(SockProtocol::NetlinkRoute).map_err(|e| ("open rtnetlink", e))?;
    let lo = loopback_index().map_err(|e| ("find lo", e))?;
    for &family in families {
        // NLM_F_EXCL makes the kernel compare with the existing rules: EEXIST = present.
        let rule = rule_msg(libc::RTM_NEWRULE, REQUEST | CREATE | EXCL, family);
        request(&mut socket, rule, &[Errno::EEXIST]).map_err(|e| ("add the fwmark ip rule", e))?;
        let route = route_msg(
            libc::RTM_NEWROUTE,
            REQUEST | CREATE | REPLACE,
            family,
            libc::RTPROT_BOOT,
            libc::RT_SCOPE_HOST,
            lo,
        );
        request(&mut socket, route, &[]).map_err(|e| ("add the capture table's local route", e))?;
    }
    Ok(())
}

/// Deletes every copy of the rule and the route; absent ones are fine.
pub(super) fn remove(families: &[Family]) -> Result<(), (&'static str, io::Error)> {
    let mut socket = Socket::open(SockProtocol::NetlinkRoute).map_err(|e| ("open rtnetlink", e))?;
    let lo = loopback_index().map_err(|e| ("find lo", e))?;
    for &family in families {
        // A few iterations remove duplicates that something else may have added.
        for _ in 0..8 {
            let rule = rule_msg(libc::RTM_DELRULE, REQUEST, family);
            match socket.request(&mut [rule]) {
                Ok(failures) if failures.is_empty() => continue,
                Ok(failures) if failures.iter().all(|(_, e)| absent(*e)) => break,
                Ok(failures) => {
                    let errno = failures.first().map_or(Errno::EIO, |(_, e)| *e);
                    return Err(("delete the fwmark ip rule", errno.into()));
                }
                Err(e) => return Err(("delete the fwmark ip rule", e)),
            }
        }
        let nowhere = libc::RT_SCOPE_NOWHERE;
        let route = route_msg(libc::RTM_DELROUTE, REQUEST, family, 0, nowhere, lo);
        let ok = [Errno::ESRCH, Errno::ENOENT, Errno::EAFNOSUPPORT];
        request(&mut socket, route, &ok)
            .map_err(|e| ("delete the capture table's local route", e))?;
    }
    Ok(())
}

fn absent(errno: Errno) -> bool {
    matches!(errno, Errno::ENOENT | Errno::ESRCH | Errno::EAFNOSUPPORT)
}

/// Whether the rule and the route are both present for `family`.
pub(super) fn present(family: Family) -> io::Result<bool> {
    let mut socket = Socket::open(SockProtocol::NetlinkRoute)?;
    let mut rule = false;
    let dump = Msg::new(
        libc::RTM_GETRULE,
        0,
        &[family.af(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    socket.dump(dump, |payload| rule |= is_capture_rule(payload))?;
    let mut route = false;
    let dump = Msg::new(
        libc::RTM_GETROUTE,
        0,
        &[family.af(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    socket.dump(dump, |payload| route |= is_capture_route(payload))?;
    Ok(rule && route)
}

fn is_capture_rule(payload: &[u8]) -> bool {
    if payload.get(7) != Some(&FR_ACT_TO_TBL) {
        return false;
    }
    let (mut pref, mut mark, mut mask) = (None, None, None);
    let mut table = payload.get(4).map(|&t| u32::from(t));
    for (ty, value) in netlink::attrs(payload, HDR_LEN) {
        match ty {
            FRA_PRIORITY => pref = netlink::attr_u32(value),
            FRA_FWMARK => mark = netlink::attr_u32(value),
            FRA_FWMASK => mask = netlink::attr_u32(value),
            FRA_TABLE => table = netlink::attr_u32(value),
            _ => {}
        }
    }
    pref == Some(NFT_RULE_PREF)
        && mark == Some(CAPTURE_MARK)
        && mask == Some(MARK_MASK)
        && table == Some(NFT_ROUTE_TABLE)
}

fn is_capture_route(payload: &[u8]) -> bool {
    // dst_len 0 (default), type local.
    if payload.get(1) != Some(&0) || payload.get(7) != Some(&libc::RTN_LOCAL) {
        return false;
    }
    let mut table = payload.get(4).map(|&t| u32::from(t));
    for (ty, value) in netlink::attrs(payload, HDR_LEN) {
        if ty == RTA_TABLE {
            table = netlink::attr_u32(value);
        }
    }
    table == Some(NFT_ROUTE_TABLE)
}
