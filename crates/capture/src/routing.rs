//! The policy routing that delivers captured packets locally, for both capture modes: a rule
//! `fwmark 0x111/0xfff lookup <table>` at a fixed preference and the route
//! `local default dev lo table <table>`, plus listing a namespace's links. Over [`Rtnl`].

use netlink_packet_core::NlasIterator;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkHeader, LinkMessage};
use netlink_packet_route::route::{
    RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleHeader, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;

use crate::contract::{
    CAPTURE_MARK, EBPF_ROUTE_TABLE, EBPF_RULE_PREF, MARK_MASK, NFT_ROUTE_TABLE, NFT_RULE_PREF,
};
use crate::framing;
use crate::rtnl::{Rtnl, RtnlError, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

/// The loopback interface's index in every network namespace.
pub const LOOPBACK_IFINDEX: u32 = 1;

/// The address families the routing is programmed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn af(self) -> AddressFamily {
        match self {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        }
    }
}

/// One capture mode's local delivery: which table, which rule preference, and whether the
/// rule only matches packets coming in on `lo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalDelivery {
    pub table: u32,
    pub priority: u32,
    /// `iif` of the rule (`Some("lo")` for eBPF capture, which redirects into `lo`).
    pub iif: Option<&'static str>,
    /// `proto` of the route (what `ip route show table N` prints).
    pub protocol: RouteProtocol,
}

/// nftables capture: replies of connections ztunnel accepted (connmark restored into the mark).
pub const NFT_DELIVERY: LocalDelivery = LocalDelivery {
    table: NFT_ROUTE_TABLE,
    priority: NFT_RULE_PREF,
    iif: None,
    protocol: RouteProtocol::Boot,
};

/// eBPF capture: outbound packets `capture_out` marked and redirected into `lo`.
pub const EBPF_DELIVERY: LocalDelivery = LocalDelivery {
    table: EBPF_ROUTE_TABLE,
    priority: EBPF_RULE_PREF,
    iif: Some("lo"),
    protocol: RouteProtocol::Static,
};

impl LocalDelivery {
    /// Adds the rule (unless an identical one exists) and adds or replaces the route.
    pub fn install(&self, nl: &mut Rtnl, family: Family) -> Result<(), RtnlError> {
        // NLM_F_EXCL makes the kernel compare with the existing rules: EEXIST = present.
        match nl.request(
            "add the capture fwmark rule",
            RouteNetlinkMessage::NewRule(self.rule(family)),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Err(error) if error.is_exists() => {}
            other => other?,
        }
        nl.request(
            "add the capture table's local route",
            RouteNetlinkMessage::NewRoute(self.route(family, self.protocol, RouteScope::Host)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
    }

    /// Deletes every copy of the rule and the route; what is absent is fine.
    pub fn remove(&self, nl: &mut Rtnl, family: Family) -> Result<(), RtnlError> {
        // Each successful delete removes one copy; stop when none is left. The bound only
        // guards against something re-adding the rule as fast as we delete it.
        for _ in 0..64 {
            match nl.request(
                "delete the capture fwmark rule",
                RouteNetlinkMessage::DelRule(self.rule(family)),
                0,
            ) {
                Ok(()) => continue,
                Err(error) if error.is_absent() || unsupported(&error) => break,
                Err(error) => return Err(error),
            }
        }
        // Scope "nowhere" and no protocol match the route whatever they are.
        let route = self.route(family, RouteProtocol::Unspec, RouteScope::NoWhere);
        match nl.request(
            "delete the capture table's local route",
            RouteNetlinkMessage::DelRoute(route),
            0,
        ) {
            Err(error) if error.is_absent() || unsupported(&error) => Ok(()),
            other => other,
        }
    }

    /// Whether the rule is present for `family`.
    pub fn rule_present(&self, nl: &mut Rtnl, family: Family) -> Result<bool, RtnlError> {
        let mut request = RuleMessage::default();
        request.header.family = family.af();
        let rules = nl.dump("list ip rules", RouteNetlinkMessage::GetRule(request))?;
        Ok(rules.entries.iter().any(|message| match message {
            RouteNetlinkMessage::NewRule(rule) => self.is_our_rule(rule),
            _ => false,
        }))
    }

    /// Whether the route is present for `family`.
    pub fn route_present(&self, nl: &mut Rtnl, family: Family) -> Result<bool, RtnlError> {
        let mut request = RouteMessage::default();
        request.header.address_family = family.af();
        let routes = nl.dump("list routes", RouteNetlinkMessage::GetRoute(request))?;
        Ok(routes.entries.iter().any(|message| match message {
            RouteNetlinkMessage::NewRoute(route) => self.is_our_route(route),
            _ => false,
        }))
    }

    /// Whether both are present for `family`.
    pub fn present(&self, nl: &mut Rtnl, family: Family) -> Result<bool, RtnlError> {
        Ok(self.rule_present(nl, family)? && self.route_present(nl, family)?)
    }

    fn rule(&self, family: Family) -> RuleMessage {
        let header = RuleHeader {
            family: family.af(),
            // The real table is in the attribute (RT_TABLE_UNSPEC here).
            table: 0,
            action: RuleAction::ToTable,
            ..RuleHeader::default()
        };
        let mut attributes = Vec::with_capacity(5);
        if let Some(iif) = self.iif {
            attributes.push(RuleAttribute::Iifname(iif.to_owned()));
        }
        attributes.extend([
            RuleAttribute::Priority(self.priority),
            RuleAttribute::FwMark(CAPTURE_MARK),
            RuleAttribute::FwMask(MARK_MASK),
            RuleAttribute::Table(self.table),
        ]);
        let mut rule = RuleMessage::default();
        rule.header = header;
        rule.attributes = attributes;
        rule
    }

    fn route(&self, family: Family, protocol: RouteProtocol, scope: RouteScope) -> RouteMessage {
        let header = RouteHeader {
            address_family: family.af(),
            table: RouteHeader::RT_TABLE_UNSPEC,
            protocol,
            scope,
            kind: RouteType::Local,
            ..RouteHeader::default()
        };
        let mut route = RouteMessage::default();
        route.header = header;
        route.attributes = vec![
            RouteAttribute::Table(self.table),
            RouteAttribute::Oif(LOOPBACK_IFINDEX),
        ];
        route
    }

    fn is_our_rule(&self, rule: &RuleMessage) -> bool {
        if rule.header.action != RuleAction::ToTable {
            return false;
        }
        let mut table = u32::from(rule.header.table);
        let (mut priority, mut mark, mut mask, mut iif) = (None, None, None, None);
        for attribute in &rule.attributes {
            match attribute {
                RuleAttribute::Priority(value) => priority = Some(*value),
                RuleAttribute::FwMark(value) => mark = Some(*value),
                RuleAttribute::FwMask(value) => mask = Some(*value),
                RuleAttribute::Table(value) => table = *value,
                RuleAttribute::Iifname(name) => iif = Some(name.as_str()),
                _ => {}
            }
        }
        priority == Some(self.priority)
            && mark == Some(CAPTURE_MARK)
            && mask == Some(MARK_MASK)
            && table == self.table
            && iif == self.iif
    }

    fn is_our_route(&self, route: &RouteMessage) -> bool {
        if route.header.destination_prefix_length != 0 || route.header.kind != RouteType::Local {
            return false;
        }
        let mut table = u32::from(route.header.table);
        let mut oif = None;
        for attribute in &route.attributes {
            match attribute {
                RouteAttribute::Table(value) => table = *value,
                RouteAttribute::Oif(value) => oif = Some(*value),
                _ => {}
            }
        }
        table == self.table && oif == Some(LOOPBACK_IFINDEX)
    }
}

/// The kernel has no such family (IPv6 disabled in the namespace).
fn unsupported(error: &RtnlError) -> bool {
    error.errno() == Some(Errno::EAFNOSUPPORT)
}

/// A network interface of the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub loopback: bool,
}

/// Every interface of the calling thread's namespace. Links whose attributes
/// `netlink-packet-route` cannot parse are read from their header and `IFLA_IFNAME` alone, so
/// no interface is missed.
pub fn links(nl: &mut Rtnl) -> Result<Vec<Link>, RtnlError> {
    let dump = nl.dump(
        "list interfaces",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )?;
    let mut links: Vec<Link> = dump
        .entries
        .into_iter()
        .filter_map(|message| match message {
            RouteNetlinkMessage::NewLink(link) => Some(Link {
                index: link.header.index,
                loopback: link.header.flags.contains(LinkFlags::Loopback),
                name: link
                    .attributes
                    .iter()
                    .find_map(|attribute| match attribute {
                        LinkAttribute::IfName(name) => Some(name.clone()),
                        _ => None,
                    })
                    .unwrap_or_default(),
            }),
            _ => None,
        })
        .collect();
    links.extend(
        dump.unparsed
            .iter()
            .filter(|entry| entry.message_type == RTM_NEWLINK)
            .filter_map(|entry| raw_link(&entry.payload)),
    );
    links.sort_by_key(|link| link.index);
    Ok(links)
}

/// `RTM_NEWLINK` (include/uapi/linux/rtnetlink.h).
const RTM_NEWLINK: u16 = 16;
/// `IFLA_IFNAME` (include/uapi/linux/if_link.h).
const IFLA_IFNAME: u16 = 3;
/// `sizeof(struct ifinfomsg)`.
const IFINFOMSG_LEN: usize = 16;

/// A link from its `ifinfomsg` and `IFLA_IFNAME` only.
fn raw_link(payload: &[u8]) -> Option<Link> {
    let header = LinkHeader::parse(payload).ok()?;
    let name = NlasIterator::new(payload.get(IFINFOMSG_LEN..)?)
        .filter_map(Result::ok)
        .find(|attribute| attribute.kind() == IFLA_IFNAME)
        .map(|attribute| framing::attr_string(attribute.value()))?;
    Some(Link {
        index: header.index,
        loopback: header.flags.contains(LinkFlags::Loopback),
        name,
    })
}
