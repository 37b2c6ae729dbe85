//! [`Proxy`]: what every pod proxy shares (config, state, certificates, the HBONE pool,
//! metrics, the original-destination seam) and the accept loops of one pod.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::inbound::HboneInbound;
use super::orig_dst::{OriginalDst, SoOriginalDst};
use super::{outbound, plaintext, PodInfo, PodListeners, PodProxy, PodProxyStarter, StartError};
use crate::certs::CertManager;
use crate::config::Config;
use crate::hbone::{H2Settings, Pool};
use crate::metrics::Metrics;
use crate::socket::SharedSocketFactory;
use crate::state::SharedState;

/// How long a connection waits for its workload to arrive over xDS before failing.
pub const DEFAULT_WORKLOAD_WAIT: Duration = Duration::from_secs(5);

/// Inputs shared by all pod proxies. Fields are public so that tests and the binary can
/// replace the seams (`original_dst`) and tunables after [`ProxyInputs::new`].
#[derive(Debug)]
pub struct ProxyInputs {
    pub config: Arc<Config>,
    pub state: SharedState,
    pub certs: Arc<CertManager>,
    pub pool: Arc<Pool>,
    pub metrics: Metrics,
    pub original_dst: Arc<dyn OriginalDst>,
    pub h2: H2Settings,
    /// How long to wait for a connection's source (outbound) or destination (inbound) workload
    /// to appear in the state ("timed out waiting for workload ... from xds").
    pub workload_wait: Duration,
}

impl ProxyInputs {
    /// Inputs with the kernel's original destination and HTTP/2 settings from `config`.
    pub fn new(
        config: Arc<Config>,
        state: SharedState,
        certs: Arc<CertManager>,
        metrics: Metrics,
    ) -> ProxyInputs {
        let h2 = h2_settings(&config);
        ProxyInputs {
            pool: Arc::new(Pool::new(h2.clone())),
            config,
            state,
            certs,
            metrics,
            original_dst: Arc::new(SoOriginalDst),
            h2,
            workload_wait: DEFAULT_WORKLOAD_WAIT,
        }
    }
}

/// The HBONE tunables of `config` (`HTTP2_*`, `POOL_*`), Istio's defaults elsewhere.
pub fn h2_settings(config: &Config) -> H2Settings {
    let h = &config.http2;
    H2Settings {
        stream_window: h.stream_window_size,
        connection_window: h.connection_window_size,
        max_frame_size: h.frame_size,
        max_streams_per_connection: usize::from(h.pool_max_streams_per_conn),
        pool_unused_release_timeout: h.pool_unused_release_timeout,
        ..H2Settings::default()
    }
}

/// Starts pod proxies (the [`PodProxyStarter`] the in-pod manager uses). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Proxy {
    inputs: Arc<ProxyInputs>,
}

impl Proxy {
    pub fn new(inputs: ProxyInputs) -> Proxy {
        Proxy {
            inputs: Arc::new(inputs),
        }
    }

    pub fn inputs(&self) -> &ProxyInputs {
        &self.inputs
    }
}

/// One pod's proxy context, shared by its connection tasks.
#[derive(Debug)]
pub(crate) struct PodCtx {
    pub inputs: Arc<ProxyInputs>,
    pub pod: PodInfo,
    /// Makes the sockets dialed on the pod's behalf (inside its netns, marked).
    pub sockets: SharedSocketFactory,
}

impl PodCtx {
    /// Dials the pod's application at `dst` from the client's IP `src` (unless
    /// `ENABLE_ORIG_SRC=false`; when it is unset, a refusal by the kernel falls back to the
    /// pod's own address).
    pub(crate) async fn dial_app(
        &self,
        src: IpAddr,
        dst: SocketAddr,
    ) -> std::io::Result<tokio::net::TcpStream> {
        let setting = self.inputs.config.enable_original_source;
        let source = (setting != Some(false)).then_some(src);
        let (stream, used) =
            crate::socket::connect_from(&*self.sockets, source, setting == Some(true), dst).await?;
        if source.is_some() && used == crate::socket::SourceUsed::Local {
            tracing::debug!(pod = %self.pod, %src, %dst, "application dialed from the pod's address");
        }
        Ok(stream)
    }
}

struct TcpListeners {
    outbound: TcpListener,
    plaintext: TcpListener,
    hbone: TcpListener,
}

impl PodProxyStarter for Proxy {
    fn start(
        &self,
        pod: PodInfo,
        sockets: SharedSocketFactory,
        listeners: PodListeners,
    ) -> Result<PodProxy, StartError> {
        let tokio_listener = |l: std::net::TcpListener| {
            TcpListener::from_std(l).map_err(|source| StartError::Listener {
                pod: pod.to_string(),
                source,
            })
        };
        let tcp = TcpListeners {
            outbound: tokio_listener(listeners.outbound)?,
            plaintext: tokio_listener(listeners.inbound_plaintext)?,
            hbone: tokio_listener(listeners.hbone)?,
        };
        let (drain_tx, drain_rx) = watch::channel(false);
        let span = tracing::info_span!("pod", pod = %pod);
        let ctx = Arc::new(PodCtx {
            inputs: self.inputs.clone(),
            pod,
            sockets,
        });
        let dns = super::serve_dns(
            ctx.pod.clone(),
            ctx.inputs.state.clone(),
            ctx.sockets.clone(),
            listeners.dns_udp,
            listeners.dns_tcp,
            ctx.inputs.config.cluster_domain.clone(),
            drain_rx.clone(),
        );
        let task = tokio::spawn(run_pod(ctx, tcp, dns, drain_rx).instrument(span));
        Ok(PodProxy::new(drain_tx, task))
    }
}

/// Accepts on the pod's listeners until drained, each connection on its own task in one
/// `JoinSet` (aborting this task aborts them), then waits for open connections to finish.
async fn run_pod(
    ctx: Arc<PodCtx>,
    listeners: TcpListeners,
    dns: impl std::future::Future<Output = ()> + Send + 'static,
    mut drain: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    conns.spawn(dns.instrument(tracing::debug_span!("dns")));
    let hbone = Arc::new(HboneInbound::new(ctx.clone()));
    tracing::info!("pod proxy started");
    loop {
        let event = tokio::select! {
            _ = drain.wait_for(|d| *d) => break,
            r = listeners.outbound.accept() => (Listener::Outbound, r),
            r = listeners.plaintext.accept() => (Listener::Plaintext, r),
            r = listeners.hbone.accept() => (Listener::Hbone, r),
            Some(done) = conns.join_next() => {
                log_join(done);
                continue;
            }
        };
        let (listener, r) = event;
        let Some((tcp, peer)) = accepted(r, listener).await else {
            continue;
        };
        match listener {
            Listener::Outbound => {
                let span = tracing::debug_span!("outbound", %peer);
                conns.spawn(outbound::serve(ctx.clone(), tcp, peer).instrument(span));
            }
            Listener::Plaintext => {
                let span = tracing::debug_span!("inbound_plaintext", %peer);
                conns.spawn(plaintext::serve(ctx.clone(), tcp, peer).instrument(span));
            }
            Listener::Hbone => {
                let span = tracing::debug_span!("inbound", %peer);
                conns.spawn(hbone.clone().serve(tcp, peer).instrument(span));
            }
        }
    }
    drop(listeners);
    tracing::info!(open = conns.len(), "pod proxy draining: listeners closed");
    hbone.drain();
    while let Some(done) = conns.join_next().await {
        log_join(done);
    }
    // HBONE tunnels outlive their connection task by their final bookkeeping.
    hbone.drained().await;
    tracing::info!("pod proxy drained");
}

fn log_join(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            tracing::error!(error = %e, "connection task panicked");
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Listener {
    Outbound,
    Plaintext,
    Hbone,
}

/// The accepted connection, or `None` after logging (and pausing on resource exhaustion).
async fn accepted(
    r: std::io::Result<(TcpStream, SocketAddr)>,
    listener: Listener,
) -> Option<(TcpStream, SocketAddr)> {
    use std::io::ErrorKind::*;
    match r {
        Ok(ok) => Some(ok),
        Err(e)
            if matches!(
                e.kind(),
                ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
            ) =>
        {
            tracing::debug!(?listener, error = %e, "transient accept error");
            None
        }
        Err(e) => {
            tracing::warn!(?listener, error = %e, "accept failed; is the process out of file descriptors? Pausing 100ms");
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}
