//! [`HostProbeSnat`]: in the node's netns, kubelet's probes to enrolled pods are SNATed to
//! 169.254.7.127 (`fd16:9254:7127:1337:ffff:ffff:ffff:ffff`) so the in-pod rules let them
//! through uncaptured. As istio-cni's nftables mode: table `inet istio-ambient-nat`, address
//! sets `istio-inpod-probes-v4`/`-v6` of enrolled pod IPs, and in a `postrouting` nat chain
//! `meta l4proto tcp meta skuid <kubelet uid> ip daddr @istio-inpod-probes-v4 counter snat ip
//! to 169.254.7.127` (nftables has no `--socket-exists`; the socket owner's uid stands in).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use mesh_capture::{PROBE_SNAT_IPV4, PROBE_SNAT_IPV6};

use super::netns::{run_in, Entered};
use nix::errno::Errno;

use super::RedirectError;
use mesh_nft::{self as nft, Batch, ChainKind, Expr, Hook, HookPoint, MetaKey, Op};

/// The host table (istio-cni uses the in-pod nat table's name in the host netns as well).
pub const HOST_TABLE: &str = mesh_capture::POD_TABLES[0];
/// The set of enrolled pods' IPv4 addresses.
pub const PROBE_SET_V4: &str = "istio-inpod-probes-v4";
/// The set of enrolled pods' IPv6 addresses.
pub const PROBE_SET_V6: &str = "istio-inpod-probes-v6";
const CHAIN: &str = "postrouting";
/// `srcnat`.
const SNAT_PRIORITY: i32 = 100;

/// How host probes are recognised and rewritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProbeConfig {
    /// The uid kubelet runs as (its sockets' owner); usually 0.
    pub kubelet_uid: u32,
    /// `HOST_PROBE_SNAT_IP`.
    pub snat_ipv4: Ipv4Addr,
    /// `HOST_PROBE_SNAT_IPV6`.
    pub snat_ipv6: Ipv6Addr,
    /// Also SNAT probes to IPv6 pod addresses (`ambient.ipv6`).
    pub ipv6: bool,
}

impl Default for HostProbeConfig {
    fn default() -> Self {
        HostProbeConfig {
            kubelet_uid: 0,
            snat_ipv4: PROBE_SNAT_IPV4,
            snat_ipv6: PROBE_SNAT_IPV6,
            ipv6: true,
        }
    }
}

/// The host side of probe SNAT (see the module docs).
#[derive(Clone, Debug)]
pub struct HostProbeSnat {
    config: HostProbeConfig,
    /// `None`: the calling thread's own netns (the agent runs in the node's).
    netns: Option<PathBuf>,
}

/// Where errors say the rules were written when no netns path was given.
const OWN_NETNS: &str = "/proc/self/ns/net";

impl HostProbeSnat {
    /// Host probe SNAT in the agent's own network namespace.
    pub fn new(config: HostProbeConfig) -> Self {
        HostProbeSnat {
            config,
            netns: None,
        }
    }

    /// Host probe SNAT in the network namespace at `netns` (a test node).
    pub fn in_netns(config: HostProbeConfig, netns: impl Into<PathBuf>) -> Self {
        HostProbeSnat {
            config,
            netns: Some(netns.into()),
        }
    }

    /// Creates the table, the sets and the SNAT rules; the sets keep their elements when it
    /// runs again (only the chain's rules are rewritten).
    pub fn install(&self) -> Result<(), RedirectError> {
        let mut batch = Batch::default();
        batch.add_table(HOST_TABLE);
        batch.add_addr_set(HOST_TABLE, PROBE_SET_V4, false, 1);
        if self.config.ipv6 {
            batch.add_addr_set(HOST_TABLE, PROBE_SET_V6, true, 2);
        }
        let hook = Hook {
            kind: ChainKind::Nat,
            hook: HookPoint::Postrouting,
            priority: SNAT_PRIORITY,
        };
        batch.add_chain(HOST_TABLE, CHAIN, Some(hook));
        batch.flush_chain(HOST_TABLE, CHAIN);
        batch.add_rule(
            HOST_TABLE,
            CHAIN,
            &self.snat_rule(self.config.snat_ipv4.into()),
        );
        if self.config.ipv6 {
            batch.add_rule(
                HOST_TABLE,
                CHAIN,
                &self.snat_rule(self.config.snat_ipv6.into()),
            );
        }
        self.commit(batch, None)
    }

    /// `meta l4proto tcp meta skuid <uid> ip daddr @<set> counter snat ip to <snat>`.
    fn snat_rule(&self, snat: IpAddr) -> Vec<Expr> {
        let (set, ipv6) = match snat {
            IpAddr::V4(_) => (PROBE_SET_V4, false),
            IpAddr::V6(_) => (PROBE_SET_V6, true),
        };
        let uid = self.config.kubelet_uid.to_ne_bytes();
        [
            nft::l4proto(libc::IPPROTO_TCP as u8),
            vec![Expr::MetaLoad(MetaKey::SkUid), nft::cmp(Op::Eq, &uid)],
            nft::daddr_in(set, ipv6),
            vec![
                Expr::Counter,
                Expr::Immediate(nft::addr_bytes(snat)),
                Expr::Snat { ipv6 },
            ],
        ]
        .concat()
    }

    /// Adds an enrolled pod's IP to its set (no error when already there). IPv6 addresses
    /// are ignored unless IPv6 is enabled.
    pub fn add_pod_ip(&self, ip: IpAddr) -> Result<(), RedirectError> {
        self.element(ip, false)
    }

    /// Removes a pod's IP from its set (no error when absent).
    pub fn remove_pod_ip(&self, ip: IpAddr) -> Result<(), RedirectError> {
        self.element(ip, true)
    }

    fn element(&self, ip: IpAddr, delete: bool) -> Result<(), RedirectError> {
        let ip = ip.to_canonical();
        let set = match ip {
            IpAddr::V4(_) => PROBE_SET_V4,
            IpAddr::V6(_) if self.config.ipv6 => PROBE_SET_V6,
            IpAddr::V6(_) => return Ok(()),
        };
        let mut batch = Batch::default();
        batch.set_element(HOST_TABLE, set, ip, delete);
        // Adding what is there or deleting what is not is fine.
        let tolerated = if delete { Errno::ENOENT } else { Errno::EEXIST };
        self.commit(batch, Some(tolerated))
    }

    /// Deletes the host table with its sets and rules; fine when absent.
    pub fn remove_all(&self) -> Result<(), RedirectError> {
        let mut batch = Batch::default();
        batch.add_table(HOST_TABLE);
        batch.delete_table(HOST_TABLE);
        self.commit(batch, None)
    }

    /// Commits `batch` in the configured netns; the kernel answering `tolerated` is success
    /// (only meaningful for a batch of one operation: a refused batch applies nothing).
    fn commit(&self, batch: Batch, tolerated: Option<Errno>) -> Result<(), RedirectError> {
        let path = self.netns.as_deref().unwrap_or(Path::new(OWN_NETNS));
        let apply = move || match batch.commit() {
            Err(e) if tolerated.is_some() && e.errno == tolerated => Ok(()),
            Err(e) => Err(RedirectError::Nftables {
                op: e.op,
                path: path.to_owned(),
                source: e.source,
            }),
            Ok(()) => Ok(()),
        };
        if self.netns.is_none() {
            return apply();
        }
        match run_in(path, apply)? {
            Entered::Ran(()) => Ok(()),
            Entered::Gone => Err(RedirectError::Netns {
                path: path.to_owned(),
                source: std::io::ErrorKind::NotFound.into(),
            }),
        }
    }
}
