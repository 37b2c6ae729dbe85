//! eBPF in-pod traffic capture, the alternative to istio-cni's nftables rules (docs/compatibility.md, in-pod capture):
//! the same connections reach ztunnel's in-pod listeners, without netfilter or NAT.
//!
//! # How
//! Everything lives in the pod's network namespace (pods need no cgroup of their own):
//! - **Inbound** (`capture_in`, clsact ingress on every pod interface): a TCP packet to the pod
//!   that no socket of the netns owns yet (destination port not 15008, source not the probe
//!   address 169.254.7.127, not marked 0x539) is `bpf_sk_assign`ed to the listener on
//!   [`INBOUND_CAPTURE_PORT`]. Established connections, request sockets and the app's own
//!   connections are found with `bpf_skc_lookup_tcp` and left alone.
//! - **Outbound** (`capture_out`, clsact egress on every pod interface): the SYN of a new
//!   connection from a socket without [`PROXY_MARK`], and every later packet of a connection
//!   that ztunnel accepted that way (found by looking the packet up as if it were received), is
//!   marked [`CAPTURE_MARK`] and redirected into `lo`'s ingress. The policy rule
//!   `iif lo fwmark 0x111/0xfff lookup 101` (pref [`CAPTURE_RULE_PREF`]) and the route
//!   `local 0.0.0.0/0 dev lo table 101` deliver it locally (`net.ipv4.conf.lo.accept_local=1`
//!   lets its pod source address in), and `capture_lo` (clsact ingress on `lo`) assigns new
//!   connections to the listener on [`OUTBOUND_CAPTURE_PORT`].
//! - Only traffic that goes out of a pod interface is routed through ztunnel: local traffic
//!   (to the pod's own IPs, loopback) and replies of connections ztunnel did not accept keep
//!   their normal path, as with the nftables rules.
//! - No listener on the capture port: the packet is dropped (capture fails closed; the
//!   client's SYN retransmissions go through once ztunnel listens).
//!
//! # What the proxy must do
//! No NAT happens: the accepted socket's **local address is the original destination**, and
//! `SO_ORIGINAL_DST` fails (`ENOENT`, no conntrack entry). The outbound listener must have
//! `IP_TRANSPARENT` (its accepted sockets answer from a non-local address), like every socket
//! ztunnel marks [`PROXY_MARK`]. IPv4 only for now; pod interfaces must be Ethernet-like (veth).
//!
//! # Pieces
//! [`Capture`] loads the programs once ([`Capture::new`]) and enrolls pods by netns path; it
//! talks rtnetlink itself (clsact qdiscs, `bpf` filters at priority [`FILTER_PRIORITY`] handle
//! 1 named [`FILTER_NAMES`], rule, route) from a thread inside the pod's namespace.

mod capture;
mod netlink;
mod netns;
mod programs;
mod routing;
mod tc;

use std::net::Ipv4Addr;
use std::path::PathBuf;

pub use capture::{Capture, CaptureOptions};
pub use programs::{object, Programs, PROGRAM_NAMES};

/// ztunnel's outbound capture port inside the pod.
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;
/// ztunnel's plaintext inbound capture port inside the pod.
pub const INBOUND_CAPTURE_PORT: u16 = 15006;
/// The HBONE port: never captured.
pub const HBONE_PORT: u16 = 15008;
/// `SO_MARK` of ztunnel's own sockets (1337): never captured.
pub const PROXY_MARK: u32 = 0x539;
/// The part of the mark the programs and the rule look at.
pub const MARK_MASK: u32 = 0xfff;
/// Mark of captured outbound packets on their way from the pod interface to `lo`.
pub const CAPTURE_MARK: u32 = 0x111;
/// Source of kubelet probes after the host's SNAT: never captured.
pub const PROBE_SNAT_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
/// Routing table of `local 0.0.0.0/0 dev lo` (not istio-cni's 100, so both can coexist).
pub const CAPTURE_ROUTE_TABLE: u32 = 101;
/// Preference of the `iif lo fwmark 0x111/0xfff lookup 101` rule.
pub const CAPTURE_RULE_PREF: u32 = 32763;
/// tc priority (`pref`) of the capture filters; their handle is 1.
pub const FILTER_PRIORITY: u16 = 1337;
/// `bpf` filter names (`tc filter show`): pod ingress, pod egress, lo ingress.
pub const FILTER_NAMES: [&str; 3] = ["mesh_capture_in", "mesh_capture_out", "mesh_capture_lo"];

/// Why capture could not be loaded or changed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("mesh-ebpf was built without its `bpf` feature, so it has no BPF programs; rebuild with it (needs clang) or use the nftables redirector")]
    NotBuilt,
    #[error("cannot load BPF program {program}: {source}; is this kernel >= 5.7 and the process allowed to load BPF (CAP_BPF, CAP_NET_ADMIN)?")]
    Load {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the BPF object has no program {0}; was ebpf/bpf/capture.bpf.c changed?")]
    MissingProgram(&'static str),
    #[error("cannot enter the network namespace {path}: {source}; is the pod still running (and are we root)?")]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a network namespace (setns: {source}); pass /var/run/netns/<name> or /proc/<pid>/ns/net")]
    NotNetns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start a thread to enter a network namespace: {0}")]
    Thread(#[source] std::io::Error),
    #[error("netlink request to {what} failed: {source}; does the process have CAP_NET_ADMIN?")]
    Netlink {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set sysctl {path}: {source}")]
    Sysctl {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl CaptureError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CaptureError::NotBuilt => "not_built",
            CaptureError::Load { .. } => "load",
            CaptureError::MissingProgram(_) => "missing_program",
            CaptureError::Netns { .. } => "netns",
            CaptureError::NotNetns { .. } => "not_netns",
            CaptureError::Thread(_) => "thread",
            CaptureError::Netlink { .. } => "netlink",
            CaptureError::Sysctl { .. } => "sysctl",
        }
    }

    /// Whether the namespace does not exist (any more).
    pub fn is_netns_gone(&self) -> bool {
        matches!(self, CaptureError::Netns { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// `what` failed over netlink.
pub(crate) fn netlink_error(what: &'static str) -> impl FnOnce(std::io::Error) -> CaptureError {
    move |source| CaptureError::Netlink { what, source }
}
