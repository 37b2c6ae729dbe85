//! The plugin -> agent protocol: one HTTP POST per CNI ADD on a unix socket, as istio-cni's
//! `pluginevent.sock`.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// Where the agent listens for plugin events.
pub const PLUGIN_EVENT_SOCKET: &str = "/var/run/istio-cni/pluginevent.sock";
/// The path of ADD events.
pub const CMD_ADD_PATH: &str = "/cmdadd";

/// What the plugin tells the agent about a pod being added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniAddEvent {
    /// Path of the pod's network namespace (`CNI_NETNS`).
    #[serde(rename = "Netns")]
    pub netns: String,
    #[serde(rename = "PodName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// Kubernetes pod UID (`K8S_POD_UID`), empty if the runtime did not pass it.
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
    /// The pod's IPs from `prevResult`, as `address/prefix`.
    #[serde(rename = "IPs", default)]
    pub ips: Vec<String>,
}

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The agent's side: handles one ADD; `Ok` only once the pod is captured and acked by
/// ztunnel (or needs no capture). The error text is returned to the plugin (HTTP 500).
pub trait CniAddHandler: Send + Sync + 'static {
    fn cni_add(&self, event: CniAddEvent) -> BoxFuture<'_, Result<(), String>>;
}
