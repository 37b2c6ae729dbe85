//! Bidirectional byte copy between a downstream and an upstream stream, with half-close
//! propagation and live counters for metrics.
//!
//! When one side reads EOF, the write half of the other side is shut down (TCP FIN, or HTTP/2
//! END_STREAM on a tunnel) and the opposite direction keeps flowing until it ends too.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Initial copy buffer size.
const INITIAL_BUFFER: usize = 16 * 1024;
/// Buffer size once a direction has carried [`LARGE_AFTER`] bytes (bulk transfers).
const LARGE_BUFFER: usize = 256 * 1024;
/// Bytes after which a direction switches to [`LARGE_BUFFER`].
const LARGE_AFTER: u64 = 10 * 1024 * 1024;

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

/// Copies both ways between `downstream` and `upstream` until both directions reach EOF,
/// shutting down the write side opposite each EOF. The first error ends the whole copy.
pub async fn copy_bidirectional<D, U>(
    downstream: D,
    upstream: U,
    counters: &ByteCounters,
) -> Result<Transferred, CopyError>
where
    D: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    let (down_read, down_write) = tokio::io::split(downstream);
    let (up_read, up_write) = tokio::io::split(upstream);
    let to_upstream = copy_one_way(down_read, up_write, Direction::Upstream, counters);
    let to_downstream = copy_one_way(up_read, down_write, Direction::Downstream, counters);
    let (sent, received) = tokio::try_join!(to_upstream, to_downstream)?;
    Ok(Transferred { sent, received })
}

/// Copies `reader` into `writer` until EOF, then shuts `writer` down. Returns the byte count.
async fn copy_one_way<R, W>(
    mut reader: R,
    mut writer: W,
    direction: Direction,
    counters: &ByteCounters,
) -> Result<u64, CopyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let counter = counters.counter(direction);
    let mut buf = vec![0u8; INITIAL_BUFFER];
    let mut total = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|source| CopyError::Read { direction, source })?;
        if n == 0 {
            break;
        }
        writer
            .write_all(&buf[..n])
            .await
            .map_err(|source| CopyError::Write { direction, source })?;
        writer
            .flush()
            .await
            .map_err(|source| CopyError::Write { direction, source })?;
        total += n as u64;
        counter.fetch_add(n as u64, Ordering::Relaxed);
        if total > LARGE_AFTER && buf.len() < LARGE_BUFFER {
            buf.resize(LARGE_BUFFER, 0);
        }
    }
    writer
        .shutdown()
        .await
        .map_err(|source| CopyError::Shutdown { direction, source })?;
    tracing::trace!(%direction, bytes = total, "half-close propagated");
    Ok(total)
}
