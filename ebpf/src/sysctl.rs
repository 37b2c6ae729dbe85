//! The `accept_local` sysctl that lets captured packets (whose source is the pod's own
//! address) in through `lo`. The policy routing itself (`ip rule add iif lo fwmark 0x111/0xfff
//! pref 32763 lookup 101`, `ip route replace local default dev lo table 101`) is
//! `mesh_capture::routing::EBPF_DELIVERY`, shared with the nftables capture.

use crate::CaptureError;

/// Lets captured packets, whose source is the pod's own address, in through `lo`.
pub(crate) const ACCEPT_LOCAL: &str = "/proc/sys/net/ipv4/conf/lo/accept_local";

/// Writes a sysctl of the calling thread's network namespace.
pub(crate) fn set_sysctl(path: &'static str, value: &str) -> Result<(), CaptureError> {
    std::fs::write(path, value).map_err(|source| CaptureError::Sysctl { path, source })
}

/// Reads a sysctl of the calling thread's network namespace, trimmed.
pub(crate) fn sysctl(path: &'static str) -> Result<String, CaptureError> {
    std::fs::read_to_string(path)
        .map(|value| value.trim().to_owned())
        .map_err(|source| CaptureError::Sysctl { path, source })
}
