//! The send-progress timeout of a client connection (`limits.send_timeout`): a client that
//! accepts no byte of what we write for that long (a full socket buffer, a zero TCP window, a
//! slow-read attack) gets its connection closed, so it cannot hold a request slot, an
//! upstream connection or a response body for ever. Any accepted byte restarts the clock.
//!
//! [`SendProgress`] wraps the connection's transport below HTTP/1.1, both HTTP/2 engines and
//! TLS; HTTP/3 bounds each response write the same way (see `crate::listen::quic`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A transport whose writes fail with `TimedOut` after `timeout` without progress.
pub struct SendProgress<IO> {
    io: IO,
    timeout: Duration,
    /// Armed while a write or flush waits; cleared when one makes progress.
    stall: Option<Pin<Box<Sleep>>>,
}

impl<IO> SendProgress<IO> {
    /// Wraps `io`.
    pub fn new(io: IO, timeout: Duration) -> SendProgress<IO> {
        SendProgress {
            io,
            timeout,
            stall: None,
        }
    }

    /// The wrapped transport.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// `Pending` from the transport: arm (or poll) the stall clock.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client accepted no data within send_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.waiting(cx),
            ready => {
                self.stall = None;
                ready
            }
        }
    }
}

use std::future::Future as _;

impl<IO: AsyncRead + Unpin> AsyncRead for SendProgress<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SendProgress<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(r, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.progress(r, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(r, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_reader_that_never_reads_times_the_writer_out() {
        let (a, _b) = tokio::io::duplex(64);
        let mut w = SendProgress::new(a, Duration::from_millis(300));
        let start = tokio::time::Instant::now();
        let err = w.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_not_timed_out() {
        use tokio::io::AsyncReadExt;
        let (a, mut b) = tokio::io::duplex(64);
        let mut w = SendProgress::new(a, Duration::from_millis(500));
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 16];
            while got < 1024 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                got += b.read(&mut buf).await.unwrap();
            }
            got
        });
        w.write_all(&[0u8; 1024]).await.unwrap();
        drop(w);
        assert_eq!(reader.await.unwrap(), 1024);
    }
}
