//! Sidecar capture: the nftables rules that send a sidecar pod's TCP through its proxy
//! (outbound to 15001, inbound to 15006), as Istio's `istio-iptables` writes them with native
//! nftables, programmed over netlink in the calling thread's network namespace. Users: the
//! `pilot-agent istio-iptables` init step and cni-node for injected pods.
//!
//! - [`config`]: the settings (`istio-iptables` flags, pod annotations), with clear errors;
//! - [`rules`]: the rules as data;
//! - [`validation`]: the `istio-validation` check that capture works;
//! - [`apply`], [`cleanup`], [`is_applied`]: the transactions.

pub mod config;
pub mod rules;
pub mod validation;

pub use config::{CaptureConfig, Cidr, ConfigError, InterceptionMode, Selection};

/// Why the rules could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("nftables refused `{op}`: {source}; nothing of the transaction was applied; does the kernel have nf_tables with nat and redir support, and the process CAP_NET_ADMIN?")]
    Nftables {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list the nftables rules: {0}")]
    Dump(#[source] std::io::Error),
}

impl CaptureError {
    pub fn reason(&self) -> &'static str {
        match self {
            CaptureError::Nftables { .. } => "nftables",
            CaptureError::Dump(_) => "nftables_dump",
        }
    }
}

fn refused(error: mesh_nft::BatchError) -> CaptureError {
    CaptureError::Nftables {
        op: error.op,
        source: error.source,
    }
}

/// Installs (or replaces) capture in the calling thread's netns, atomically. Returns the
/// number of rules written.
pub fn apply(cfg: &CaptureConfig) -> Result<usize, CaptureError> {
    rules::apply_batch(cfg).commit().map_err(refused)?;
    Ok(rules::rule_count(cfg))
}

/// Removes capture from the calling thread's netns; absent tables are not an error.
pub fn cleanup() -> Result<(), CaptureError> {
    rules::cleanup_batch().commit().map_err(refused)
}

/// Whether the calling thread's netns holds exactly the rules `cfg` writes.
pub fn is_applied(cfg: &CaptureConfig) -> Result<bool, CaptureError> {
    let counts = mesh_nft::dump::rule_counts().map_err(CaptureError::Dump)?;
    Ok(counts.get(rules::NAT) == Some(&rules::rule_count(cfg)))
}

#[cfg(test)]
mod tests;
