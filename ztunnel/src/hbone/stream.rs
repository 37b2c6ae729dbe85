//! One HBONE tunnel as the `h2` crate's stream pair, used directly (no hyper upgrade layer):
//! bytes read from the tunnel are the DATA frames h2 decoded (no copy), bytes written to it are
//! handed to h2 as `Bytes` (no copy when they come from [`super::copy`]), with HTTP/2 flow
//! control as backpressure. Also the HTTP/2 PING keepalive shared by the client and server.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h2::{PingPong, RecvStream, SendStream};
pub(crate) use mesh_grpc::keepalive::PingEnd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes h2 may hold queued for one stream before `poll_capacity` pushes back (hyper's
/// default, which the HBONE client and server used before).
pub(crate) const MAX_SEND_BUFFER: usize = 400 * 1024;

/// Encrypted bytes rustls may queue for the socket (its default is 64 KiB). h2 writes DATA
/// frames of up to 256 KiB (a copy buffer); with room for a whole frame, rustls takes it in
/// one call and the records go out in one `writev`, instead of one per 64 KiB.
pub(crate) const TLS_BUFFER_LIMIT: usize = 256 * 1024;

/// An h2 error as an I/O error (the underlying one when there is one).
pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        if let Some(io) = e.into_io() {
            return io;
        }
        return io::Error::other("HTTP/2 I/O error");
    }
    io::Error::other(e)
}

/// Receiving half of a tunnel: DATA frames as they arrive, their flow-control credit given
/// back at once (the receive window bounds what the peer may have in flight).
#[derive(Debug)]
pub struct H2Reader {
    recv: RecvStream,
}

impl H2Reader {
    /// The next non-empty chunk; `None` once the peer sent END_STREAM.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        loop {
            match ready!(self.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(None)),
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                Some(Ok(chunk)) if chunk.is_empty() => continue,
                Some(Ok(chunk)) => {
                    // Fails only when the stream is already gone; the next poll reports it.
                    let _ = self.recv.flow_control().release_capacity(chunk.len());
                    return Poll::Ready(Ok(Some(chunk)));
                }
            }
        }
    }
}

/// Sending half of a tunnel. Dropped without [`H2Writer::finish`], h2 resets the stream.
#[derive(Debug)]
pub struct H2Writer {
    send: SendStream<Bytes>,
    finished: bool,
}

impl H2Writer {
    /// Queues a prefix of `chunk` (as much as flow control and the send buffer allow) and
    /// advances `chunk` past it.
    pub fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<()>> {
        if chunk.is_empty() {
            return Poll::Ready(Ok(()));
        }
        self.send.reserve_capacity(chunk.len());
        let mut capacity = self.send.capacity();
        while capacity == 0 {
            capacity = match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(n)) => n,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => return Poll::Ready(Err(closed())),
            };
        }
        let part = chunk.split_to(capacity.min(chunk.len()));
        self.send.send_data(part, false).map_err(h2_to_io).into()
    }

    /// Sends END_STREAM (once).
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.finished {
            self.send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
            self.finished = true;
        }
        Ok(())
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the HTTP/2 stream was closed by the peer",
    )
}

/// A tunnel's two h2 halves; also `AsyncRead + AsyncWrite` (with one copy per write) for
/// callers that are not [`super::copy`].
#[derive(Debug)]
pub struct H2Stream {
    reader: H2Reader,
    writer: H2Writer,
    /// Received bytes not yet returned by `poll_read`.
    pending: Bytes,
}

impl H2Stream {
    pub(crate) fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        H2Stream {
            reader: H2Reader { recv },
            writer: H2Writer {
                send,
                finished: false,
            },
            pending: Bytes::new(),
        }
    }

    /// The receiving and sending halves. Bytes already buffered by `poll_read` are lost, so
    /// split before reading.
    pub fn into_split(self) -> (H2Reader, H2Writer) {
        (self.reader, self.writer)
    }
}

impl AsyncRead for H2Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending.is_empty() {
            match ready!(this.reader.poll_chunk(cx))? {
                Some(chunk) => this.pending = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let writer = &mut self.writer;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        writer.send.reserve_capacity(buf.len());
        let mut capacity = writer.send.capacity();
        while capacity == 0 {
            capacity = match ready!(writer.send.poll_capacity(cx)) {
                Some(Ok(n)) => n,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => return Poll::Ready(Err(closed())),
            };
        }
        let n = capacity.min(buf.len());
        writer
            .send
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2's connection task writes queued frames out on its own.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.writer.finish())
    }
}

/// Sends a PING every `interval` and waits up to `timeout` for its PONG, until one is late
/// or the connection closes; idle HBONE connections are pinged too. Never returns when
/// `interval` is `None`.
pub(crate) async fn keepalive(
    ping_pong: Option<PingPong>,
    interval: Option<Duration>,
    timeout: Duration,
) -> PingEnd {
    mesh_grpc::keepalive::pings(ping_pong, interval, timeout, || true).await
}
