//! A hand-rolled HTTP/2 client over mesh TLS, for what hyper's client refuses to send: a
//! `CONNECT` without `:authority`, or more streams than the peer's `max_concurrent_streams`.
//! HPACK: literals without indexing only, so no encoder state is needed.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::WAIT;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const GOAWAY: u8 = 0x7;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;
/// RST_STREAM / GOAWAY error codes.
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;

/// Static-table indexes (RFC 7541 appendix A).
pub const AUTHORITY: u8 = 1;
pub const METHOD: u8 = 2;
pub const PATH: u8 = 4;
pub const SCHEME: u8 = 6;

#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// How the server answered one stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Response headers with this `:status` (0: not a static-table status).
    Status(u16),
    /// RST_STREAM with this error code.
    Reset(u32),
}

/// HPACK integer with an `n`-bit prefix, OR-ed into `first`.
fn int(out: &mut Vec<u8>, first: u8, n: u8, value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A literal header field without indexing, its name from the static table.
pub fn field(out: &mut Vec<u8>, name_index: u8, value: &str) {
    int(out, 0x00, 4, usize::from(name_index));
    int(out, 0x00, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

/// `CONNECT` with `:authority` (or none).
pub fn connect_block(authority: Option<&str>) -> Vec<u8> {
    let mut block = Vec::new();
    field(&mut block, METHOD, "CONNECT");
    if let Some(authority) = authority {
        field(&mut block, AUTHORITY, authority);
    }
    block
}

/// `:status` of a response header block, when it is a static-table entry.
fn status_of(block: &[u8]) -> u16 {
    match block.first() {
        Some(0x88) => 200,
        Some(0x8c) => 400,
        Some(0x8d) => 404,
        Some(0x8e) => 500,
        _ => 0,
    }
}

pub struct RawH2 {
    io: TlsStream<TcpStream>,
}

impl RawH2 {
    /// TLS with `tls`, the client preface, and the SETTINGS exchange.
    pub async fn connect(addr: SocketAddr, tls: Arc<ClientConfig>) -> RawH2 {
        let tcp = TcpStream::connect(addr).await.expect("tcp connect");
        let io = TlsConnector::from(tls)
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .expect("TLS handshake");
        let mut raw = RawH2 { io };
        raw.io
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("preface");
        raw.send(SETTINGS, 0, 0, &[]).await;
        loop {
            let frame = raw.read().await.expect("server SETTINGS");
            if frame.kind == SETTINGS && frame.flags & ACK == 0 {
                break;
            }
        }
        raw.send(SETTINGS, ACK, 0, &[]).await;
        raw
    }

    pub async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("frame length");
        let mut buf = len.to_be_bytes()[1..].to_vec();
        buf.extend_from_slice(&[kind, flags]);
        buf.extend_from_slice(&stream.to_be_bytes());
        buf.extend_from_slice(payload);
        self.io.write_all(&buf).await.expect("frame write");
        self.io.flush().await.expect("frame flush");
    }

    pub async fn headers(&mut self, stream: u32, block: &[u8]) {
        self.send(HEADERS, END_HEADERS, stream, block).await;
    }

    /// The next frame, or `None` once the server closed the connection.
    pub async fn read(&mut self) -> Option<Frame> {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout(WAIT, self.io.read_exact(&mut head))
            .await
            .expect("a frame in time");
        read.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await.ok()?;
        Some(Frame {
            kind: head[3],
            flags: head[4],
            stream,
            payload,
        })
    }

    /// Reads until `stream` is answered (headers or reset); panics on GOAWAY or EOF.
    /// Frames of other streams are handed to `other`.
    pub async fn answer(&mut self, stream: u32, mut other: impl FnMut(Frame)) -> Answer {
        loop {
            let frame = self.read().await.expect("connection still open");
            assert_ne!(
                frame.kind, GOAWAY,
                "the server closed the connection: {frame:?}"
            );
            if frame.stream != stream {
                other(frame);
                continue;
            }
            match frame.kind {
                HEADERS => return Answer::Status(status_of(&frame.payload)),
                RST_STREAM => return Answer::Reset(code(&frame.payload)),
                _ => other(frame),
            }
        }
    }

    /// Reads DATA of `stream` until END_STREAM; returns the bytes. Panics on GOAWAY or reset.
    pub async fn body(&mut self, stream: u32) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let frame = self.read().await.expect("connection still open");
            assert_ne!(
                frame.kind, GOAWAY,
                "the server closed the connection: {frame:?}"
            );
            if frame.stream != stream {
                continue;
            }
            assert_ne!(frame.kind, RST_STREAM, "stream {stream} reset: {frame:?}");
            if frame.kind == DATA {
                body.extend_from_slice(&frame.payload);
                if frame.flags & END_STREAM != 0 {
                    return body;
                }
            }
        }
    }
}

/// The error code of an RST_STREAM payload.
pub fn code(payload: &[u8]) -> u32 {
    let bytes: [u8; 4] = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .expect("code");
    u32::from_be_bytes(bytes)
}
