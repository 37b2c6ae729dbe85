//! Sidecar capture: the nftables rules that send a sidecar pod's TCP through its proxy
//! (outbound to 15001, inbound to 15006), as Istio's `istio-iptables` writes them with native
//! nftables, programmed over netlink in the calling thread's network namespace. Users: the
//! `pilot-agent istio-iptables` init step and cni-node for injected pods.
//!
//! - [`config`]: the settings (`istio-iptables` flags, pod annotations), with clear errors;
//! - [`rules`]: the rules as data;
//! - [`validation`]: the `istio-validation` check that capture works;
//! - [`apply`], [`cleanup`], [`is_applied`]: the transactions.

/// The settings, shared with the injector (which validates pods' annotations with them).
pub use mesh_capture::sidecar as config;
mod passthrough;
pub mod rules;
pub mod validation;

pub use config::{CaptureConfig, Cidr, ConfigError, InterceptionMode, Selection};

/// Why the rules could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{0}; nothing of the transaction was applied")]
    Nftables(#[from] mesh_nft::BatchError),
    #[error("cannot add {addr} to lo (the IPv6 inbound passthrough source): {source}")]
    Passthrough {
        addr: std::net::IpAddr,
        #[source]
        source: mesh_capture::rtnl::RtnlError,
    },
}

impl CaptureError {
    pub fn reason(&self) -> &'static str {
        match self {
            CaptureError::Nftables(_) => "nftables",
            CaptureError::Passthrough { .. } => "passthrough_address",
        }
    }
}

/// Installs (or replaces) capture in the calling thread's netns, atomically. Returns the
/// number of rules written. With IPv6 rules it first puts the IPv6 passthrough source (`::6`)
/// on `lo`, as Istio does: IPv4's `127.0.0.6` is on `lo` already (`127.0.0.0/8`).
pub fn apply(cfg: &CaptureConfig) -> Result<usize, CaptureError> {
    if cfg.ipv6 {
        passthrough::add_v6().map_err(|source| CaptureError::Passthrough {
            addr: config::PASSTHROUGH_V6.into(),
            source,
        })?;
    }
    rules::apply_batch(cfg).commit()?;
    Ok(rules::rule_count(cfg))
}

/// Removes capture from the calling thread's netns; absent tables are not an error.
pub fn cleanup() -> Result<(), CaptureError> {
    Ok(rules::cleanup_batch().commit()?)
}

#[cfg(test)]
mod tests;
