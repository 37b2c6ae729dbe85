//! Application traffic checks: one echo round trip over a fresh connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use mesh_testutil::Netns;

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Echo {
    /// The payload came back.
    Ok,
    /// Connected, but the connection closed or reset before the payload came back (policy
    /// denials look like this from the client: ztunnel accepted, then closed).
    Closed(String),
    /// No connection.
    Refused(String),
}

/// Connects from `netns` to `addr`, sends a line and expects it back.
pub fn echo(netns: &Netns, addr: SocketAddr) -> Echo {
    let stream = match netns.tcp_connect(addr, Duration::from_secs(3)) {
        Ok(s) => s,
        Err(e) => return Echo::Refused(e.to_string()),
    };
    echo_on(&stream)
}

/// One round trip on an open connection.
pub fn echo_on(mut stream: &TcpStream) -> Echo {
    let payload = b"mesh-e2e ping\n";
    if let Err(e) = stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .and_then(|_| stream.write_all(payload))
    {
        return Echo::Closed(e.to_string());
    }
    let mut got = vec![0u8; payload.len()];
    match stream.read_exact(&mut got) {
        Ok(()) if got == payload => Echo::Ok,
        Ok(()) => Echo::Closed(format!(
            "unexpected reply {:?}",
            String::from_utf8_lossy(&got)
        )),
        Err(e) => Echo::Closed(e.to_string()),
    }
}

/// Retries [`echo`] until it gives `want` or `limit` passes; returns the last outcome.
pub fn echo_until(
    netns: &Netns,
    addr: SocketAddr,
    want: fn(&Echo) -> bool,
    limit: Duration,
) -> Echo {
    let start = std::time::Instant::now();
    loop {
        let got = echo(netns, addr);
        if want(&got) || start.elapsed() > limit {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `payload` to `addr` from `netns` (writer thread) and reads back as many bytes;
/// `None` if the connection failed or closed early.
pub fn echo_bytes(netns: &Netns, addr: SocketAddr, payload: &[u8]) -> Option<Vec<u8>> {
    let stream = netns.tcp_connect(addr, Duration::from_secs(3)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut writer = stream.try_clone().ok()?;
    let data = payload.to_vec();
    let sender = std::thread::spawn(move || writer.write_all(&data).is_ok());
    let mut got = vec![0u8; payload.len()];
    let mut reader = &stream;
    let read = reader.read_exact(&mut got).is_ok();
    let sent = sender.join().unwrap_or(false);
    (read && sent).then_some(got)
}
