//! The sockmap programs in a network namespace, as root: the two ends of a local connection
//! (an application socket and a socket marked as ztunnel's) exchange bytes socket to socket,
//! exactly and in order, with half-close; sockets without a partner and pods not enrolled
//! keep TCP; a directory that is no cgroup is refused with a clear error.
#![cfg(feature = "bpf")]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;

use aya_obj::{Object, ProgramSection};
use mesh_capture::PROXY_MARK;
use mesh_ebpf::{
    cgroup2_root, sockmap_object, Sockmap, SockmapError, SockmapStats, DEFAULT_CGROUP2_MOUNT,
    SOCKMAP_PROGRAM_NAMES,
};
use mesh_testutil::netns::{have_root, Netns, TestNet};
use socket2::{Domain, Socket, Type};

const PORT: u16 = 9000;
const PAYLOAD: usize = 4 << 20;

#[test]
fn object_has_the_sockops_and_sk_msg_programs() {
    let bytes = sockmap_object().expect("built with the bpf feature");
    let parsed = Object::parse(bytes).expect("a valid BPF ELF object");
    for name in SOCKMAP_PROGRAM_NAMES {
        let program = parsed.programs.get(name).expect("program present");
        match (name, &program.section) {
            ("mesh_sockops", ProgramSection::SockOps) => {}
            ("mesh_sk_msg", ProgramSection::SkMsg) => {}
            (name, section) => panic!("{name}: unexpected section {section:?}"),
        }
    }
}

/// A pod namespace with one address, and the programs loaded with that address enrolled.
struct Fixture {
    _net: TestNet,
    netns: Netns,
    ip: Ipv4Addr,
    sockmap: Sockmap,
}

fn fixture(hint: &str, host: u8) -> Fixture {
    let mut net = TestNet::new(hint).expect("test network");
    let node = net
        .add_node("n", Ipv4Addr::new(172, 30, 0, 1))
        .expect("node");
    let ip = node.pod_ip(host);
    let pod = net.add_pod(&node, "p", ip).expect("pod");
    let netns = pod.netns().clone();
    let cgroup = cgroup2_root(Path::new(DEFAULT_CGROUP2_MOUNT)).expect("a cgroup v2 hierarchy");
    let sockmap = Sockmap::load(&cgroup).expect("the sockmap programs load and attach");
    sockmap.add_pod(ip).expect("enroll the pod address");
    assert_eq!(sockmap.pods().expect("pods"), vec![ip]);
    Fixture {
        _net: net,
        netns,
        ip,
        sockmap,
    }
}

/// A listener at ip:PORT inside the namespace, marked as ztunnel's sockets are when `proxy`.
fn listen(netns: &Netns, ip: Ipv4Addr, proxy: bool) -> TcpListener {
    netns
        .run(move || {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            if proxy {
                socket.set_mark(PROXY_MARK)?;
            }
            socket.set_reuse_address(true)?;
            socket.bind(&SocketAddr::from((ip, PORT)).into())?;
            socket.listen(16)?;
            Ok::<_, std::io::Error>(TcpListener::from(socket))
        })
        .expect("enter the pod")
        .expect("listen")
}

/// Connects from inside the namespace and accepts: (client end, accepted end).
fn pair(netns: &Netns, listener: &TcpListener) -> (TcpStream, TcpStream) {
    let addr = listener.local_addr().expect("listener address");
    let client = netns
        .run(move || TcpStream::connect(addr))
        .expect("enter the pod")
        .expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    (client, accepted)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..PAYLOAD)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Reads until the end of the stream. A blocking read of a socket in a sock hash can end with
/// `EAGAIN` when something else woke it (the kernel's sockmap receive path does not wait
/// again, unlike plain TCP), so `EAGAIN` means "read again", as it does for the non-blocking
/// sockets of ztunnel and of event-loop applications.
fn read_to_end(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(error) => panic!("read: {error}"),
        }
    }
}

/// Sends `data` from `from` to `to` on two threads; returns what `to` read until `from`
/// half-closed, after which `to` still answers with a reply that `from` must read in full.
fn exchange(from: TcpStream, mut to: TcpStream, data: Vec<u8>, reply: Vec<u8>) {
    let expected = data.clone();
    let expected_reply = reply.clone();
    let sender = std::thread::spawn(move || {
        let mut from = from;
        from.write_all(&data).expect("send");
        from.shutdown(Shutdown::Write).expect("half-close");
        read_to_end(&mut from)
    });
    let got = read_to_end(&mut to);
    assert!(
        got == expected,
        "bytes arrived changed: {} of {} bytes",
        got.len(),
        expected.len()
    );
    to.write_all(&reply).expect("reply after the half-close");
    drop(to);
    let got_reply = sender.join().expect("sender thread");
    assert!(
        got_reply == expected_reply,
        "reply changed: {} of {} bytes",
        got_reply.len(),
        expected_reply.len()
    );
}

fn delta(after: SockmapStats, before: SockmapStats) -> SockmapStats {
    SockmapStats {
        app_sockets: after.app_sockets - before.app_sockets,
        proxy_sockets: after.proxy_sockets - before.proxy_sockets,
        redirected_msgs: after.redirected_msgs - before.redirected_msgs,
        redirected_bytes: after.redirected_bytes - before.redirected_bytes,
        tcp_streams: after.tcp_streams - before.tcp_streams,
        insert_failed: after.insert_failed - before.insert_failed,
    }
}

#[test]
fn app_and_proxy_ends_exchange_bytes_socket_to_socket() {
    if !have_root("app_and_proxy_ends_exchange_bytes_socket_to_socket") {
        return;
    }
    let f = fixture("skr", 10);
    let listener = listen(&f.netns, f.ip, true);
    let before = f.sockmap.stats().expect("stats");
    // The application dials; the marked end is ztunnel's (the inbound leg's roles mirrored).
    let (app, proxy) = pair(&f.netns, &listener);
    exchange(app, proxy, pattern(1), pattern(2));
    // And the other way round: ztunnel's end sends first and half-closes.
    let (app, proxy) = pair(&f.netns, &listener);
    exchange(proxy, app, pattern(3), pattern(4));
    let d = delta(f.sockmap.stats().expect("stats"), before);
    assert_eq!((d.app_sockets, d.proxy_sockets), (2, 2), "{d:?}");
    assert_eq!(d.tcp_streams, 0, "no end fell back to TCP: {d:?}");
    assert!(
        d.redirected_bytes >= 4 * PAYLOAD as u64,
        "every payload byte went socket to socket: {d:?}"
    );
}

#[test]
fn ends_without_a_partner_and_pods_not_enrolled_keep_tcp() {
    if !have_root("ends_without_a_partner_and_pods_not_enrolled_keep_tcp") {
        return;
    }
    let f = fixture("skt", 11);
    // Two application ends: no ztunnel end to pair with.
    let listener = listen(&f.netns, f.ip, false);
    let before = f.sockmap.stats().expect("stats");
    let (client, server) = pair(&f.netns, &listener);
    exchange(client, server, pattern(5), pattern(6));
    let d = delta(f.sockmap.stats().expect("stats"), before);
    assert_eq!(d.app_sockets, 2, "{d:?}");
    assert_eq!(d.tcp_streams, 2, "both ends sent over TCP: {d:?}");
    assert_eq!(d.redirected_bytes, 0, "{d:?}");

    // Not enrolled any more: nothing is added.
    f.sockmap.remove_pod(f.ip).expect("unenroll");
    f.sockmap.remove_pod(f.ip).expect("absent is fine");
    let proxy_listener = {
        drop(listener);
        listen(&f.netns, f.ip, true)
    };
    let before = f.sockmap.stats().expect("stats");
    let (app, proxy) = pair(&f.netns, &proxy_listener);
    exchange(app, proxy, pattern(7), pattern(8));
    let d = delta(f.sockmap.stats().expect("stats"), before);
    assert_eq!(
        d,
        SockmapStats::default(),
        "an unenrolled pod is left alone"
    );
}

#[test]
fn a_directory_that_is_no_cgroup_is_refused() {
    if !have_root("a_directory_that_is_no_cgroup_is_refused") {
        return;
    }
    let dir = std::env::temp_dir();
    let error = Sockmap::load(&dir).expect_err("a plain directory is no cgroup");
    assert!(matches!(error, SockmapError::Attach { .. }), "{error:?}");
    assert_eq!(error.reason(), "attach");
    assert!(error.to_string().contains("cgroup v2"), "{error}");
}

/// Connects from ip:port (a fixed source port) inside the namespace and accepts.
fn pair_from(netns: &Netns, listener: &TcpListener, from: SocketAddr) -> (TcpStream, TcpStream) {
    let addr = listener.local_addr().expect("listener address");
    let client = netns
        .run(move || {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.bind(&from.into())?;
            socket.connect(&addr.into())?;
            Ok::<_, std::io::Error>(TcpStream::from(socket))
        })
        .expect("enter the pod")
        .expect("connect from a fixed port");
    let (accepted, _) = listener.accept().expect("accept");
    (client, accepted)
}

#[test]
fn a_reset_socket_left_open_does_not_take_the_bytes_of_a_new_connection() {
    if !have_root("a_reset_socket_left_open_does_not_take_the_bytes_of_a_new_connection") {
        return;
    }
    let f = fixture("sks", 13);
    let listener = listen(&f.netns, f.ip, true);
    let from = SocketAddr::from((f.ip, 40_000));
    let (old_app, old_proxy) = pair_from(&f.netns, &listener, from);
    // ztunnel's end resets; the application has not closed its socket, so the socket stays in
    // its hash under the connection's key.
    socket2::SockRef::from(&old_proxy)
        .set_linger(Some(std::time::Duration::ZERO))
        .expect("linger 0");
    drop(old_proxy);
    std::thread::sleep(std::time::Duration::from_millis(100));
    // A new connection with the same 4-tuple: its bytes reach its own application socket.
    let (app, proxy) = pair_from(&f.netns, &listener, from);
    exchange(proxy, app, pattern(9), pattern(10));
    drop(old_app);
}
