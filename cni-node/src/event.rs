//! The plugin -> agent protocol: one HTTP POST per CNI ADD on a unix socket, as istio-cni's
//! `pluginevent.sock`.
//!
//! - [`post_add`]: the plugin's blocking client (hyper on a blocking socket, no runtime).
//! - [`bind`] and [`serve`]: the agent's server (hyper), answering 200 once its
//!   [`CniAddHandler`] succeeded and 500 with the handler's text otherwise.
//! - The JSON is upstream's (`nodeagent.CNIPluginAddEvent`, see `wire`), so a Go agent or
//!   plugin on the other end works too.

mod client;
mod server;
mod wire;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use client::post_add;
pub use server::{bind, serve, MAX_BODY};
pub use wire::{decode_event, parse_cidr, CidrError, WireError};

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
    /// The pod's IPs from `prevResult`, as `address/prefix`. On the wire each is a Go
    /// `IPConfig` (`{"Address": {"IP": "10.1.0.5", "Mask": "////AA=="}}`), as upstream sends.
    #[serde(rename = "IPs", default, with = "wire::ips")]
    pub ips: Vec<String>,
}

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the agent could not take a pod in: the agent's own error type, boxed so the event
/// server needs no knowledge of it. Its text is returned to the plugin (HTTP 500).
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The agent's side: handles one ADD; `Ok` only once the pod is captured and acked by
/// ztunnel (or needs no capture).
pub trait CniAddHandler: Send + Sync + 'static {
    fn cni_add(&self, event: CniAddEvent) -> BoxFuture<'_, Result<(), HandlerError>>;
}

/// Errors of the plugin event channel, on either end.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("cannot encode the CNI add event: {0}")]
    Encode(#[source] serde_json::Error),
    #[error(
        "cannot connect to the istio-cni agent at {}: {source}; is the istio-cni-node pod \
         running on this node?",
        socket.display()
    )]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the istio-cni agent at {} did not answer within {timeout:?}; is it overloaded or \
         stuck (see its logs)?",
        socket.display()
    )]
    Timeout { socket: PathBuf, timeout: Duration },
    #[error("cannot {op} the istio-cni agent at {}: {source}", socket.display())]
    Io {
        socket: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the istio-cni agent at {} sent a bad HTTP response: {detail}", socket.display())]
    BadResponse { socket: PathBuf, detail: String },
    #[error("the istio-cni agent at {} failed to add the pod (HTTP {status}): {body}", socket.display())]
    AgentFailed {
        socket: PathBuf,
        status: u16,
        body: String,
    },
    #[error(
        "the istio-cni agent at {} rejected the event (HTTP {status}): {body}; are the plugin \
         and the agent the same version?",
        socket.display()
    )]
    Rejected {
        socket: PathBuf,
        status: u16,
        body: String,
    },
    #[error("cannot create the socket directory {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove the leftover socket {}: {source}", path.display())]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} exists and is not a socket; remove it or choose another path", .0.display())]
    NotASocket(PathBuf),
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl EventError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            EventError::Encode(_) => "encode",
            EventError::Connect { .. } => "connect",
            EventError::Timeout { .. } => "timeout",
            EventError::Io { .. } => "io",
            EventError::BadResponse { .. } => "bad_response",
            EventError::AgentFailed { .. } => "agent_failed",
            EventError::Rejected { .. } => "rejected",
            EventError::CreateDir { .. } => "create_dir",
            EventError::RemoveStale { .. } => "remove_stale",
            EventError::NotASocket(_) => "not_a_socket",
            EventError::Bind { .. } => "bind",
        }
    }

    /// Whether trying again later may help (agent absent, slow, or failing for now), as
    /// opposed to a plugin/agent mismatch or a local problem.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EventError::Connect { .. }
                | EventError::Timeout { .. }
                | EventError::Io { .. }
                | EventError::BadResponse { .. }
                | EventError::AgentFailed { .. }
        )
    }
}

#[cfg(test)]
mod tests;
