use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use super::*;

/// An in-memory transport that counts the reads reaching it.
struct Counting<S> {
    inner: S,
    reads: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counting<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.reads += 1;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn small_reads_are_served_from_few_socket_reads_in_order() {
    let data = pattern(512 * 1024);
    let (mut tx, rx) = tokio::io::duplex(1024 * 1024);
    tx.write_all(&data).await.unwrap();
    drop(tx);
    let mut r = ReadBuffered::new(Counting {
        inner: rx,
        reads: 0,
    });
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = r.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(got, data);
    // 512 KiB in 128 KiB socket reads, then the read that sees EOF: not 128 4 KiB reads.
    assert_eq!(r.get_ref().reads, 5);
}

#[tokio::test]
async fn buffer_is_released_when_the_socket_has_nothing_more() {
    let (mut tx, rx) = tokio::io::duplex(1024 * 1024);
    tx.write_all(&pattern(10_000)).await.unwrap();
    let mut r = ReadBuffered::new(rx);
    let mut chunk = [0u8; 4096];
    assert_eq!(r.read(&mut chunk).await.unwrap(), 4096);
    assert!(r.holds_buffer());
    assert_eq!(r.buffered(), 10_000 - 4096);
    let mut rest = vec![0u8; 10_000 - 4096];
    r.read_exact(&mut rest).await.unwrap();
    assert_eq!(r.buffered(), 0);
    // The next read finds the socket empty: it stays pending and nothing is held meanwhile.
    let pending = poll_fn(|cx| {
        let mut rb = ReadBuf::new(&mut chunk);
        Poll::Ready(Pin::new(&mut r).poll_read(cx, &mut rb).is_pending())
    })
    .await;
    assert!(pending);
    assert!(!r.holds_buffer());
    // Data arriving later is still read.
    tx.write_all(b"later").await.unwrap();
    let n = r.read(&mut chunk).await.unwrap();
    assert_eq!(&chunk[..n], b"later");
}

#[tokio::test]
async fn large_reads_bypass_the_buffer() {
    let data = pattern(300 * 1024);
    let (mut tx, rx) = tokio::io::duplex(1024 * 1024);
    tx.write_all(&data).await.unwrap();
    drop(tx);
    let mut r = ReadBuffered::new(rx);
    let mut big = vec![0u8; SOCKET_READ];
    let n = r.read(&mut big).await.unwrap();
    assert!(n > 0);
    assert!(!r.holds_buffer());
    assert_eq!(&big[..n], &data[..n]);
}

#[tokio::test]
async fn writes_and_shutdown_pass_through_over_tcp() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = tokio::spawn(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut w = ReadBuffered::new(tcp);
        let bufs = [IoSlice::new(b"hello "), IoSlice::new(b"world")];
        let mut written = 0;
        while written < 11 {
            written += w.write_vectored(&bufs).await.unwrap();
            if written < 11 {
                w.write_all(&b"hello world"[written..]).await.unwrap();
                written = 11;
            }
        }
        w.shutdown().await.unwrap();
        let mut echoed = Vec::new();
        w.read_to_end(&mut echoed).await.unwrap();
        echoed
    });
    let (mut server, _) = listener.accept().await.unwrap();
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"hello world");
    server.write_all(b"bye").await.unwrap();
    drop(server);
    assert_eq!(client.await.unwrap(), b"bye");
}
