//! nf_tables rules as data ([`model`]): expressions, rules, chains, sets and the transaction
//! that carries them, built the way `nft` builds the same rules so `nft list ruleset` prints
//! them identically. [`batch`] sends a transaction through libnftnl, all or nothing, and
//! [`dump`] reads rules back.
//!
//! Users: cni-node's in-pod ambient capture and host probe rules, and sidecar capture (the
//! `istio-iptables` init step and cni-node for injected pods).

pub mod batch;
pub mod dump;
pub mod model;

pub use model::*;

#[cfg(test)]
mod tests;
