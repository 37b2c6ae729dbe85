//! One function per parser that takes bytes from outside the process. Each must return, never
//! panic, whatever the bytes; where a parser produces output (a DNS answer, a signed
//! certificate) the function also checks that the output is well-formed.
//!
//! `fuzz/` (cargo-fuzz, libFuzzer) drives them with generated inputs (`scripts/fuzz.sh`);
//! `tests/regressions.rs` replays the seeds and every input that once crashed one of them.

use std::path::Path;
use std::sync::OnceLock;

use hickory_proto::op::{Message, MessageType};

/// A fuzz entry point: takes any bytes, panics only on a bug.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/<name>.rs` and the corpus directories call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("cni_stdin", cni_stdin),
    ("cni_event", cni_event),
    ("zds_datagram", zds_datagram),
    ("dns_message", dns_message),
    ("xds_address", xds_address),
    ("xds_authorization", xds_authorization),
    ("yaml_manifest", yaml_manifest),
    ("ca_csr", ca_csr),
    ("netlink_reply", netlink_reply),
    ("hbone_request", hbone_request),
];

/// The CNI plugin's stdin (network configuration with `prevResult`).
pub fn cni_stdin(data: &[u8]) {
    let _ = cni_node::plugin::requested_version(data);
    if let Ok(conf) = cni_node::plugin::parse_config(data) {
        let _ = conf.prev_result_ips();
        let _ = conf.agent_socket();
    }
}

/// A datagram from the kernel on a netlink socket: rtnetlink answers (links, rules, routes,
/// tc filters, acks) and nf_tables answers (batch acks, rule dumps).
pub fn netlink_reply(data: &[u8]) {
    let _ = mesh_capture::rtnl::decode(data);
    let _ = cni_node::redirect::answers::nftables_acks(data);
    let _ = cni_node::redirect::answers::nftables_rule_dump(data, &mut Default::default());
}

/// What an HBONE peer sends after the TLS handshake: HTTP/2 frames (after the client preface)
/// carrying `CONNECT` heads, through ztunnel's HBONE server down to its `Connector`, which
/// parses the `forwarded` header as the inbound proxy does and refuses. The server must finish
/// once the peer closes; a hang is a finding.
pub fn hbone_request(data: &[u8]) {
    hbone_exchange(data, None);
}

/// Whether the bytes a server answered with so far are the answer a caller waits for.
pub type AnswerCheck<'a> = dyn Fn(&[u8]) -> bool + 'a;

/// [`hbone_request`], returning the bytes the server answered with. The peer closes once
/// `answered` holds for what came back so far (a test waits for its answer, up to 5 s), or
/// without one after a few turns of the scheduler (the fuzzer does not wait).
pub fn hbone_exchange(data: &[u8], answered: Option<&AnswerCheck<'_>>) -> Vec<u8> {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static SERVER: OnceLock<(ztunnel::hbone::server::Server, mesh_identity::Identity)> =
        OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    });
    let (server, peer) = SERVER.get_or_init(|| {
        let pki = mesh_testutil::TestPki::new();
        let local =
            mesh_identity::Identity::new("cluster.local", "default", "server").expect("identity");
        let peer =
            mesh_identity::Identity::new("cluster.local", "default", "peer").expect("identity");
        let tls = pki.server_tls(&local);
        let settings = ztunnel::hbone::H2Settings::default();
        (
            ztunnel::hbone::server::Server::new(tls, settings, HeadCheck),
            peer,
        )
    });
    let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    input.extend_from_slice(data);
    let peer_addr = std::net::SocketAddr::from(([10, 0, 0, 1], 40000));
    let local_addr = std::net::SocketAddr::from(([10, 0, 0, 2], mesh_capture::HBONE_PORT));
    runtime.block_on(async {
        let (mut client, io) = tokio::io::duplex(1 << 16);
        let serve = server.serve_authenticated(io, peer.clone(), peer_addr, local_addr);
        let talk = async move {
            let _ = client.write_all(&input).await;
            // Let the request tasks answer before the connection closes (all in memory, on
            // this one thread: a few turns of the scheduler are usually enough; a caller that
            // needs the answer reads until it has it).
            for _ in 0..32 {
                tokio::task::yield_now().await;
            }
            let mut answer = Vec::new();
            let mut chunk = [0u8; 4096];
            let wait = tokio::time::Instant::now() + Duration::from_secs(5);
            while answered.is_some_and(|done| !done(&answer)) {
                match tokio::time::timeout_at(wait, client.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
            let _ = client.shutdown().await;
            let _ = client.read_to_end(&mut answer).await;
            answer
        };
        let finished =
            tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(serve, talk) })
                .await;
        match finished {
            Ok((_, answer)) => answer,
            Err(_) => panic!("the HBONE server did not finish after the peer closed"),
        }
    })
}

/// Parses the headers the inbound proxy reads, then refuses (no upstream to dial).
struct HeadCheck;

impl ztunnel::hbone::server::Connector for HeadCheck {
    fn connect(
        &self,
        request: ztunnel::hbone::server::InboundRequest,
    ) -> ztunnel::hbone::server::BoxFuture<
        'static,
        Result<ztunnel::hbone::server::Accepted, ztunnel::hbone::server::Refusal>,
    > {
        let forwarded = request
            .headers
            .get_all("forwarded")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .filter_map(ztunnel::proxy::forwarded_for)
            .count();
        Box::pin(async move {
            Err(ztunnel::hbone::server::Refusal::Unavailable {
                reason: format!("fuzzing ({forwarded} forwarded sources)"),
            })
        })
    }
}

/// The body the plugin posts to the agent's event socket.
pub fn cni_event(data: &[u8]) {
    let _ = cni_node::event::decode_event(data);
}

/// A ZDS datagram, as ztunnel receives it from the node agent and the agent from ztunnel.
pub fn zds_datagram(data: &[u8]) {
    let _ = ztunnel::inpod::protocol::parse(data, Vec::new(), nix::sys::socket::MsgFlags::empty());
    let _ = mesh_zds::decode_hello(data);
}

/// A DNS query to ztunnel's proxy: parsed, resolved against a small mesh, answered; every
/// answer must parse again as a response.
pub fn dns_message(data: &[u8]) {
    use ztunnel::dns::message::{self, Parsed, Transport};
    let answer = match message::parse(data) {
        Parsed::Drop(_) => return,
        Parsed::Reply(bytes) => bytes,
        Parsed::Query(request) => {
            let names = ztunnel::dns::lookup::Names::new("cluster.local", true);
            let client = ztunnel::dns::lookup::Client {
                namespace: "default",
                network: "",
            };
            let query = request.queries().first().cloned();
            let records =
                query.and_then(|q| names.resolve(dns_state(), client, q.name(), q.query_type()));
            match records {
                Some(records) => message::local_answer(&request, records, Transport::Udp),
                None => message::error_response(
                    &request,
                    hickory_proto::op::ResponseCode::ServFail,
                    Transport::Tcp,
                ),
            }
        }
    };
    let parsed = Message::from_vec(&answer).expect("ztunnel's DNS answer parses");
    assert_eq!(parsed.message_type(), MessageType::Response);
}

fn dns_state() -> &'static ztunnel::state::State {
    static STATE: OnceLock<ztunnel::state::State> = OnceLock::new();
    STATE.get_or_init(|| {
        let mut state = ztunnel::state::State::new();
        state
            .load_local_yaml(Path::new("fuzz.yaml"), DNS_MESH)
            .expect("the fuzz mesh loads");
        state
    })
}

const DNS_MESH: &str = r#"
workloads:
- uid: c//Pod/default/a
  name: a
  namespace: default
  workloadIps: ["10.0.0.1", "fd00::1"]
  protocol: HBONE
  hostname: a.default.svc.cluster.local
  services: {"default/echo.default.svc.cluster.local": {80: 8080}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10", "/fd00::10"]
  ports: {80: 8080}
- name: ext
  namespace: default
  hostname: "*.example.com"
  vips: ["/240.240.0.1"]
  ports: {443: 443}
"#;

/// An `istio.workload.Address` resource from istiod (WDS).
pub fn xds_address(data: &[u8]) {
    let mut state = ztunnel::state::State::new();
    if state.apply_address("fuzz", Some(data)).is_ok() {
        let _ = serde_json::to_vec(&state.dump());
    }
}

/// An `istio.security.Authorization` resource from istiod (WDS).
pub fn xds_authorization(data: &[u8]) {
    let mut state = ztunnel::state::State::new();
    if state.apply_authorization("fuzz", Some(data)).is_ok() {
        let _ = serde_json::to_vec(&state.dump());
    }
}

/// A file of the YAML (or JSON) directory source.
pub fn yaml_manifest(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = mesh_source::parse_manifest(Path::new("fuzz.yaml"), &text);
}

/// A CSR sent to the CA (`CreateCertificate`), signed for a fixed identity.
pub fn ca_csr(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let identity =
        mesh_identity::Identity::new("cluster.local", "default", "fuzz").expect("identity");
    if let Ok(chain) = ca().sign_csr(&text, &identity, None) {
        assert!(chain.len() >= 2, "leaf and root");
    }
}

fn ca() -> &'static mesh_identity::CertificateAuthority {
    static CA: OnceLock<(tempfile::TempDir, mesh_identity::CertificateAuthority)> = OnceLock::new();
    &CA.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = mesh_identity::CertificateAuthority::self_signed(dir.path(), Default::default())
            .expect("CA");
        (dir, ca)
    })
    .1
}
