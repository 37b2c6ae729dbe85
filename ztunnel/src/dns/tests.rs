//! In-process tests: the proxy on loopback sockets, a fake upstream resolver, real UDP/TCP.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::*;
use crate::socket::{LocalSockets, SocketFactory};
use crate::state::State;

const YAML: &str = r#"
workloads:
- uid: c1//Pod/ns1/client
  name: client
  namespace: ns1
  canonicalName: client-app
  canonicalRevision: v1
  workloadIps: ["10.0.0.1"]
- uid: c1//Pod/ns1/web-0
  name: web-0
  namespace: ns1
  workloadIps: ["10.0.1.1", "fd00::1"]
  services: {"ns1/db.ns1.svc.cluster.local": {5432: 5432}}
- uid: c1//Pod/ns1/web-1
  name: web-1
  namespace: ns1
  workloadIps: ["10.0.1.2"]
  services: {"ns1/db.ns1.svc.cluster.local": {5432: 5432}}
services:
- name: echo
  namespace: ns1
  hostname: echo.ns1.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
- name: other
  namespace: ns2
  hostname: other.ns2.svc.cluster.local
  vips: ["/10.96.0.20"]
- name: db
  namespace: ns1
  hostname: db.ns1.svc.cluster.local
- name: api
  namespace: ns1
  hostname: api.example.com
  vips: ["/240.240.0.1"]
- name: api
  namespace: abc
  hostname: api.example.com
  vips: ["/240.240.0.2"]
- name: wild
  namespace: ns2
  hostname: "*.wild.example.com"
  vips: ["/240.240.0.3"]
- name: v6
  namespace: ns1
  hostname: v6.ns1.svc.cluster.local
  vips: ["/fd00:96::1"]
"#;

fn state() -> SharedState {
    let mut s = State::new();
    s.load_local_yaml(Path::new("dns-test.yaml"), YAML)
        .expect("test yaml");
    SharedState::new(s)
}

fn pod() -> PodInfo {
    PodInfo {
        uid: "uid-1".into(),
        name: "client".into(),
        namespace: "ns1".into(),
        service_account: "default".into(),
    }
}

/// A running proxy on loopback.
struct Proxy {
    udp: SocketAddr,
    tcp: SocketAddr,
    drain: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start(config: DnsConfig) -> Proxy {
    let factory = LocalSockets::default();
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let udp = factory.udp_bind(any).expect("udp bind");
    let tcp = factory.tcp_listener(any).expect("tcp listen");
    let (udp_addr, tcp_addr) = (
        udp.local_addr().expect("addr"),
        tcp.local_addr().expect("addr"),
    );
    let (drain, rx) = watch::channel(false);
    let task = tokio::spawn(serve_with(
        pod(),
        state(),
        Arc::new(factory),
        udp,
        tcp,
        "cluster.local".into(),
        rx,
        config,
    ));
    Proxy {
        udp: udp_addr,
        tcp: tcp_addr,
        drain,
        task,
    }
}

fn config(upstream: SocketAddr, timeout: Duration) -> DnsConfig {
    DnsConfig {
        upstream_timeout: timeout,
        ..DnsConfig::with_resolvers(Resolvers::new(vec![upstream]))
    }
}

fn query(id: u16, name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).expect("name"), qtype));
    m
}

async fn client() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.expect("client bind")
}

async fn ask_on(sock: &UdpSocket, server: SocketAddr, q: &Message) -> Message {
    sock.send_to(&q.to_vec().expect("encode"), server)
        .await
        .expect("send");
    recv(sock, Duration::from_secs(5))
        .await
        .expect("an answer within 5 s")
}

async fn ask(server: SocketAddr, q: &Message) -> Message {
    ask_on(&client().await, server, q).await
}

async fn recv(sock: &UdpSocket, wait: Duration) -> Option<Message> {
    let mut buf = vec![0u8; 65535];
    let (n, _) = tokio::time::timeout(wait, sock.recv_from(&mut buf))
        .await
        .ok()?
        .expect("recv");
    Some(Message::from_vec(&buf[..n]).expect("a valid DNS message"))
}

fn ips(m: &Message) -> BTreeSet<IpAddr> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn ip_set(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().expect("ip")).collect()
}

/// A fake upstream resolver: answers every A query with 192.0.2.53 and counts queries.
struct FakeUpstream {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
}

async fn fake_upstream() -> FakeUpstream {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind upstream");
    let addr = sock.local_addr().expect("addr");
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
            counter.fetch_add(1, Ordering::SeqCst);
            let Ok(req) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut resp = Message::new();
            resp.set_id(req.id())
                .set_message_type(MessageType::Response)
                .set_recursion_available(true)
                .add_queries(req.queries().iter().cloned());
            if let Some(q) = req.query() {
                resp.add_answer(Record::from_rdata(
                    q.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, 53))),
                ));
            }
            let _ = sock.send_to(&resp.to_vec().expect("encode"), peer).await;
        }
    });
    FakeUpstream { addr, seen }
}

/// An upstream that never answers (kept bound so nothing is refused).
async fn silent_upstream() -> (UdpSocket, SocketAddr) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let addr = sock.local_addr().expect("addr");
    (sock, addr)
}

#[tokio::test]
async fn a_records_for_service_fqdn_and_short_names() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(200)));
    for name in [
        "echo.ns1.svc.cluster.local.",
        "echo.",
        "echo.ns1.",
        "echo.ns1.svc.",
        "ECHO.ns1.svc.cluster.local.",
    ] {
        let r = ask(proxy.udp, &query(7, name, RecordType::A)).await;
        assert_eq!(r.id(), 7, "{name}");
        assert_eq!(r.response_code(), ResponseCode::NoError, "{name}");
        assert!(r.authoritative(), "{name}");
        assert!(r.recursion_available(), "{name}");
        assert_eq!(ips(&r), ip_set(&["10.96.0.10"]), "{name}");
        let rec = &r.answers()[0];
        assert_eq!(rec.name(), &Name::from_ascii(name).expect("name"), "{name}");
        assert_eq!(rec.ttl(), TTL_SECONDS);
    }
    // Another namespace's service by `name.namespace`, but not by its bare short name.
    let r = ask(proxy.udp, &query(8, "other.ns2.", RecordType::A)).await;
    assert_eq!(ips(&r), ip_set(&["10.96.0.20"]));
    let r = ask(proxy.udp, &query(9, "other.", RecordType::A)).await;
    assert_eq!(r.response_code(), ResponseCode::ServFail, "forwarded");
}

#[tokio::test]
async fn service_entry_hosts_wildcards_search_domains_and_headless() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(200)));
    // The same host in two namespaces: the pod's namespace wins.
    let r = ask(proxy.udp, &query(1, "api.example.com.", RecordType::A)).await;
    assert_eq!(ips(&r), ip_set(&["240.240.0.1"]));
    let r = ask(proxy.udp, &query(2, "x.wild.example.com.", RecordType::A)).await;
    assert_eq!(ips(&r), ip_set(&["240.240.0.3"]));
    // A search domain appended by the pod's resolver: CNAME to the stripped name, then A.
    let name = "api.example.com.ns1.svc.cluster.local.";
    let r = ask(proxy.udp, &query(3, name, RecordType::A)).await;
    assert_eq!(r.answers().len(), 2, "{r}");
    assert_eq!(r.answers()[0].record_type(), RecordType::CNAME);
    assert_eq!(r.answers()[1].name().to_ascii(), "api.example.com.");
    assert_eq!(ips(&r), ip_set(&["240.240.0.1"]));
    // Headless service: the endpoints; a pod of it by `<pod>.<service>...`.
    let r = ask(
        proxy.udp,
        &query(4, "db.ns1.svc.cluster.local.", RecordType::A),
    )
    .await;
    assert_eq!(ips(&r), ip_set(&["10.0.1.1", "10.0.1.2"]));
    let r = ask(proxy.udp, &query(5, "web-0.db.", RecordType::AAAA)).await;
    assert_eq!(ips(&r), ip_set(&["fd00::1"]));
    let r = ask(proxy.udp, &query(6, "v6.", RecordType::AAAA)).await;
    assert_eq!(ips(&r), ip_set(&["fd00:96::1"]));
}

#[tokio::test]
async fn unknown_names_are_forwarded_upstream() {
    let upstream = fake_upstream().await;
    let proxy = start(config(upstream.addr, Duration::from_secs(5)));
    let mut q = query(4242, "www.example.org.", RecordType::A);
    q.set_edns(Edns::new());
    let r = ask(proxy.udp, &q).await;
    assert_eq!(r.id(), 4242, "the client's id is restored");
    assert_eq!(r.response_code(), ResponseCode::NoError);
    assert!(!r.authoritative());
    assert_eq!(ips(&r), ip_set(&["192.0.2.53"]));
    assert_eq!(upstream.seen.load(Ordering::SeqCst), 1);
    // Non-address queries for known names go upstream too.
    let r = ask(proxy.udp, &query(1, "echo.", RecordType::TXT)).await;
    assert_eq!(r.id(), 1);
    assert_eq!(upstream.seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn servfail_when_upstream_is_dead() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(200)));
    let r = ask(proxy.udp, &query(99, "www.example.org.", RecordType::A)).await;
    assert_eq!(r.id(), 99);
    assert_eq!(r.response_code(), ResponseCode::ServFail);
    assert_eq!(
        r.queries(),
        query(99, "www.example.org.", RecordType::A).queries()
    );

    // A refused upstream (nothing bound) fails fast too.
    let refused = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.local_addr().expect("addr")
    };
    let proxy = start(config(refused, Duration::from_secs(5)));
    let started = Instant::now();
    let r = ask(proxy.udp, &query(100, "www.example.org.", RecordType::A)).await;
    assert_eq!(r.response_code(), ResponseCode::ServFail);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "did not wait out the timeout"
    );
}

#[tokio::test]
async fn aaaa_for_ipv4_only_service_is_empty_noerror() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(200)));
    let r = ask(
        proxy.udp,
        &query(3, "echo.ns1.svc.cluster.local.", RecordType::AAAA),
    )
    .await;
    assert_eq!(r.response_code(), ResponseCode::NoError, "answered locally");
    assert!(r.authoritative());
    assert!(r.answers().is_empty());
}

#[tokio::test]
async fn slow_upstream_does_not_block_other_queries() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_secs(3)));
    let slow = client().await;
    let q = query(1, "www.example.org.", RecordType::A)
        .to_vec()
        .expect("enc");
    slow.send_to(&q, proxy.udp).await.expect("send");
    let started = Instant::now();
    let r = ask(proxy.udp, &query(2, "echo.", RecordType::A)).await;
    assert_eq!(ips(&r), ip_set(&["10.96.0.10"]));
    assert!(started.elapsed() < Duration::from_secs(1));
    let r = recv(&slow, Duration::from_secs(5)).await.expect("servfail");
    assert_eq!((r.id(), r.response_code()), (1, ResponseCode::ServFail));
}

async fn write_framed(stream: &mut TcpStream, m: &Message) {
    let bytes = m.to_vec().expect("encode");
    let len = u16::try_from(bytes.len()).expect("len");
    stream.write_all(&len.to_be_bytes()).await.expect("write");
    stream.write_all(&bytes).await.expect("write");
}

async fn read_framed(stream: &mut TcpStream) -> Message {
    let read = async {
        let len = stream.read_u16().await.expect("len");
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.expect("body");
        Message::from_vec(&buf).expect("message")
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("a TCP answer within 5 s")
}

#[tokio::test]
async fn tcp_carries_several_queries_per_connection() {
    let upstream = fake_upstream().await;
    let proxy = start(config(upstream.addr, Duration::from_secs(5)));
    let mut stream = TcpStream::connect(proxy.tcp).await.expect("connect");
    write_framed(&mut stream, &query(11, "echo.", RecordType::A)).await;
    write_framed(&mut stream, &query(12, "www.example.org.", RecordType::A)).await;
    let mut answers = [
        read_framed(&mut stream).await,
        read_framed(&mut stream).await,
    ];
    answers.sort_by_key(|m| m.id());
    assert_eq!(answers[0].id(), 11);
    assert_eq!(ips(&answers[0]), ip_set(&["10.96.0.10"]));
    assert_eq!(answers[1].id(), 12);
    assert_eq!(ips(&answers[1]), ip_set(&["192.0.2.53"]));
    // Still open for a third.
    write_framed(&mut stream, &query(13, "other.ns2.", RecordType::A)).await;
    assert_eq!(read_framed(&mut stream).await.id(), 13);
}

#[tokio::test]
async fn garbage_is_ignored_and_the_next_query_answered() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(200)));
    let sock = client().await;
    // No readable header: dropped silently.
    sock.send_to(&[0xde, 0xad, 0xbe], proxy.udp)
        .await
        .expect("send");
    assert!(recv(&sock, Duration::from_millis(300)).await.is_none());
    // A header claiming a question that is not there: FORMERR with its id.
    let mut header_only = query(0x5151, "echo.", RecordType::A).to_vec().expect("enc");
    header_only.truncate(14);
    sock.send_to(&header_only, proxy.udp).await.expect("send");
    let r = recv(&sock, Duration::from_secs(2)).await.expect("formerr");
    assert_eq!((r.id(), r.response_code()), (0x5151, ResponseCode::FormErr));
    // A response sent to us is not answered (no reflection loops).
    let mut resp = query(5, "echo.", RecordType::A);
    resp.set_message_type(MessageType::Response);
    sock.send_to(&resp.to_vec().expect("enc"), proxy.udp)
        .await
        .expect("send");
    assert!(recv(&sock, Duration::from_millis(300)).await.is_none());
    // Random bytes of every length never take the server down.
    for len in 0..64u8 {
        let junk: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37) ^ len).collect();
        sock.send_to(&junk, proxy.udp).await.expect("send");
    }
    let sock = client().await;
    let r = ask_on(&sock, proxy.udp, &query(6, "echo.", RecordType::A)).await;
    assert_eq!(ips(&r), ip_set(&["10.96.0.10"]));
    // Garbage on TCP closes nothing else.
    let mut stream = TcpStream::connect(proxy.tcp).await.expect("connect");
    stream.write_all(&[0, 3, 1, 2, 3]).await.expect("write");
    write_framed(&mut stream, &query(7, "echo.", RecordType::A)).await;
    assert_eq!(read_framed(&mut stream).await.id(), 7);
}

#[tokio::test]
async fn drain_stops_the_server() {
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(200)));
    let idle = TcpStream::connect(proxy.tcp).await.expect("connect");
    let r = ask(proxy.udp, &query(1, "echo.", RecordType::A)).await;
    assert_eq!(r.response_code(), ResponseCode::NoError);
    proxy.drain.send(true).expect("drain");
    tokio::time::timeout(Duration::from_secs(2), proxy.task)
        .await
        .expect("serve returns promptly after drain")
        .expect("serve did not panic");
    drop(idle);
    assert!(TcpStream::connect(proxy.tcp).await.is_err(), "TCP closed");
    let sock = client().await;
    let q = query(2, "echo.", RecordType::A).to_vec().expect("enc");
    sock.send_to(&q, proxy.udp).await.expect("send");
    assert!(
        recv(&sock, Duration::from_millis(300)).await.is_none(),
        "UDP closed"
    );
}

#[tokio::test]
async fn queries_are_counted() {
    // The only DnsMetrics registration of this test binary, so it is the installed one.
    let registry = mesh_runtime::metrics::Metrics::new();
    DnsMetrics::register(&registry);
    let (_silent, dead) = silent_upstream().await;
    let proxy = start(config(dead, Duration::from_millis(100)));
    ask(proxy.udp, &query(1, "echo.", RecordType::A)).await;
    let r = ask(proxy.udp, &query(2, "www.example.org.", RecordType::MX)).await;
    assert_eq!(r.response_code(), ResponseCode::ServFail);
    let text = registry.render();
    let labels = |t: &str| {
        format!(
            "{{request_query_type=\"{t}\",request_protocol=\"udp\",\
             source_canonical_service=\"client-app\",source_canonical_revision=\"v1\"}}"
        )
    };
    for metric in [
        "istio_dns_requests_total",
        "istio_dns_upstream_failures_total",
    ] {
        assert!(
            text.contains(&format!("{metric}{}", labels("mx"))),
            "{metric}: {text}"
        );
    }
    assert!(
        text.contains(&format!("istio_dns_requests_total{}", labels("a"))),
        "{text}"
    );
    assert!(!text.contains(&format!("istio_dns_upstream_requests_total{}", labels("a"))));
}

#[test]
fn parsing_arbitrary_bytes_never_panics() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(15053);
    let valid = query(1, "echo.ns1.svc.cluster.local.", RecordType::A)
        .to_vec()
        .expect("enc");
    for _ in 0..20_000 {
        let mut bytes = if rng.random_bool(0.5) {
            valid.clone()
        } else {
            (0..rng.random_range(0..80)).map(|_| rng.random()).collect()
        };
        for _ in 0..rng.random_range(0..4) {
            if let Some(b) = bytes.get_mut(rng.random_range(0..valid.len())) {
                *b = rng.random();
            }
        }
        bytes.truncate(rng.random_range(0..=bytes.len()));
        if let message::Parsed::Query(m) = message::parse(&bytes) {
            let _ = message::local_answer(&m, Vec::new(), Transport::Udp);
            let _ = message::error_response(&m, ResponseCode::ServFail, Transport::Tcp);
        }
    }
}

#[test]
fn resolv_conf_nameservers() {
    let r = Resolvers::from_resolv_conf(
        "# comment\nsearch ns.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\n\
         nameserver fd00::a\nnameserver fe80::1%eth0\noptions ndots:5\nnameserver 1.1.1.1\n\
         nameserver 8.8.8.8\n",
    );
    let want: Vec<SocketAddr> = ["10.96.0.10:53", "[fd00::a]:53", "1.1.1.1:53"]
        .iter()
        .map(|s| s.parse().expect("addr"))
        .collect();
    assert_eq!(r.servers, want);
    assert_eq!(
        Resolvers::from_resolv_conf("").servers,
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 53))]
    );
}
