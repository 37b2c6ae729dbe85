//! Bidirectional byte copy between a downstream and an upstream stream, with half-close
//! propagation and live counters for metrics.
//!
//! Each side is split into a [`ChunkRead`] and a [`ChunkWrite`] that pass `Bytes` along: TCP
//! reads land in a buffer whose filled part is handed on without another copy, HBONE tunnels
//! give and take h2's own `Bytes` ([`super::stream`]).
//!
//! When one side reads EOF, the write half of the other side is shut down (TCP FIN, or HTTP/2
//! END_STREAM on a tunnel) and the opposite direction keeps flowing until it ends too.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::stream::{H2Reader, H2Stream, H2Writer};

/// Size of a direction's first read buffer. Buffers are allocated only once the socket is
/// readable and dropped whenever it has been drained, so idle connections hold none.
const INITIAL_BUFFER: usize = 16 * 1024;
/// Read buffer size once a read has filled a whole buffer (bulk transfers): large reads and
/// writes, fewer syscalls, TLS records and HTTP/2 frames.
const LARGE_BUFFER: usize = 256 * 1024;
/// A fresh buffer is allocated when less than this is left in the current one.
const MIN_SPARE: usize = 4 * 1024;

/// Errors of a bidirectional copy; `direction` says which way the failing bytes were going.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("reading {direction} failed: {source}; the peer probably reset the connection")]
    Read {
        direction: Direction,
        #[source]
        source: io::Error,
    },
    #[error("writing {direction} failed: {source}; the receiver probably reset the connection")]
    Write {
        direction: Direction,
        #[source]
        source: io::Error,
    },
    #[error("propagating half-close {direction} failed: {source}")]
    Shutdown {
        direction: Direction,
        #[source]
        source: io::Error,
    },
}

impl CopyError {
    /// Short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CopyError::Read { .. } => "read",
            CopyError::Write { .. } => "write",
            CopyError::Shutdown { .. } => "shutdown",
        }
    }
}

/// Which way bytes flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the downstream (the connection's initiator) to the upstream.
    Upstream,
    /// From the upstream back to the downstream.
    Downstream,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Upstream => "downstream -> upstream",
            Direction::Downstream => "upstream -> downstream",
        })
    }
}

/// Live byte counters, readable while the copy runs (for metrics).
#[derive(Debug, Default)]
pub struct ByteCounters {
    sent: AtomicU64,
    received: AtomicU64,
}

impl ByteCounters {
    /// Bytes the downstream sent (copied downstream -> upstream) so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Bytes the downstream received (copied upstream -> downstream) so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Counts bytes the downstream sent that went upstream outside the copy (a tunnel's early
    /// data).
    pub fn add_sent(&self, bytes: u64) {
        self.sent.fetch_add(bytes, Ordering::Relaxed);
    }

    fn counter(&self, direction: Direction) -> &AtomicU64 {
        match direction {
            Direction::Upstream => &self.sent,
            Direction::Downstream => &self.received,
        }
    }
}

/// Totals of a finished copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transferred {
    /// Bytes copied downstream -> upstream.
    pub sent: u64,
    /// Bytes copied upstream -> downstream.
    pub received: u64,
}

/// Something that yields chunks of bytes until EOF (`None`).
pub trait ChunkRead: Send + Unpin {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>>;
}

/// Something that takes chunks of bytes and can be half-closed.
pub trait ChunkWrite: Send + Unpin {
    /// Writes a prefix of `chunk` and advances it past what was written.
    fn poll_write_chunk(&mut self, cx: &mut Context<'_>, chunk: &mut Bytes)
        -> Poll<io::Result<()>>;

    /// Half-closes: TCP FIN, or END_STREAM on a tunnel.
    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// A bidirectional stream [`copy_bidirectional`] can split.
pub trait Duplex: Send {
    type Reader: ChunkRead;
    type Writer: ChunkWrite;
    fn into_chunks(self) -> (Self::Reader, Self::Writer);
}

/// Reads from a TCP socket into lazily allocated, growing buffers.
#[derive(Debug)]
pub struct TcpReader {
    half: OwnedReadHalf,
    buf: BytesMut,
    next: usize,
}

impl ChunkRead for TcpReader {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        loop {
            ready!(self.half.as_ref().poll_read_ready(cx))?;
            if self.buf.capacity() - self.buf.len() < MIN_SPARE {
                self.buf = BytesMut::with_capacity(self.next);
            }
            let spare = self.buf.capacity() - self.buf.len();
            match self.half.as_ref().try_read_buf(&mut self.buf) {
                Ok(0) => return Poll::Ready(Ok(None)),
                Ok(n) => {
                    if n == spare {
                        self.next = LARGE_BUFFER;
                    }
                    return Poll::Ready(Ok(Some(self.buf.split().freeze())));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Drained: hold no memory while waiting.
                    self.buf = BytesMut::new();
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Writes chunks to a TCP socket; finishing sends FIN.
#[derive(Debug)]
pub struct TcpWriter(OwnedWriteHalf);

impl ChunkWrite for TcpWriter {
    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<()>> {
        let n = ready!(Pin::new(&mut self.0).poll_write(cx, chunk))?;
        if n == 0 && !chunk.is_empty() {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        bytes::Buf::advance(chunk, n);
        Poll::Ready(Ok(()))
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Duplex for TcpStream {
    type Reader = TcpReader;
    type Writer = TcpWriter;

    fn into_chunks(self) -> (TcpReader, TcpWriter) {
        let (read, write) = self.into_split();
        let reader = TcpReader {
            half: read,
            buf: BytesMut::new(),
            next: INITIAL_BUFFER,
        };
        (reader, TcpWriter(write))
    }
}

impl ChunkRead for H2Reader {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        H2Reader::poll_chunk(self, cx)
    }
}

impl ChunkWrite for H2Writer {
    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<()>> {
        H2Writer::poll_write_chunk(self, cx, chunk)
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.finish())
    }
}

impl Duplex for H2Stream {
    type Reader = H2Reader;
    type Writer = H2Writer;

    fn into_chunks(self) -> (H2Reader, H2Writer) {
        self.into_split()
    }
}

/// Any other `AsyncRead + AsyncWrite` (in-memory pipes in tests), with a copy per read.
#[derive(Debug)]
pub struct AsyncIo<T>(pub T);

/// Reading half of an [`AsyncIo`].
#[derive(Debug)]
pub struct AsyncIoReader<T>(ReadHalf<T>);

/// Writing half of an [`AsyncIo`].
#[derive(Debug)]
pub struct AsyncIoWriter<T>(WriteHalf<T>);

impl<T: AsyncRead + Send> ChunkRead for AsyncIoReader<T> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let mut buf = BytesMut::zeroed(INITIAL_BUFFER);
        let mut read = ReadBuf::new(&mut buf);
        ready!(Pin::new(&mut self.0).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        if n == 0 {
            return Poll::Ready(Ok(None));
        }
        buf.truncate(n);
        Poll::Ready(Ok(Some(buf.freeze())))
    }
}

impl<T: AsyncWrite + Send> ChunkWrite for AsyncIoWriter<T> {
    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<()>> {
        let n = ready!(Pin::new(&mut self.0).poll_write(cx, chunk))?;
        if n == 0 && !chunk.is_empty() {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        bytes::Buf::advance(chunk, n);
        Poll::Ready(Ok(()))
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + AsyncWrite + Send> Duplex for AsyncIo<T> {
    type Reader = AsyncIoReader<T>;
    type Writer = AsyncIoWriter<T>;

    fn into_chunks(self) -> (AsyncIoReader<T>, AsyncIoWriter<T>) {
        let (read, write) = tokio::io::split(self.0);
        (AsyncIoReader(read), AsyncIoWriter(write))
    }
}

/// Copies both ways between `downstream` and `upstream` until both directions reach EOF,
/// shutting down the write side opposite each EOF. The first error ends the whole copy. The
/// totals are the counters' at the end, so bytes counted before the copy began are included.
pub async fn copy_bidirectional<D, U>(
    downstream: D,
    upstream: U,
    counters: &ByteCounters,
) -> Result<Transferred, CopyError>
where
    D: Duplex,
    U: Duplex,
{
    let (down_read, down_write) = downstream.into_chunks();
    let (up_read, up_write) = upstream.into_chunks();
    let to_upstream = copy_one_way(down_read, up_write, Direction::Upstream, counters);
    let to_downstream = copy_one_way(up_read, down_write, Direction::Downstream, counters);
    tokio::try_join!(to_upstream, to_downstream)?;
    Ok(Transferred {
        sent: counters.sent(),
        received: counters.received(),
    })
}

/// Copies `reader` into `writer` until EOF, then shuts `writer` down. Returns the byte count.
async fn copy_one_way<R, W>(
    mut reader: R,
    mut writer: W,
    direction: Direction,
    counters: &ByteCounters,
) -> Result<u64, CopyError>
where
    R: ChunkRead,
    W: ChunkWrite,
{
    let counter = counters.counter(direction);
    let mut total = 0u64;
    loop {
        let chunk = poll_fn(|cx| reader.poll_chunk(cx))
            .await
            .map_err(|source| CopyError::Read { direction, source })?;
        let Some(mut chunk) = chunk else {
            break;
        };
        let n = chunk.len() as u64;
        while !chunk.is_empty() {
            poll_fn(|cx| writer.poll_write_chunk(cx, &mut chunk))
                .await
                .map_err(|source| CopyError::Write { direction, source })?;
        }
        total += n;
        counter.fetch_add(n, Ordering::Relaxed);
    }
    poll_fn(|cx| writer.poll_finish(cx))
        .await
        .map_err(|source| CopyError::Shutdown { direction, source })?;
    tracing::trace!(%direction, bytes = total, "half-close propagated");
    Ok(total)
}
