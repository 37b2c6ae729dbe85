//! A minimal HTTP/1.0 GET from inside a network namespace (admin, metrics, readiness).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use mesh_testutil::Netns;

/// `GET path` to `addr` from `netns`: `(status, body)`, or `None` if nothing answered.
pub fn get(netns: &Netns, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = netns.tcp_connect(addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}
