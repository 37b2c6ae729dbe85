//! The test mesh: one node's [`Proxy`] with a state filled directly, a CA signing with a
//! [`TestPki`], pod proxies bound on distinct loopback IPs, echo servers and clients.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use mesh_identity::{generate_csr, Identity};
use mesh_proto::security as sec;
use mesh_proto::security::string_match::MatchType;
use mesh_proto::workload::{self as pb, address};
use mesh_testutil::TestPki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::certs::{CaClient, CertError, CertManager, CertManagerOptions, WorkloadCert};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::{
    PodInfo, PodListeners, PodProxy, PodProxyStarter, Proxy, ProxyInputs, StaticOriginalDst,
};
use crate::socket::{LocalSockets, SocketFactory};
use crate::state::SharedState;

pub const WAIT: Duration = Duration::from_secs(10);
pub const HBONE_PORT: u16 = 15008;
pub const APP_PORT: u16 = 8080;

/// A CA client that signs with the test PKI in-process.
pub struct PkiCa(pub Arc<TestPki>);

impl CaClient for PkiCa {
    fn fetch<'a>(
        &'a self,
        identity: &'a Identity,
    ) -> BoxFuture<'a, Result<WorkloadCert, CertError>> {
        Box::pin(async move {
            let csr = generate_csr(identity)?;
            let chain = self
                .0
                .ca
                .sign_csr(&csr.csr_pem, identity, None)
                .expect("test CA signs");
            WorkloadCert::from_response(identity, chain, csr.key_pem)
        })
    }
}

pub fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa).expect("identity")
}

/// `127.<net>.0.<host>`: each test uses its own `net`, so tests can run in parallel.
pub fn ip(net: u8, host: u8) -> IpAddr {
    IpAddr::from([127, net, 0, host])
}

pub struct Mesh {
    pub pki: Arc<TestPki>,
    pub state: SharedState,
    pub registry: mesh_runtime::metrics::Metrics,
    pub orig: Arc<StaticOriginalDst>,
    pub proxy: Proxy,
}

impl Mesh {
    pub fn new() -> Mesh {
        let pki = Arc::new(TestPki::new());
        let config = Config::from_vars(Vec::new()).expect("default config");
        assert_eq!(config.ports.inbound, HBONE_PORT);
        let state = SharedState::default();
        let certs = Arc::new(CertManager::new(
            Arc::new(PkiCa(pki.clone())),
            CertManagerOptions::default(),
        ));
        let registry = mesh_runtime::metrics::Metrics::new();
        let metrics = Metrics::register(&registry);
        let orig = Arc::new(StaticOriginalDst::default());
        let mut inputs = ProxyInputs::new(Arc::new(config), state.clone(), certs, metrics);
        inputs.original_dst = orig.clone();
        inputs.workload_wait = Duration::from_millis(300);
        Mesh {
            pki,
            state,
            registry,
            orig,
            proxy: Proxy::new(inputs),
        }
    }

    pub fn add_workload(&self, w: pb::Workload) {
        let uid = w.uid.clone();
        let addr = pb::Address {
            r#type: Some(address::Type::Workload(w)),
        };
        self.state
            .update(|s| s.apply_address_message(&uid, &addr))
            .expect("workload applies");
    }

    pub fn add_service(&self, s: pb::Service) {
        let name = format!("{}/{}", s.namespace, s.hostname);
        let addr = pb::Address {
            r#type: Some(address::Type::Service(s)),
        };
        self.state
            .update(|st| st.apply_address_message(&name, &addr))
            .expect("service applies");
    }

    pub fn add_policy(&self, p: sec::Authorization) {
        let name = format!("{}/{}", p.namespace, p.name);
        self.state
            .update(|s| s.apply_authorization_message(&name, &p))
            .expect("policy applies");
    }

    /// Starts the proxy of pod `name` (service account `sa`) with its listeners on `ip`
    /// (HBONE on the real port 15008).
    pub fn start_pod(&self, ip: IpAddr, name: &str, sa: &str) -> PodNode {
        let sockets = LocalSockets::default();
        let any = SocketAddr::new(ip, 0);
        let listeners = PodListeners {
            outbound: sockets.tcp_listener(any).expect("outbound listener"),
            inbound_plaintext: sockets.tcp_listener(any).expect("plaintext listener"),
            hbone: sockets
                .tcp_listener(SocketAddr::new(ip, HBONE_PORT))
                .expect("hbone listener"),
            dns_udp: sockets.udp_bind(any).expect("dns udp"),
            dns_tcp: sockets.tcp_listener(any).expect("dns tcp"),
        };
        let outbound = listeners.outbound.local_addr().expect("addr");
        let plaintext = listeners.inbound_plaintext.local_addr().expect("addr");
        let pod = PodInfo {
            uid: format!("uid-{name}"),
            name: name.to_string(),
            namespace: "default".to_string(),
            service_account: sa.to_string(),
        };
        let proxy = self
            .proxy
            .start(pod, Arc::new(sockets), listeners)
            .expect("pod proxy starts");
        PodNode {
            proxy: Some(proxy),
            outbound,
            plaintext,
        }
    }

    /// Connects from `src_ip` to `listener`, telling the proxy the client was going to `dst`.
    pub async fn connect(
        &self,
        src_ip: IpAddr,
        listener: SocketAddr,
        dst: SocketAddr,
    ) -> TcpStream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(src_ip, 0))
            .expect("bind client");
        let local = socket.local_addr().expect("client addr");
        self.orig.insert(local, dst);
        socket
            .connect(listener)
            .await
            .expect("connect to the proxy")
    }

    /// The rendered metrics.
    pub fn render(&self) -> String {
        self.registry.render()
    }

    /// Waits until a rendered line contains every one of `parts`; returns that line.
    pub async fn metric_line(&self, parts: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = self.render();
            if let Some(line) = text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
                return line.to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no metric line with {parts:?} in:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub struct PodNode {
    pub proxy: Option<PodProxy>,
    pub outbound: SocketAddr,
    pub plaintext: SocketAddr,
}

impl PodNode {
    pub fn take(&mut self) -> PodProxy {
        self.proxy.take().expect("pod proxy still running")
    }
}

/// A workload in namespace `default` with one IP.
pub fn workload(name: &str, ip: IpAddr, sa: &str, protocol: pb::TunnelProtocol) -> pb::Workload {
    let addresses = match ip {
        IpAddr::V4(v4) => vec![v4.octets().to_vec()],
        IpAddr::V6(v6) => vec![v6.octets().to_vec()],
    };
    pb::Workload {
        uid: format!("Kubernetes//Pod/default/{name}"),
        name: name.to_string(),
        namespace: "default".to_string(),
        addresses,
        tunnel_protocol: protocol as i32,
        trust_domain: "cluster.local".to_string(),
        service_account: sa.to_string(),
        canonical_name: name.to_string(),
        canonical_revision: "v1".to_string(),
        workload_name: name.to_string(),
        cluster_id: "Kubernetes".to_string(),
        ..Default::default()
    }
}

pub fn exact(s: &str) -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(MatchType::Exact(s.into())),
    }
}

/// A namespace-scoped policy in `default` with one rule of one match.
pub fn policy(name: &str, action: sec::Action, m: sec::Match) -> sec::Authorization {
    sec::Authorization {
        name: name.to_string(),
        namespace: "default".to_string(),
        scope: sec::Scope::Namespace as i32,
        action: action as i32,
        groups: vec![sec::Group {
            rules: vec![sec::Rules { matches: vec![m] }],
        }],
        dry_run: false,
        extensions: vec![],
    }
}

/// istiod's conversion of a STRICT PeerAuthentication: deny any peer without a principal.
pub fn static_strict() -> sec::Authorization {
    let m = sec::Match {
        not_principals: vec![sec::StringMatch {
            match_type: Some(MatchType::Presence(())),
        }],
        ..Default::default()
    };
    policy("istio_converted_static_strict", sec::Action::Deny, m)
}

/// A TCP server on `addr` that reads until EOF, writes `prefix` + everything back, closes.
pub async fn echo_server(addr: SocketAddr, prefix: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind(addr).await.expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut data = Vec::new();
                if tcp.read_to_end(&mut data).await.is_err() {
                    return;
                }
                let _ = tcp.write_all(prefix).await;
                let _ = tcp.write_all(&data).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    addr
}

/// Writes `payload`, half-closes, reads until EOF. An error or reset reads as what came so far.
pub async fn round_trip(mut tcp: TcpStream, payload: &[u8]) -> Vec<u8> {
    let _ = tcp.write_all(payload).await;
    let _ = tcp.shutdown().await;
    let mut back = Vec::new();
    let read = tokio::time::timeout(WAIT, tcp.read_to_end(&mut back)).await;
    assert!(
        read.is_ok(),
        "connection neither answered nor closed in time"
    );
    back
}
/// A client and a server workload (HBONE) with their pods running, and an echo server that
/// prefixes `greeting` on the server's application port.
pub(super) struct TwoPods {
    pub mesh: Mesh,
    pub a: IpAddr,
    pub b: IpAddr,
    /// The client's pod, then the server's.
    pub pods: Vec<PodNode>,
    pub echo: SocketAddr,
}

pub(super) async fn two_pods(net: u8, greeting: &'static [u8]) -> TwoPods {
    let mesh = Mesh::new();
    let (a, b) = (ip(net, 1), ip(net, 2));
    mesh.add_workload(workload(
        "client",
        a,
        "client-sa",
        pb::TunnelProtocol::Hbone,
    ));
    mesh.add_workload(workload(
        "server",
        b,
        "server-sa",
        pb::TunnelProtocol::Hbone,
    ));
    let pods = vec![
        mesh.start_pod(a, "client", "client-sa"),
        mesh.start_pod(b, "server", "server-sa"),
    ];
    let echo = echo_server(SocketAddr::new(b, APP_PORT), greeting).await;
    TwoPods {
        mesh,
        a,
        b,
        pods,
        echo,
    }
}
