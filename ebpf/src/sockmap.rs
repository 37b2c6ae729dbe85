//! Socket-to-socket in-pod legs (`bpf/sockmap.bpf.c`): the option that lets an application's
//! bytes reach ztunnel's socket in the same pod (and ztunnel's bytes reach the application)
//! without a trip through the local TCP stack.
//!
//! # How
//! Two of the three TCP connections of a mesh connection are local to a pod: the application
//! to ztunnel's outbound listener in the client pod, ztunnel to the application in the server
//! pod. Each has both ends in the pod's network namespace, and with a capture that does no NAT
//! (eBPF capture on the outbound side; every capture mode on the inbound side, where ztunnel
//! dials the application from the client's address) their 4-tuples mirror each other.
//!
//! - `mesh_sockops` (a `sock_ops` program on a cgroup v2, usually its root) sees every IPv4 TCP
//!   connection being established. A socket whose application-side address belongs to an
//!   enrolled pod ([`Sockmap::add_pod`]) goes into a sock hash: ztunnel's sockets (the
//!   [`PROXY_MARK`]) into `mesh_proxy_socks`, the others into `mesh_app_socks`. The key is the
//!   connection as the application sees it plus the network namespace's cookie, so both ends
//!   of one connection share it and nothing outside that namespace can.
//! - `mesh_sk_msg` (an `sk_msg` program on both hashes) queues a send straight into the receive
//!   queue of the other end, when it is in the other hash. A socket whose first send finds no
//!   partner (the other end is not accelerated, or not there yet) keeps TCP for its whole life,
//!   so a stream never mixes both paths while its partner lives and its bytes stay in order.
//!   Once the partner closed, sends go to TCP, which reports the close as it would.
//! - Everything else is TCP as usual: handshakes, FIN (half-close), RST, the original
//!   destination, marks. ztunnel does not know: it sees the same sockets and peers.
//! - Nothing is added on the HBONE port ([`HBONE_PORT`]): those connections leave the pod.
//! - Connections through a NAT (nftables capture's outbound REDIRECT) never find a partner and
//!   keep TCP: their ends do not mirror, and pairing them any other way could mix up two
//!   connections that share a port.
//!
//! # Limits of the kernel's sockmap path (why the option is off by default)
//! - **No per-socket backpressure.** Redirected bytes are charged to the receiving socket with
//!   no limit of its own, only the machine-wide TCP memory: a sender faster than its reader
//!   queues until that limit, and its `write` then fails with `ENOMEM`.
//! - **Spurious `EAGAIN` on blocking reads.** A blocking read of a socket in a sock hash returns
//!   `EAGAIN` when woken without data (plain TCP waits again). Event-loop programs retry;
//!   a program that takes `EAGAIN` from a blocking socket for an error breaks.
//!
//! # Lifetime
//! The `sock_ops` link belongs to the [`Sockmap`] value: when it is dropped (or the agent
//! exits), new connections are no longer added. Connections already paired keep their path
//! until they close; their sockets hold the programs and maps.
//!
//! [`HBONE_PORT`]: mesh_capture::HBONE_PORT
//! [`PROXY_MARK`]: mesh_capture::PROXY_MARK

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The programs of the object, in load order.
pub const SOCKMAP_PROGRAM_NAMES: [&str; 2] = ["mesh_sockops", "mesh_sk_msg"];
/// The two sock hashes: application ends, ztunnel ends.
pub const SOCK_HASH_NAMES: [&str; 2] = ["mesh_app_socks", "mesh_proxy_socks"];
const PODS_MAP: &str = "mesh_pods";
const STATS_MAP: &str = "mesh_sockmap_stats";
/// Counters in `mesh_sockmap_stats` (`enum stat` of the program).
const STAT_COUNT: usize = 6;
/// Where the agent mounts a cgroup v2 hierarchy when the machine has none mounted.
pub const DEFAULT_CGROUP2_MOUNT: &str = "/run/mesh-cni/cgroup2";

#[cfg(feature = "bpf")]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap.bpf.o"));

/// The BPF object file (ELF), or `None` when built without the `bpf` feature.
pub fn sockmap_object() -> Option<&'static [u8]> {
    #[cfg(feature = "bpf")]
    return Some(OBJECT);
    #[cfg(not(feature = "bpf"))]
    None
}

/// Why the sockmap path could not be set up or changed. The agent then runs without it:
/// every connection keeps the TCP path.
#[derive(Debug, thiserror::Error)]
pub enum SockmapError {
    #[error("mesh-ebpf was built without its `bpf` feature, so it has no sockmap programs")]
    NotBuilt,
    #[error("cannot load the sockmap {what}: {source}; does the kernel have sockmap and sk_msg (CONFIG_BPF_STREAM_PARSER, CONFIG_NET_SOCK_MSG, >= 5.15) and the process CAP_BPF and CAP_NET_ADMIN?")]
    Load {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot attach {program} to the cgroup {path}: {source}; is it a cgroup v2 directory?"
    )]
    Attach {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the mount table /proc/self/mountinfo: {0}")]
    Mountinfo(#[source] std::io::Error),
    #[error("cannot mount a cgroup v2 hierarchy at {path}: {source}; does the process have CAP_SYS_ADMIN?")]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {what} in the sockmap's map {map}: {source}")]
    Map {
        what: &'static str,
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl SockmapError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SockmapError::NotBuilt => "not_built",
            SockmapError::Load { .. } => "load",
            SockmapError::Attach { .. } => "attach",
            SockmapError::Mountinfo(_) | SockmapError::Mount { .. } => "cgroup2",
            SockmapError::Map { .. } => "map",
        }
    }
}

/// Counters of the programs since they were loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockmapStats {
    /// Application sockets added to their hash.
    pub app_sockets: u64,
    /// ztunnel sockets added to their hash.
    pub proxy_sockets: u64,
    /// Sends queued straight into the partner socket, and their bytes.
    pub redirected_msgs: u64,
    pub redirected_bytes: u64,
    /// Sockets whose first send found no partner, so they kept TCP.
    pub tcp_streams: u64,
    /// Sockets that could not be added (a hash full, or no memory for their state).
    pub insert_failed: u64,
}

/// The loaded programs, their maps and the `sock_ops` attachment.
#[derive(Debug)]
pub struct Sockmap {
    cgroup: PathBuf,
    #[cfg(feature = "bpf")]
    maps: std::sync::Mutex<loaded::Maps>,
}

impl Sockmap {
    /// Loads the programs, attaches `mesh_sk_msg` to both hashes and `mesh_sockops` to the
    /// cgroup v2 directory `cgroup` (its sockets and those of every cgroup below it). Other
    /// programs on that cgroup stay (multi-attach), so each node agent of a test machine can
    /// have its own.
    #[cfg(feature = "bpf")]
    pub fn load(cgroup: &Path) -> Result<Sockmap, SockmapError> {
        let maps = loaded::Maps::load(cgroup)?;
        Ok(Sockmap {
            cgroup: cgroup.to_path_buf(),
            maps: std::sync::Mutex::new(maps),
        })
    }

    /// Without the `bpf` feature there is nothing to load.
    #[cfg(not(feature = "bpf"))]
    pub fn load(_cgroup: &Path) -> Result<Sockmap, SockmapError> {
        Err(SockmapError::NotBuilt)
    }

    /// The cgroup the `sock_ops` program is attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// Connections of the pod with address `ip` established from now on are accelerated.
    pub fn add_pod(&self, ip: Ipv4Addr) -> Result<(), SockmapError> {
        #[cfg(feature = "bpf")]
        return self.lock().add_pod(ip);
        #[cfg(not(feature = "bpf"))]
        {
            let _ = ip;
            Err(SockmapError::NotBuilt)
        }
    }

    /// New connections of `ip` keep TCP; an absent address is fine.
    pub fn remove_pod(&self, ip: Ipv4Addr) -> Result<(), SockmapError> {
        #[cfg(feature = "bpf")]
        return self.lock().remove_pod(ip);
        #[cfg(not(feature = "bpf"))]
        {
            let _ = ip;
            Err(SockmapError::NotBuilt)
        }
    }

    /// The pods whose connections are accelerated.
    pub fn pods(&self) -> Result<Vec<Ipv4Addr>, SockmapError> {
        #[cfg(feature = "bpf")]
        return self.lock().pods();
        #[cfg(not(feature = "bpf"))]
        Err(SockmapError::NotBuilt)
    }

    /// The programs' counters, summed over the CPUs.
    pub fn stats(&self) -> Result<SockmapStats, SockmapError> {
        #[cfg(feature = "bpf")]
        return self.lock().stats();
        #[cfg(not(feature = "bpf"))]
        Err(SockmapError::NotBuilt)
    }

    #[cfg(feature = "bpf")]
    fn lock(&self) -> std::sync::MutexGuard<'_, loaded::Maps> {
        // Map updates are single syscalls: a panic elsewhere leaves nothing half-done.
        self.maps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A mounted cgroup v2 hierarchy: the first in `/proc/self/mountinfo`, or else one mounted at
/// `fallback` (created if needed). Hosts on cgroup v1 (or hybrid without `unified`) have none.
pub fn cgroup2_root(fallback: &Path) -> Result<PathBuf, SockmapError> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(SockmapError::Mountinfo)?;
    if let Some(path) = cgroup2_mount_point(&mountinfo) {
        return Ok(path);
    }
    std::fs::create_dir_all(fallback).map_err(|source| SockmapError::Mount {
        path: fallback.to_path_buf(),
        source,
    })?;
    nix::mount::mount(
        Some("cgroup2"),
        fallback,
        Some("cgroup2"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|errno| SockmapError::Mount {
        path: fallback.to_path_buf(),
        source: errno.into(),
    })?;
    Ok(fallback.to_path_buf())
}

/// The mount point of the first `cgroup2` file system in a mountinfo table.
fn cgroup2_mount_point(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // `id parent major:minor root mount-point options [optional...] - fstype source ...`
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let point = before.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(point)))
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        if let (b'\\', Some(digits)) = (bytes[i], digits) {
            if let Ok(value) = u8::from_str_radix(digits, 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(feature = "bpf")]
mod loaded {
    use std::net::Ipv4Addr;
    use std::path::Path;

    use aya::maps::{HashMap, MapData, PerCpuArray, SockHash};
    use aya::programs::{CgroupAttachMode, SkMsg, SockOps};

    use super::{SockmapError, SockmapStats, PODS_MAP, SOCK_HASH_NAMES, STATS_MAP, STAT_COUNT};

    /// A sock hash key: netns cookie, app IP, peer IP, app port, peer port (`struct pair_key`).
    pub(super) type PairKey = [u8; 24];

    pub(super) struct Maps {
        /// Owns the programs and so the `sock_ops` link: dropping it detaches.
        _ebpf: aya::Ebpf,
        /// The hashes stay open: closing the last descriptor would detach `mesh_sk_msg`.
        _hashes: Vec<SockHash<MapData, PairKey>>,
        pods: HashMap<MapData, u32, u32>,
        stats: PerCpuArray<MapData, u64>,
    }

    fn load_error(
        what: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> SockmapError {
        SockmapError::Load {
            what,
            source: std::io::Error::other(error),
        }
    }

    fn map_error(
        what: &'static str,
        map: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> SockmapError {
        SockmapError::Map {
            what,
            map,
            source: std::io::Error::other(error),
        }
    }

    fn take<T>(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<T, SockmapError>
    where
        T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
    {
        let map = ebpf
            .take_map(name)
            .ok_or_else(|| load_error("object", std::io::Error::other(format!("no map {name}"))))?;
        T::try_from(map).map_err(|error| load_error("object", error))
    }

    impl std::fmt::Debug for Maps {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Maps").finish_non_exhaustive()
        }
    }

    impl Maps {
        pub(super) fn load(cgroup: &Path) -> Result<Maps, SockmapError> {
            let mut ebpf = aya::EbpfLoader::new()
                .load(super::OBJECT)
                .map_err(|error| load_error("object", error))?;
            let hashes = SOCK_HASH_NAMES
                .iter()
                .map(|name| take::<SockHash<MapData, PairKey>>(&mut ebpf, name))
                .collect::<Result<Vec<_>, _>>()?;
            let pods = take::<HashMap<MapData, u32, u32>>(&mut ebpf, PODS_MAP)?;
            let stats = take::<PerCpuArray<MapData, u64>>(&mut ebpf, STATS_MAP)?;

            let sk_msg: &mut SkMsg = ebpf
                .program_mut("mesh_sk_msg")
                .ok_or_else(|| load_error("mesh_sk_msg", std::io::Error::other("missing")))?
                .try_into()
                .map_err(|error| load_error("mesh_sk_msg", error))?;
            sk_msg
                .load()
                .map_err(|error| load_error("mesh_sk_msg", error))?;
            for hash in &hashes {
                sk_msg
                    .attach(hash.fd())
                    .map_err(|error| load_error("mesh_sk_msg attachment", error))?;
            }

            let sock_ops: &mut SockOps = ebpf
                .program_mut("mesh_sockops")
                .ok_or_else(|| load_error("mesh_sockops", std::io::Error::other("missing")))?
                .try_into()
                .map_err(|error| load_error("mesh_sockops", error))?;
            sock_ops
                .load()
                .map_err(|error| load_error("mesh_sockops", error))?;
            let attach_error = |source: std::io::Error| SockmapError::Attach {
                program: "mesh_sockops",
                path: cgroup.to_path_buf(),
                source,
            };
            let dir = std::fs::File::open(cgroup).map_err(attach_error)?;
            sock_ops
                // A bpf link: always one of many on the cgroup (link_create takes no flags).
                .attach(&dir, CgroupAttachMode::Single)
                .map_err(|error| attach_error(std::io::Error::other(error)))?;
            Ok(Maps {
                _ebpf: ebpf,
                _hashes: hashes,
                pods,
                stats,
            })
        }

        pub(super) fn add_pod(&mut self, ip: Ipv4Addr) -> Result<(), SockmapError> {
            self.pods
                .insert(u32::from_ne_bytes(ip.octets()), 1, 0)
                .map_err(|error| map_error("add a pod address", PODS_MAP, error))
        }

        pub(super) fn remove_pod(&mut self, ip: Ipv4Addr) -> Result<(), SockmapError> {
            match self.pods.remove(&u32::from_ne_bytes(ip.octets())) {
                Ok(()) => Ok(()),
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(aya::maps::MapError::SyscallError(error))
                    if error.io_error.raw_os_error() == Some(nix::libc::ENOENT) =>
                {
                    Ok(())
                }
                Err(error) => Err(map_error("remove a pod address", PODS_MAP, error)),
            }
        }

        pub(super) fn pods(&self) -> Result<Vec<Ipv4Addr>, SockmapError> {
            let mut pods = Vec::new();
            for key in self.pods.keys() {
                let key =
                    key.map_err(|error| map_error("list the pod addresses", PODS_MAP, error))?;
                pods.push(Ipv4Addr::from(key.to_ne_bytes()));
            }
            pods.sort_unstable();
            Ok(pods)
        }

        pub(super) fn stats(&self) -> Result<SockmapStats, SockmapError> {
            let mut values = [0u64; STAT_COUNT];
            for (index, value) in (0u32..).zip(values.iter_mut()) {
                let per_cpu = self
                    .stats
                    .get(&index, 0)
                    .map_err(|error| map_error("read the counters", STATS_MAP, error))?;
                *value = per_cpu.iter().sum();
            }
            let [app_sockets, proxy_sockets, redirected_msgs, redirected_bytes, tcp_streams, insert_failed] =
                values;
            Ok(SockmapStats {
                app_sockets,
                proxy_sockets,
                redirected_msgs,
                redirected_bytes,
                tcp_streams,
                insert_failed,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_among_v1_hierarchies() {
        let table = "\
25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
40 30 0:40 / /run/my\\040cgroup rw,nosuid,nodev shared:20 - cgroup2 cgroup2 rw
";
        assert_eq!(
            cgroup2_mount_point(table),
            Some(PathBuf::from("/run/my cgroup"))
        );
        assert_eq!(
            cgroup2_mount_point(&table[..table.find("40 30").unwrap_or(0)]),
            None
        );
        assert_eq!(cgroup2_mount_point("garbage\n\n - \n"), None);
    }
}
