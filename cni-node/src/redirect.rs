//! In-pod traffic capture: the rules that send a pod's TCP into ztunnel's in-pod listeners
//! (docs/compatibility.md, enrollment and in-pod capture), behind one trait so nftables and eBPF are interchangeable.

use std::net::IpAddr;
use std::path::PathBuf;

#[cfg(feature = "ebpf")]
pub mod ebpf;
mod host_probe;
mod netns;
mod nftables;
mod routes;
#[cfg(test)]
mod tests;
mod with_probes;
#[cfg(feature = "ebpf")]
mod with_sockmap;

/// The decoders of the kernel's nf_tables answers (batch acks, rule dumps), for the fuzzers.
pub mod answers {
    pub use mesh_nft::batch::acks as nftables_acks;
    pub use mesh_nft::dump::count_rules as nftables_rule_dump;
}

pub use host_probe::{HostProbeConfig, HostProbeSnat, HOST_TABLE, PROBE_SET_V4, PROBE_SET_V6};
pub use nftables::NftablesRedirector;
pub use with_probes::WithProbeSnat;
#[cfg(feature = "ebpf")]
pub use with_sockmap::WithSockmap;

/// What redirection needs to know about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNetwork {
    /// The pod's network namespace (`/var/run/netns/x`, `/proc/<pid>/ns/net`).
    pub netns: PathBuf,
    /// The pod's IPs.
    pub ips: Vec<IpAddr>,
    /// Also capture DNS (UDP/TCP 53) into ztunnel's DNS proxy on 15053.
    pub dns_capture: bool,
    /// Leave inbound connections uncaptured (annotation
    /// `ambient.istio.io/bypass-inbound-capture: "true"`): only HBONE on 15008 reaches ztunnel.
    pub bypass_inbound: bool,
}

/// Programs and removes a pod's capture. Implementations are all-or-nothing (a failed
/// enroll leaves no rule behind) and idempotent (enrolling twice leaves one copy).
pub trait Redirector: Send + Sync + 'static {
    /// Installs the capture for `pod`.
    fn enroll(&self, pod: &PodNetwork) -> Result<(), RedirectError>;
    /// Removes it; absent rules (or a netns that is gone) are not an error.
    fn unenroll(&self, pod: &PodNetwork) -> Result<(), RedirectError>;
    /// Whether the complete capture is present.
    fn is_enrolled(&self, pod: &PodNetwork) -> Result<bool, RedirectError>;
    /// Short name for logs and status (`nftables`, `ebpf`).
    fn name(&self) -> &'static str;
    /// `pod` was captured before this agent started and its rules are kept as they are (no
    /// reconciliation at start): take up whatever the redirector keeps in memory for it.
    fn adopt(&self, _pod: &PodNetwork) {}
}

/// Why capture could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    #[error("cannot open the network namespace {path}: {source}; is the pod still running?")]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink request to {what} failed in {path}: {source}")]
    Netlink {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[cfg(feature = "ebpf")]
    #[error("eBPF capture in {path} failed: {source}")]
    Ebpf {
        path: PathBuf,
        #[source]
        source: Box<mesh_ebpf::CaptureError>,
    },
    #[error("{path} is not a network namespace (setns: {source}); pass /var/run/netns/<name> or /proc/<pid>/ns/net")]
    NotNetns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter the network namespace {path} (setns: {source}); the agent needs CAP_SYS_ADMIN")]
    Setns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot note the agent's own network namespace before entering {path}: {source}; is /proc mounted?")]
    HomeNetns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("nftables refused `{op}` in {path}: {source}; nothing of the transaction was applied; does the kernel have nf_tables with nat, redir and ct support?")]
    Nftables {
        op: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl RedirectError {
    pub fn reason(&self) -> &'static str {
        match self {
            RedirectError::Netns { .. } => "netns",
            RedirectError::Netlink { .. } => "netlink",
            #[cfg(feature = "ebpf")]
            RedirectError::Ebpf { source, .. } => source.reason(),
            RedirectError::NotNetns { .. } => "not_netns",
            RedirectError::Setns { .. } => "setns",
            RedirectError::HomeNetns { .. } => "home_netns",
            RedirectError::Nftables { .. } => "nftables",
        }
    }
}
