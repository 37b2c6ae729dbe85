//! cni-node: enrolls pods into the ambient mesh.
//!
//! - `istio-cni` (the CNI plugin, `plugin`): chained after the pod network plugins; on ADD it
//!   tells the node agent about the pod over `/var/run/istio-cni/pluginevent.sock` (`event`)
//!   and succeeds only once the pod is captured and ztunnel has acked it.
//! - `cni-node` (the agent): decides which pods are enrolled, programs their in-pod
//!   redirection (`redirect`), hands their netns to ztunnel over ZDS, and reconciles after
//!   restarts.
//! - `install` (install-cni): copies the plugin onto the node and chains it into the node's
//!   primary CNI configuration, and takes it out again.

pub mod agent;
pub mod config;
pub mod event;
pub mod install;
pub mod plugin;
pub mod redirect;
pub mod selection;
pub mod sidecar;
pub mod state;
pub mod zds_server;
