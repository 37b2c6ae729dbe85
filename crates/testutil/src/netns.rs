//! Network-namespace topologies for e2e tests and benchmarks: nodes on an underlay bridge, pods
//! behind their node, and the in-pod capture rules of istio-cni (docs/compatibility.md, in-pod capture).
//!
//! This is test tooling: it shells out to `ip` (iproute2) and `nft` (nftables) and needs root.
//! The product code never does that.
//!
//! # Topology
//! ```text
//!  underlay netns  <prefix>-underlay: bridge <prefix>br, no address
//!     |  veth <prefix>u<k> (bridge port) <-> <prefix>n<k> (node uplink, node_ip/24)
//!  node netns      <prefix>-<node>: forwarding on, rp_filter off
//!     |  veth <prefix>p<i> (node end, 10.<k>.0.1/32, route pod_ip/32)
//!     |       <-> <prefix>e<i> (pod end, pod_ip/32, default via 10.<k>.0.1)
//!  pod netns       <prefix>-<pod>
//! ```
//! * Node `k` (1-based, in `add_node` order) owns the pod CIDR `10.<k>.0.0/24` and is the pods'
//!   gateway at `10.<k>.0.1`; give its pods `10.<k>.0.2` .. `10.<k>.0.254`
//!   ([`Node::pod_ip`] builds one). Every node routes every other node's pod CIDR via that
//!   node's IP; a pod IP outside its node's CIDR gets a /32 route on the other nodes.
//! * Node IPs live in [`UNDERLAY_CIDR`] (`172.30.0.0/24`).
//! * `lo` is up everywhere. The host netns is never modified: every interface is created
//!   directly inside the namespaces (`ip link add ... netns ...`).
//!
//! # Names and cleanup
//! Every namespace and interface starts with the [`TestNet::prefix`]: up to 3 letters of the
//! hint, the owner pid and a counter in base 36 (at most 10 characters, so interface names fit
//! in 15). The prefix is claimed by a state file `/run/mesh-testnet/<prefix>` recording the
//! owner pid, its start time and every namespace created. Dropping the [`TestNet`] (also while
//! a test panics) kills every process inside its namespaces and deletes them (their veths, nft
//! tables and rules go with them). [`TestNet::cleanup_stale`] does the same for state files
//! whose owner is gone (killed test runs); [`TestNet::new`] calls it first.

mod cmd;
mod handle;
mod redirect;
mod sockets;
mod stale;
mod topology;

use std::net::Ipv4Addr;
use std::path::PathBuf;

pub use handle::{ChildGuard, Netns, NETNS_DIR};
pub use redirect::{
    pod_redirect_rules, redirect_rules_script, remove_redirect_rules, RedirectOptions,
};
pub use sockets::{original_dst, EchoServer};
pub use stale::STATE_DIR;
pub use topology::{Node, Pod, TestNet, UNDERLAY_CIDR};

/// Whether a privileged test may run: true as root (effective uid 0). Otherwise it panics when
/// `CI` is set (a privileged test must never skip silently there) and else prints why `test`
/// is skipped and returns false:
/// `if !mesh_testutil::netns::have_root("my_test") { return; }`.
pub fn have_root(test: &str) -> bool {
    if effective_uid() == Some(0) {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} needs root (network namespaces, nftables) and CI is set: run the tests as root"
    );
    eprintln!("SKIPPED {test}: needs root (network namespaces, nftables); run it as root");
    false
}

/// The effective uid, from `/proc/self/status` (`Uid: real effective saved fs`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Errors building or using a test topology.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "cannot run `{program}`: {source}; is it installed (apt-get install iproute2 nftables)?"
    )]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}; netns tests need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)")]
    Command {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("cannot use the topology state {path}: {source}; is /run writable (run as root)?")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set sysctl {path}: {source}; netns tests need root")]
    Sysctl {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no free topology prefix for hint {hint:?}; run TestNet::cleanup_stale() or remove stale files in /run/mesh-testnet")]
    NoFreePrefix { hint: String },
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("address {addr} cannot be used: {reason}")]
    InvalidAddress {
        addr: Ipv4Addr,
        reason: &'static str,
    },
    #[error(
        "node {0:?} is not part of this topology; create it with add_node on the same TestNet"
    )]
    UnknownNode(String),
    #[error("too many {what} (at most {max}); split the test into several topologies")]
    TooMany { what: &'static str, max: usize },
    #[error("cannot open netns {path}: {source}; does it exist (ip netns list)?")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Enter(#[from] mesh_capture::netns::EnterError),
    #[error("cannot start a thread to enter the network namespace {path}: {source}; is the process out of threads or memory?")]
    Thread {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} {addr} in netns {netns} failed: {source}; is the address on an interface there and the port free?")]
    Socket {
        op: &'static str,
        addr: std::net::SocketAddr,
        netns: String,
        #[source]
        source: std::io::Error,
    },
}

impl NetnsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            NetnsError::Spawn { .. } => "spawn",
            NetnsError::Command { .. } => "command",
            NetnsError::State { .. } => "state",
            NetnsError::Sysctl { .. } => "sysctl",
            NetnsError::NoFreePrefix { .. } => "no_free_prefix",
            NetnsError::InvalidName { .. } => "invalid_name",
            NetnsError::InvalidAddress { .. } => "invalid_address",
            NetnsError::UnknownNode(_) => "unknown_node",
            NetnsError::TooMany { .. } => "too_many",
            NetnsError::Open { .. } => "open",
            NetnsError::Enter(error) => error.reason(),
            NetnsError::Thread { .. } => "thread",
            NetnsError::Socket { .. } => "socket",
        }
    }
}

#[cfg(test)]
mod tests;
