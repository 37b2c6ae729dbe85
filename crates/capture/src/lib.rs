//! The in-pod capture contract: the numbers that the capture rules (nftables or eBPF), ztunnel's
//! in-pod listeners and istiod's workload addresses must agree on, in one place
//! (docs/architecture.md, the data path), and [`netns::run_in`], the one way the node layer enters a
//! pod's network namespace, and [`sidecar`], the settings of sidecar capture.
//!
//! Nothing outside this crate spells these numbers: `tests/single_home.rs` greps the
//! workspace's code for the distinctive ones (the ports, marks, mask, rule preferences and
//! the probe address).

pub mod contract;
#[cfg(feature = "rtnl")]
pub mod framing;
pub mod netns;
#[cfg(feature = "rtnl")]
pub mod routing;
#[cfg(feature = "rtnl")]
pub mod rtnl;
pub mod sidecar;

pub use contract::*;
