//! Istio's maximum connection age (`--keepaliveMaxServerConnectionAge`): at the age istiod
//! sends GOAWAY, so proxies open their next calls to any replica behind the Service; a grace
//! period later the connection is closed whatever it still carries, so long-lived xDS streams
//! move too.
//!
//! tonic's server sends the GOAWAY (`max_connection_age` without a grace). Its own grace
//! setting would instead close the connection at age + grace with no GOAWAY first, so the close
//! is done here, in the connection's I/O: after the deadline, reads, writes and flushes fail
//! and the HTTP/2 connection ends. tonic's age is one value for every connection; the close is
//! where each connection gets its own share of spread (see the server's `Keepalive::aged`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// A connection's I/O that fails once `limit` has passed since it was accepted.
pub struct AgedIo<T> {
    io: T,
    close_at: Option<Pin<Box<Sleep>>>,
}

impl<T> AgedIo<T> {
    /// `limit`: the age plus the grace; `None` never closes.
    pub fn new(io: T, limit: Option<Duration>) -> AgedIo<T> {
        AgedIo {
            io,
            close_at: limit.map(|l| Box::pin(tokio::time::sleep(l))),
        }
    }

    /// Whether the deadline has passed; otherwise the task is woken when it does, so a
    /// connection waiting on a read is closed on time.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.close_at
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
    }
}

fn too_old() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the connection's maximum age and grace period have passed",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for AgedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(too_old()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AgedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(too_old()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(too_old()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(too_old()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for AgedIo<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_and_writes_fail_once_the_limit_has_passed() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut young = AgedIo::new(near, Some(Duration::from_secs(60)));
        far.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        young.read_exact(&mut buf).await.unwrap();
        young.write_all(b"pong").await.unwrap();
        young.flush().await.unwrap();

        let (near, _far) = tokio::io::duplex(1024);
        let mut aged = AgedIo::new(near, Some(Duration::from_millis(100)));
        // A read waiting for data is woken by the deadline, not left hanging.
        let waiting = tokio::time::timeout(Duration::from_secs(5), aged.read(&mut buf))
            .await
            .expect("the deadline woke the read");
        assert_eq!(waiting.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            aged.write(b"late").await.unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        assert_eq!(
            aged.flush().await.unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }

    #[tokio::test]
    async fn without_a_limit_nothing_expires() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut aged = AgedIo::new(near, None);
        tokio::time::sleep(Duration::from_millis(50)).await;
        far.write_all(b"ok").await.unwrap();
        let mut buf = [0u8; 2];
        aged.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ok");
    }
}
