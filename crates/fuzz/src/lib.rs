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
];

/// The CNI plugin's stdin (network configuration with `prevResult`).
pub fn cni_stdin(data: &[u8]) {
    let _ = cni_node::plugin::requested_version(data);
    if let Ok(conf) = cni_node::plugin::parse_config(data) {
        let _ = conf.prev_result_ips();
        let _ = conf.agent_socket();
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
