//! In-pod (shared) mode: the node agent (istio-cni) hands ztunnel each ambient pod's network
//! namespace over ZDS, and ztunnel runs that pod's proxy with listeners bound *inside* the pod's
//! netns (15001/15006/15008/15053, marked 1337, `SO_REUSEPORT`).
//!
//! - [`netns`]: netns fds, and sockets made there by the calling thread ([`InPodSockets`]).
//! - [`protocol`]: the ZDS client side over a `SOCK_SEQPACKET` unix socket.
//! - [`InPodManager`]: connection, snapshot reconciliation, live add/delete, draining.
//! - [`InPodStatus`]: readiness and `workloadState` for `/config_dump`.

mod manager;
pub mod netns;
mod pods;
pub mod protocol;
mod status;

pub use manager::{InPodManager, INITIAL_BACKOFF, MAX_BACKOFF, RETRY_PENDING};
pub use netns::{InPodSockets, Netns, NetnsError, NetnsId};
pub use pods::PodError;
pub use protocol::{InvalidMessage, WorkloadMessage, ZdsConnection, ZdsError};
pub use status::{InPodStatus, PodState, ProxyState, WorkloadInfoDump, WorkloadStateDump};

#[cfg(test)]
mod tests;
