//! The in-pod DNS proxy (port 15053, UDP and TCP; docs/compatibility.md, ports).
//!
//! The pod's DNS traffic is redirected here when DNS capture is on. Names ztunnel knows --
//! services by hostname (Kubernetes services and ServiceEntry hosts, wildcards included),
//! their short forms via the pod's search domains `<ns>.svc.<domain>`, `svc.<domain>`,
//! `<domain>`, and pods of headless services -- are answered from the current [`State`]
//! (authoritative, TTL 30 s, `A` from IPv4 and `AAAA` from IPv6 addresses; a known name
//! without an address of the asked family is NOERROR with no answers). Everything else is
//! forwarded to the upstream resolvers of `/etc/resolv.conf` from sockets made by the pod's
//! [`SocketFactory`](crate::socket::SocketFactory), and answered SERVFAIL when they fail.
//! See [`lookup`] for the name rules (upstream `src/dns/server.rs`).
//!
//! Each query runs in its own task, at most [`DnsConfig::max_in_flight`] at once, so a slow
//! upstream never holds up other queries. TCP carries any number of length-prefixed queries
//! per connection; answers may come back out of order (RFC 7766). Malformed queries get
//! FORMERR when their header can be read and are dropped otherwise.
//!
//! Metrics: `istio_dns_requests_total`, `istio_dns_upstream_requests_total`,
//! `istio_dns_upstream_failures_total` once [`DnsMetrics::register`] was called (a
//! process-global, see [`metrics`]).
//!
//! [`State`]: crate::state::State

use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::DNSClass;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use self::metrics::Counted;
use crate::proxy::PodInfo;
use crate::socket::SharedSocketFactory;
use crate::state::{SharedState, State};

mod forward;
pub mod lookup;
pub mod message;
pub mod metrics;

pub use forward::{Resolvers, RESOLV_CONF};
pub use lookup::TTL_SECONDS;
pub use message::Transport;
pub use metrics::{DnsLabels, DnsMetrics};

#[cfg(test)]
mod tests;

/// Why a query could not be answered, or the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// No resolver to forward to.
    #[error("no upstream DNS server is configured; does /etc/resolv.conf have a nameserver line?")]
    NoUpstream,
    /// The upstream did not answer in time.
    #[error("upstream DNS server {server} did not answer within {timeout:?}; is it reachable from the pod (NetworkPolicy, egress rules)?")]
    UpstreamTimeout {
        server: SocketAddr,
        timeout: Duration,
    },
    /// Socket error talking to the upstream.
    #[error("upstream DNS server {server}: {source}; is it reachable from the pod?")]
    UpstreamIo {
        server: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// A listener handed to [`serve`] cannot be used by Tokio.
    #[error("DNS proxy {kind} listener of {pod} is unusable: {source}; it must be bound (and the TCP one listening) before serve is called")]
    Listener {
        pod: String,
        kind: &'static str,
        #[source]
        source: io::Error,
    },
}

impl DnsError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            DnsError::NoUpstream => "no_upstream",
            DnsError::UpstreamTimeout { .. } => "upstream_timeout",
            DnsError::UpstreamIo { .. } => "upstream_io",
            DnsError::Listener { .. } => "listener",
        }
    }
}

/// Tunables of the DNS proxy.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// Where unknown names are forwarded.
    pub resolvers: Resolvers,
    /// Deadline for each upstream server's answer (5 s).
    pub upstream_timeout: Duration,
    /// Queries handled at once per pod; further ones wait (1024).
    pub max_in_flight: usize,
    /// A TCP connection with no new query for this long is closed (10 s).
    pub tcp_idle_timeout: Duration,
    /// Whether ztunnel answers AAAA queries with IPv6 addresses (true).
    pub ipv6_enabled: bool,
}

impl DnsConfig {
    /// Defaults forwarding to `resolvers`.
    pub fn with_resolvers(resolvers: Resolvers) -> DnsConfig {
        DnsConfig {
            resolvers,
            upstream_timeout: Duration::from_secs(5),
            max_in_flight: 1024,
            tcp_idle_timeout: Duration::from_secs(10),
            ipv6_enabled: true,
        }
    }

    /// Defaults forwarding to the resolvers of ztunnel's `/etc/resolv.conf` (read once per
    /// process).
    pub fn system() -> DnsConfig {
        DnsConfig::with_resolvers(Resolvers::system())
    }
}

/// Serves the pod's DNS on `udp` and `tcp` until `drain` turns true (or its sender is
/// dropped), with [`DnsConfig::system`]. Queries in flight are finished before it returns.
pub async fn serve(
    pod: PodInfo,
    state: SharedState,
    sockets: SharedSocketFactory,
    udp: StdUdpSocket,
    tcp: StdTcpListener,
    cluster_domain: String,
    drain: watch::Receiver<bool>,
) {
    let config = DnsConfig::system();
    serve_with(pod, state, sockets, udp, tcp, cluster_domain, drain, config).await;
}

/// [`serve`] with explicit configuration.
#[expect(
    clippy::too_many_arguments,
    reason = "serve's fixed signature plus the config"
)]
pub async fn serve_with(
    pod: PodInfo,
    state: SharedState,
    sockets: SharedSocketFactory,
    udp: StdUdpSocket,
    tcp: StdTcpListener,
    cluster_domain: String,
    drain: watch::Receiver<bool>,
    config: DnsConfig,
) {
    let (udp, tcp) = match tokio_sockets(&pod, udp, tcp) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::error!(pod = %pod, reason = e.reason(), error = %e, "DNS proxy not started");
            return;
        }
    };
    tracing::info!(
        pod = %pod,
        udp = ?udp.local_addr().ok(),
        tcp = ?tcp.local_addr().ok(),
        upstream = ?config.resolvers.servers,
        "DNS proxy serving"
    );
    let limit = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let idle = config.tcp_idle_timeout;
    let handler = Arc::new(Handler {
        names: lookup::Names::new(&cluster_domain, config.ipv6_enabled),
        pod,
        state,
        sockets,
        config,
        source: Mutex::new(PodSource::default()),
    });
    tokio::join!(
        serve_udp(handler.clone(), Arc::new(udp), limit.clone(), drain.clone()),
        serve_tcp(handler.clone(), tcp, limit, drain, idle),
    );
    tracing::info!(pod = %handler.pod, "DNS proxy stopped");
}

fn tokio_sockets(
    pod: &PodInfo,
    udp: StdUdpSocket,
    tcp: StdTcpListener,
) -> Result<(UdpSocket, TcpListener), DnsError> {
    let err = |kind, source| DnsError::Listener {
        pod: pod.to_string(),
        kind,
        source,
    };
    let udp = udp
        .set_nonblocking(true)
        .and_then(|()| UdpSocket::from_std(udp))
        .map_err(|e| err("UDP", e))?;
    let tcp = tcp
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(tcp))
        .map_err(|e| err("TCP", e))?;
    Ok((udp, tcp))
}

/// Resolves when draining starts (or nobody can start it any more).
async fn drained(mut drain: watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}

/// Waits for a query slot, unless draining starts first.
async fn permit(
    limit: &Arc<Semaphore>,
    stop: &mut (impl std::future::Future<Output = ()> + Unpin),
) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        biased;
        _ = stop => None,
        p = limit.clone().acquire_owned() => p.ok(),
    }
}

async fn serve_udp(
    handler: Arc<Handler>,
    socket: Arc<UdpSocket>,
    limit: Arc<Semaphore>,
    drain: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    let mut buf = vec![0u8; usize::from(u16::MAX)];
    let mut stop = Box::pin(drained(drain));
    loop {
        let (n, peer) = tokio::select! {
            biased;
            _ = &mut stop => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(e) => {
                    recv_error(&e, "UDP").await;
                    continue;
                }
            },
        };
        let Some(permit) = permit(&limit, &mut stop).await else {
            break;
        };
        let query = buf[..n].to_vec();
        let (handler, socket) = (handler.clone(), socket.clone());
        tasks.spawn(async move {
            let _permit = permit;
            if let Some(answer) = handler.handle(&query, Transport::Udp).await {
                if let Err(e) = socket.send_to(&answer, peer).await {
                    tracing::debug!(%peer, error = %e, "cannot send a DNS answer");
                }
            }
        });
    }
    // Let the queries in flight finish (each is bounded by the upstream timeout).
    while tasks.join_next().await.is_some() {}
}

/// Logs a receive/accept error; backs off briefly unless it is a per-peer error.
async fn recv_error(e: &io::Error, what: &str) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionReset | ConnectionAborted | Interrupted
    ) {
        tracing::debug!(error = %e, "DNS proxy {what} peer error");
    } else {
        tracing::warn!(error = %e, "DNS proxy {what} socket error; retrying");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn serve_tcp(
    handler: Arc<Handler>,
    listener: TcpListener,
    limit: Arc<Semaphore>,
    drain: watch::Receiver<bool>,
    idle: Duration,
) {
    let mut conns = JoinSet::new();
    let mut stop = Box::pin(drained(drain.clone()));
    loop {
        let stream = tokio::select! {
            biased;
            _ = &mut stop => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    recv_error(&e, "TCP").await;
                    continue;
                }
            },
        };
        let conn = TcpConn {
            handler: handler.clone(),
            limit: limit.clone(),
            drain: drain.clone(),
            idle,
        };
        conns.spawn(conn.serve(stream));
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// One client TCP connection.
struct TcpConn {
    handler: Arc<Handler>,
    limit: Arc<Semaphore>,
    drain: watch::Receiver<bool>,
    idle: Duration,
}

impl TcpConn {
    async fn serve(self, stream: TcpStream) {
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(32);
        let writer = async move {
            while let Some(answer) = rx.recv().await {
                let Ok(len) = u16::try_from(answer.len()) else {
                    continue;
                };
                let mut framed = Vec::with_capacity(answer.len() + 2);
                framed.extend_from_slice(&len.to_be_bytes());
                framed.extend_from_slice(&answer);
                if let Err(e) = wr.write_all(&framed).await {
                    tracing::debug!(error = %e, "cannot write a DNS answer over TCP");
                    break;
                }
            }
        };
        let reader = async move {
            let mut tasks = JoinSet::new();
            let mut stop = Box::pin(drained(self.drain.clone()));
            while let Some(query) = self.next_query(&mut rd, &mut stop, &mut tasks).await {
                let Some(permit) = permit(&self.limit, &mut stop).await else {
                    break;
                };
                let (handler, tx) = (self.handler.clone(), tx.clone());
                tasks.spawn(async move {
                    let _permit = permit;
                    if let Some(answer) = handler.handle(&query, Transport::Tcp).await {
                        let _ = tx.send(answer).await;
                    }
                });
            }
            drop(tx);
            while tasks.join_next().await.is_some() {}
        };
        tokio::join!(reader, writer);
    }

    /// The next length-prefixed query; `None` at EOF, error, idle timeout or drain.
    async fn next_query(
        &self,
        rd: &mut tokio::net::tcp::OwnedReadHalf,
        stop: &mut (impl std::future::Future<Output = ()> + Unpin),
        tasks: &mut JoinSet<()>,
    ) -> Option<Vec<u8>> {
        let read = async {
            let len = rd.read_u16().await?;
            let mut query = vec![0u8; usize::from(len)];
            rd.read_exact(&mut query).await?;
            Ok::<_, io::Error>(query)
        };
        let mut read = Box::pin(tokio::time::timeout(self.idle, read));
        loop {
            tokio::select! {
                biased;
                _ = &mut *stop => return None,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                r = &mut read => return r.ok()?.ok(),
            }
        }
    }
}

/// What the pod's own workload says about it: its network (VIPs on other networks are not
/// returned) and its canonical names (metric labels). Empty until the workload is known.
#[derive(Clone, Debug, Default)]
struct SourceInfo {
    network: String,
    canonical_service: String,
    canonical_revision: String,
}

/// [`SourceInfo`] once found, or when it was last looked for in vain.
#[derive(Debug, Default)]
struct PodSource {
    found: Option<SourceInfo>,
    last_miss: Option<Instant>,
}

/// How often to look for the pod's workload again while it is unknown.
const POD_LOOKUP_INTERVAL: Duration = Duration::from_secs(5);

/// Answers one pod's queries.
struct Handler {
    pod: PodInfo,
    state: SharedState,
    sockets: SharedSocketFactory,
    names: lookup::Names,
    config: DnsConfig,
    source: Mutex<PodSource>,
}

impl Handler {
    /// The answer to `bytes`, or `None` when nothing should be sent back.
    async fn handle(&self, bytes: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let request = match message::parse(bytes) {
            message::Parsed::Query(m) => m,
            message::Parsed::Reply(r) => return Some(r),
            message::Parsed::Drop(why) => {
                tracing::debug!(pod = %self.pod, why, len = bytes.len(), "dropping a DNS message");
                return None;
            }
        };
        let query = request.query()?;
        if query.query_class() == DNSClass::IN {
            if let Some(answers) = self.resolve_local(query.name(), query.query_type()) {
                tracing::debug!(name = %query.name(), qtype = %query.query_type(), answers = answers.len(), "answered DNS query");
                metrics::count(Counted::Local, || {
                    self.labels(query.query_type(), transport)
                });
                return Some(message::local_answer(&request, answers, transport));
            }
        }
        let forwarded = forward::forward(
            &*self.sockets,
            &self.config.resolvers,
            self.config.upstream_timeout,
            bytes,
            &request,
            transport,
        )
        .await;
        match forwarded {
            Ok(answer) => {
                tracing::debug!(name = %query.name(), qtype = %query.query_type(), "forwarded DNS query");
                metrics::count(Counted::Forwarded, || {
                    self.labels(query.query_type(), transport)
                });
                Some(answer)
            }
            Err(e) => {
                tracing::debug!(name = %query.name(), reason = e.reason(), error = %e, "DNS query forwarding failed");
                metrics::count(Counted::Failed, || {
                    self.labels(query.query_type(), transport)
                });
                Some(message::error_response(
                    &request,
                    ResponseCode::ServFail,
                    transport,
                ))
            }
        }
    }

    /// Local records for the name, holding the state's read lock only here.
    fn resolve_local(
        &self,
        name: &hickory_proto::rr::Name,
        qtype: hickory_proto::rr::RecordType,
    ) -> Option<Vec<hickory_proto::rr::Record>> {
        use hickory_proto::rr::RecordType;
        if !matches!(qtype, RecordType::A | RecordType::AAAA) {
            return None;
        }
        let state = self.state.read();
        let source = self.source(&state);
        let client = lookup::Client {
            namespace: &self.pod.namespace,
            network: &source.network,
        };
        self.names.resolve(&state, client, name, qtype)
    }

    /// Metric labels of a query from this pod.
    fn labels(&self, qtype: hickory_proto::rr::RecordType, transport: Transport) -> DnsLabels {
        let source = self.source(&self.state.read());
        DnsLabels::new(
            qtype,
            transport,
            &source.canonical_service,
            &source.canonical_revision,
        )
    }

    /// What the pod's workload says (empty until the workload is known; looked for again at
    /// most every [`POD_LOOKUP_INTERVAL`], since finding it means a scan of all workloads).
    fn source(&self, state: &State) -> SourceInfo {
        let mut cached = self.source.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = &cached.found {
            return found.clone();
        }
        if cached
            .last_miss
            .is_some_and(|t| t.elapsed() < POD_LOOKUP_INTERVAL)
        {
            return SourceInfo::default();
        }
        let found = state
            .workloads()
            .find(|w| w.namespace == self.pod.namespace && w.name == self.pod.name)
            .map(|w| SourceInfo {
                network: w.network.clone(),
                canonical_service: w.canonical_name.clone(),
                canonical_revision: w.canonical_revision.clone(),
            });
        match found {
            Some(info) => {
                cached.found = Some(info.clone());
                info
            }
            None => {
                cached.last_miss = Some(Instant::now());
                SourceInfo::default()
            }
        }
    }
}
