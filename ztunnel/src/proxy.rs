//! The proxy of one pod: its in-pod listeners (15001 outbound, 15006 inbound plaintext, 15008
//! HBONE, 15053 DNS) and the connections they carry. The in-pod manager (`inpod`) binds the
//! listeners inside the pod's netns and hands them, with the pod's [`SocketFactory`], to a
//! [`PodProxyStarter`]; what it gets back is a [`PodProxy`] it drains when the pod leaves.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Ports;
use crate::socket::{SharedSocketFactory, SocketFactory};

/// A pod handed to ztunnel by the node agent (ZDS `AddWorkload`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    /// Kubernetes pod UID (the ZDS key).
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

impl std::fmt::Display for PodInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// The listeners of one pod, bound inside its network namespace.
#[derive(Debug)]
pub struct PodListeners {
    /// `0.0.0.0:15001`: connections the pod makes (redirected by its OUTPUT rules).
    pub outbound: StdTcpListener,
    /// `0.0.0.0:15006`: plaintext connections to the pod (redirected by its PREROUTING rules).
    pub inbound_plaintext: StdTcpListener,
    /// `0.0.0.0:15008`: HBONE to the pod.
    pub hbone: StdTcpListener,
    /// `127.0.0.1:15053` UDP: the pod's DNS queries (when DNS capture is on).
    pub dns_udp: StdUdpSocket,
    /// `127.0.0.1:15053` TCP.
    pub dns_tcp: StdTcpListener,
}

impl PodListeners {
    /// Binds the in-pod listeners with `factory` (which, for a pod, creates them inside its
    /// netns with the ztunnel mark and `SO_REUSEPORT`). Nothing is left bound on error.
    pub fn bind(factory: &dyn SocketFactory, ports: &Ports) -> io::Result<PodListeners> {
        let any = |port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let local = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let with_port = |port: u16, r: io::Result<StdTcpListener>| {
            r.map_err(|e| io::Error::new(e.kind(), format!("binding port {port}: {e}")))
        };
        Ok(PodListeners {
            outbound: with_port(ports.outbound, factory.tcp_listener(any(ports.outbound)))?,
            inbound_plaintext: with_port(
                ports.inbound_plaintext,
                factory.tcp_listener(any(ports.inbound_plaintext)),
            )?,
            hbone: with_port(ports.inbound, factory.tcp_listener(any(ports.inbound)))?,
            dns_udp: factory.udp_bind(local(ports.dns)).map_err(|e| {
                io::Error::new(e.kind(), format!("binding UDP port {}: {e}", ports.dns))
            })?,
            dns_tcp: with_port(ports.dns, factory.tcp_listener(local(ports.dns)))?,
        })
    }
}

/// Why a pod's proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("in-pod listener of {pod}: {source}")]
    Listener {
        pod: String,
        #[source]
        source: io::Error,
    },
}

impl StartError {
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::Listener { .. } => "listener",
        }
    }
}

/// Starts the proxy of a pod on listeners bound for it.
pub trait PodProxyStarter: Send + Sync + 'static {
    /// Starts serving `listeners` for `pod`; connections it dials are made by `sockets`.
    /// Must be called from within a Tokio runtime.
    fn start(
        &self,
        pod: PodInfo,
        sockets: SharedSocketFactory,
        listeners: PodListeners,
    ) -> Result<PodProxy, StartError>;
}

/// A running pod proxy. Dropping it without [`PodProxy::drain`] aborts it.
#[derive(Debug)]
pub struct PodProxy {
    drain: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl PodProxy {
    /// Wraps the proxy's task. The task must stop accepting when `drain` turns true, and end
    /// once its open connections have finished (aborting the task aborts them).
    pub fn new(drain: watch::Sender<bool>, task: JoinHandle<()>) -> PodProxy {
        PodProxy {
            drain,
            task: Some(task),
        }
    }

    /// Closes the listeners, lets open connections finish for up to `deadline`, then closes
    /// whatever is left.
    pub async fn drain(mut self, deadline: Duration) {
        let _ = self.drain.send(true);
        let Some(mut task) = self.task.take() else {
            return;
        };
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::info!(
                ?deadline,
                "connections still open at the drain deadline; closing them"
            );
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for PodProxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
