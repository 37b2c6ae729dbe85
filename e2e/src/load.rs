//! Many connections at once: an echo server as its own process (`mesh-e2e-echo`, so the
//! server ends count against its fd limit, not the test's), and clients that open thousands of
//! connections from a pod and check each with a round trip.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;

use crate::bins::binary;

/// The echo server as its own process in `netns` (the server ends of 5,000 connections then
/// count against its fd limit), killed on drop.
pub fn echo_process(netns: &Netns, port: u16) -> ChildGuard {
    let mut cmd = Command::new(binary("mesh-e2e-echo"));
    cmd.arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = netns.spawn(&mut cmd).expect("start mesh-e2e-echo");
    let stdout = child.child().stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read mesh-e2e-echo");
    assert_eq!(line.trim(), "listening", "mesh-e2e-echo did not start");
    child
}

/// Opens `count` connections from `netns` to `addr` on `threads` threads (connect only: the
/// local capture accepts them before the tunnel exists); panics naming the first failure.
pub fn open_many(netns: &Netns, addr: SocketAddr, count: usize, threads: usize) -> Vec<TcpStream> {
    let per = count.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let n = per.min(count - (per * t).min(count));
                s.spawn(move || {
                    netns
                        .run(|| {
                            (0..n)
                                .map(|i| {
                                    TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                                        .map_err(|e| format!("connection {i} of thread {t}: {e}"))
                                })
                                .collect::<Result<Vec<_>, String>>()
                        })
                        .expect("enter client netns")
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .expect("connect thread")
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    })
}

/// One 8-byte round trip on every stream, on `threads` threads; the failures.
pub fn round_trip_all(streams: &mut [TcpStream], threads: usize) -> Vec<String> {
    let per = streams.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .chunks_mut(per)
            .map(|chunk| {
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for (i, stream) in chunk.iter_mut().enumerate() {
                        let payload = (i as u64).to_be_bytes();
                        let mut back = [0u8; 8];
                        let got = stream
                            .set_read_timeout(Some(Duration::from_secs(20)))
                            .and_then(|_| stream.write_all(&payload))
                            .and_then(|_| stream.read_exact(&mut back));
                        match got {
                            Ok(()) if back == payload => {}
                            Ok(()) => failures.push(format!("wrong echo {back:?}")),
                            Err(e) => failures.push(e.to_string()),
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("round trip thread"))
            .collect()
    })
}
