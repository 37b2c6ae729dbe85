//! eBPF in-pod traffic capture, the alternative to istio-cni's nftables rules (docs/compatibility.md, in-pod capture):
//! the same connections reach ztunnel's in-pod listeners, without netfilter or NAT.
//!
//! # How
//! Everything lives in the pod's network namespace (pods need no cgroup of their own):
//! - **Inbound** (`mesh_capture_in`, clsact ingress on every pod interface): a TCP packet to the pod
//!   that no socket of the netns owns yet (destination port not 15008, source not the probe
//!   address 169.254.7.127, not marked 0x539) is `bpf_sk_assign`ed to the listener on
//!   [`INBOUND_CAPTURE_PORT`]. Established connections, request sockets and the app's own
//!   connections are found with `bpf_skc_lookup_tcp` and left alone.
//! - **Outbound** (`mesh_capture_out`, clsact egress on every pod interface): the SYN of a new
//!   connection from a socket without [`PROXY_MARK`], and every later packet of a connection
//!   that ztunnel accepted that way (found by looking the packet up as if it were received), is
//!   marked [`CAPTURE_MARK`] and redirected into `lo`'s ingress. The policy rule
//!   `iif lo fwmark 0x111/0xfff lookup 101` (pref [`EBPF_RULE_PREF`]) and the route
//!   `local 0.0.0.0/0 dev lo table 101` deliver it locally (`net.ipv4.conf.lo.accept_local=1`
//!   lets its pod source address in), and `mesh_capture_lo` (clsact ingress on `lo`) assigns new
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
//! talks rtnetlink itself (clsact qdiscs, `bpf` filters at priority [`TC_FILTER_PRIORITY`] handle
//! 1 named [`FILTER_NAMES`], rule, route) from a thread inside the pod's namespace.
//!
//! [`Sockmap`] is the separate, experimental option that pairs a pod's local TCP legs socket to
//! socket (`sock_ops` and `sk_msg` programs on a cgroup v2, `bpf/sockmap.bpf.c`); unlike
//! capture it does need a cgroup, and the module documents why it is off by default.
//!
//! [`CAPTURE_MARK`]: mesh_capture::CAPTURE_MARK
//! [`EBPF_RULE_PREF`]: mesh_capture::EBPF_RULE_PREF
//! [`INBOUND_CAPTURE_PORT`]: mesh_capture::INBOUND_CAPTURE_PORT
//! [`OUTBOUND_CAPTURE_PORT`]: mesh_capture::OUTBOUND_CAPTURE_PORT
//! [`PROXY_MARK`]: mesh_capture::PROXY_MARK
//! [`TC_FILTER_PRIORITY`]: mesh_capture::TC_FILTER_PRIORITY

mod capture;
mod programs;
mod sockmap;
mod sysctl;
mod tc;

use mesh_capture::netns::EnterError;

pub use capture::{Capture, CaptureOptions};
pub use programs::{object, Programs, PROGRAM_NAMES};
pub use sockmap::{
    cgroup2_root, sockmap_object, Sockmap, SockmapError, SockmapStats, DEFAULT_CGROUP2_MOUNT,
    SOCKMAP_PROGRAM_NAMES, SOCK_HASH_NAMES,
};

/// `bpf` filter names (`tc filter show`): pod ingress, pod egress, lo ingress. aya names a
/// filter after its program, so these are [`PROGRAM_NAMES`].
pub const FILTER_NAMES: [&str; 3] = PROGRAM_NAMES;

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
    #[cfg(feature = "bpf")]
    #[error("cannot attach BPF program {program} to {interface}: {source}; does the process have CAP_NET_ADMIN and CAP_BPF?")]
    Attach {
        program: &'static str,
        interface: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[cfg(feature = "bpf")]
    #[error("cannot {what} on {interface}: {source}; does the process have CAP_NET_ADMIN?")]
    Tc {
        what: &'static str,
        interface: String,
        #[source]
        source: aya::programs::tc::TcError,
    },
    #[error(transparent)]
    Enter(#[from] EnterError),
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
            #[cfg(feature = "bpf")]
            CaptureError::Attach { .. } => "attach",
            #[cfg(feature = "bpf")]
            CaptureError::Tc { .. } => "tc",
            CaptureError::Enter(error) => error.reason(),
            CaptureError::Netlink { .. } => "netlink",
            CaptureError::Sysctl { .. } => "sysctl",
        }
    }
}

impl From<mesh_capture::rtnl::RtnlError> for CaptureError {
    fn from(error: mesh_capture::rtnl::RtnlError) -> CaptureError {
        CaptureError::Netlink {
            what: error.operation(),
            source: error.into_io(),
        }
    }
}
