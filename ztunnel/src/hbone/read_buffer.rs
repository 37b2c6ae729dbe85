//! A read buffer under rustls. rustls pulls TLS records from its transport at most 4 KiB
//! per `read`, so a bulk HBONE transfer read straight from the socket costs four or five
//! `recvmsg` calls per 16 KiB record (each taking the socket lock and maybe sending an ACK).
//! [`ReadBuffered`] reads up to [`SOCKET_READ`] bytes per call and serves rustls from memory;
//! the buffer exists only while bytes are buffered or a read is in flight, so idle pooled
//! connections hold none. Writes pass straight through (vectored, as rustls writes records).

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest single read from the socket.
pub(crate) const SOCKET_READ: usize = 128 * 1024;

/// A transport whose reads go through a lazily allocated buffer.
#[derive(Debug)]
pub struct ReadBuffered<S> {
    inner: S,
    buf: Vec<u8>,
    pos: usize,
}

impl<S> ReadBuffered<S> {
    pub fn new(inner: S) -> Self {
        ReadBuffered {
            inner,
            buf: Vec::new(),
            pos: 0,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Bytes read from the socket and not yet handed on.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Hands buffered bytes to `out`. A drained buffer keeps its allocation for the next read.
    fn drain_into(&mut self, out: &mut ReadBuf<'_>) {
        let n = out.remaining().min(self.buffered());
        out.put_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Whether an allocation is held (for tests).
    #[cfg(test)]
    fn holds_buffer(&self) -> bool {
        self.buf.capacity() > 0
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadBuffered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buffered() > 0 {
            this.drain_into(out);
            return Poll::Ready(Ok(()));
        }
        if out.remaining() >= SOCKET_READ {
            // A read as large as ours gains nothing from the buffer.
            return Pin::new(&mut this.inner).poll_read(cx, out);
        }
        let mut buf = std::mem::take(&mut this.buf);
        buf.clear();
        buf.reserve_exact(SOCKET_READ);
        let spare: &mut [MaybeUninit<u8>] = &mut buf.spare_capacity_mut()[..SOCKET_READ];
        let mut rb = ReadBuf::uninit(spare);
        let polled = Pin::new(&mut this.inner).poll_read(cx, &mut rb);
        let n = rb.filled().len();
        match polled {
            // Nothing is buffered while the socket is drained: the allocation is released
            // (`buf` is dropped), so idle connections hold no buffer.
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {
                // SAFETY: `ReadBuf` over the spare capacity guarantees that its first `n`
                // bytes were initialized by the read, and `n <= SOCKET_READ <= capacity`.
                #[expect(unsafe_code, reason = "reads into uninitialized spare capacity")]
                unsafe {
                    buf.set_len(n)
                };
                this.buf = buf;
                this.pos = 0;
                if n > 0 {
                    this.drain_into(out);
                }
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadBuffered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "read_buffer/tests.rs"]
mod tests;
