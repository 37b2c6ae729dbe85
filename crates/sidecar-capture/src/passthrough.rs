//! The IPv6 inbound passthrough source: the proxy hands inbound connections to the app from
//! `::6`, which is no loopback address until it is put on `lo` (IPv4's `127.0.0.6` is, as all
//! of `127.0.0.0/8`). Over rtnetlink, in the calling thread's network namespace.

use std::net::IpAddr;

use mesh_capture::routing::LOOPBACK_IFINDEX;
use mesh_capture::rtnl::{Rtnl, RtnlError, NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::config::PASSTHROUGH_V6;

/// `ip -6 addr replace ::6/128 dev lo` (no error when it is there already).
pub fn add_v6() -> Result<(), RtnlError> {
    let mut message = AddressMessage::default();
    message.header.family = AddressFamily::Inet6;
    message.header.prefix_len = 128;
    message.header.index = LOOPBACK_IFINDEX;
    message.header.scope = AddressScope::Host;
    message
        .attributes
        .push(AddressAttribute::Local(IpAddr::V6(PASSTHROUGH_V6)));
    message
        .attributes
        .push(AddressAttribute::Address(IpAddr::V6(PASSTHROUGH_V6)));
    Rtnl::open()?.request(
        "add ::6 to lo",
        RouteNetlinkMessage::NewAddress(message),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}
