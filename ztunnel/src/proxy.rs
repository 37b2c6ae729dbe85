//! The proxy of one pod: its in-pod listeners (15001 outbound, 15006 inbound plaintext, 15008
//! HBONE, 15053 DNS) and the connections they carry. The in-pod manager (`inpod`) binds the
//! listeners inside the pod's netns and hands them, with the pod's [`SocketFactory`], to a
//! [`PodProxyStarter`]; what it gets back is a [`PodProxy`] it drains when the pod leaves.
//!
//! [`Proxy`] is the starter: per pod it accepts on
//! - 15001 ([`outbound`]): original destination, source workload = the pod, route per
//!   docs/compatibility.md (outbound routing), HBONE (pooled, dialed from the pod's netns) or plain TCP;
//! - 15008 ([`inbound`]): TLS with the certificate of the workload owning the local IP, SPIFFE
//!   client certificate required, RBAC per `CONNECT`, target dialed from the pod's netns;
//! - 15006 ([`plaintext`]): RBAC with no identity (STRICT mTLS denies), then passthrough;
//! - 15053: the DNS proxy ([`serve_dns`]).
//!
//! Each connection is a task of the pod's task, so draining stops the listeners, lets open
//! connections finish and aborts what is left at the deadline. Every proxied connection is
//! counted in [`crate::metrics`] and logged (target `access`) when it ends.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Ports;
use crate::socket::{SharedSocketFactory, SocketFactory};
use crate::state::SharedState;

mod headers;
mod inbound;
mod inputs;
mod orig_dst;
mod outbound;
mod plaintext;
pub mod route;

pub use headers::{baggage, forwarded_for};
pub use inputs::{h2_settings, Proxy, ProxyInputs, DEFAULT_WORKLOAD_WAIT};
pub use orig_dst::{OriginalDst, SoOriginalDst, StaticOriginalDst};

#[cfg(test)]
mod tests;

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

/// Why one proxied connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot read the original destination: {0}; is the pod's traffic redirection (nftables REDIRECT) in place?")]
    OriginalDst(#[source] io::Error),
    #[error("timed out waiting for workload {ip} (pod {pod}) from xds after {waited:?}; is istiod reachable and does it know the pod?")]
    WorkloadTimeout {
        ip: std::net::IpAddr,
        pod: String,
        waited: Duration,
    },
    #[error("source IP {ip} belongs to workload {workload}, not to pod {pod}; is the pod's IP stale in xDS?")]
    SourceMismatch {
        ip: std::net::IpAddr,
        pod: String,
        workload: String,
    },
    #[error("no workload owns {ip}; refusing the connection (the listener serves only this pod's workloads)")]
    UnknownDestination { ip: std::net::IpAddr },
    #[error("{0}")]
    Route(#[from] route::RouteError),
    #[error("no certificate: {0}")]
    Certificate(#[source] crate::certs::CertError),
    #[error("cannot build the TLS configuration: {0}")]
    Tls(#[source] mesh_identity::TlsError),
    #[error("{0}")]
    Hbone(#[source] crate::hbone::HboneError),
    #[error("cannot connect to {addr}: {source}; is the destination listening on that port?")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("{decision}")]
    Denied { decision: crate::rbac::Decision },
    #[error("{0}")]
    Copy(#[source] crate::hbone::copy::CopyError),
}

impl ProxyError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ProxyError::OriginalDst(_) => "original_dst",
            ProxyError::WorkloadTimeout { .. } => "workload_timeout",
            ProxyError::SourceMismatch { .. } => "source_mismatch",
            ProxyError::UnknownDestination { .. } => "unknown_destination",
            ProxyError::Route(e) => e.reason(),
            ProxyError::Certificate(e) => e.reason(),
            ProxyError::Tls(e) => e.reason(),
            ProxyError::Hbone(e) => e.reason(),
            ProxyError::Connect { .. } => "connect",
            ProxyError::Denied { decision } => decision.reason(),
            ProxyError::Copy(e) => e.reason(),
        }
    }
}

/// The pod's DNS proxy on its 15053 sockets ([`crate::dns::serve`]), until `drain` turns
/// true. The one place the pod proxy calls into `dns`.
pub(crate) async fn serve_dns(
    pod: PodInfo,
    state: SharedState,
    sockets: SharedSocketFactory,
    udp: StdUdpSocket,
    tcp: StdTcpListener,
    cluster_domain: String,
    drain: watch::Receiver<bool>,
) {
    crate::dns::serve(pod, state, sockets, udp, tcp, cluster_domain, drain).await;
}
