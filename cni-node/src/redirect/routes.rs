//! The policy routing that goes with the nftables capture rules, in the calling thread's
//! netns: `ip rule add fwmark 0x111/0xfff pref 32764 lookup 100` and
//! `ip route replace local default dev lo table 100` (IPv4 and, for dual-stack pods, IPv6), so
//! that replies of connections ztunnel accepted (connmark restored into the packet mark) are
//! delivered locally. The messages are `mesh_capture::routing`'s, shared with eBPF capture.

use mesh_capture::routing::{Family, NFT_DELIVERY};
use mesh_capture::rtnl::{Rtnl, RtnlError};

/// Adds the fwmark rule (unless an identical one exists) and replaces the route.
pub(super) fn install(families: &[Family]) -> Result<(), RtnlError> {
    let mut nl = Rtnl::open()?;
    families
        .iter()
        .try_for_each(|&family| NFT_DELIVERY.install(&mut nl, family))
}

/// Deletes every copy of the rule and the route; absent ones are fine.
pub(super) fn remove(families: &[Family]) -> Result<(), RtnlError> {
    let mut nl = Rtnl::open()?;
    families
        .iter()
        .try_for_each(|&family| NFT_DELIVERY.remove(&mut nl, family))
}

/// Whether the rule and the route are both present for every family of `families`.
pub(super) fn present(families: &[Family]) -> Result<bool, RtnlError> {
    let mut nl = Rtnl::open()?;
    for &family in families {
        if !NFT_DELIVERY.present(&mut nl, family)? {
            return Ok(false);
        }
    }
    Ok(true)
}
