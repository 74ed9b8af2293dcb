//! A connection that stops reading its response is closed: writes that make no progress for
//! [`WRITE_STALL_TIMEOUT`], or a response still not written out after [`WRITE_BUDGET`], end the
//! connection with `TimedOut`, and the response buffered for it is freed.
//!
//! Without it, a client that sends `GET /metrics` and never reads held the whole rendered
//! response for as long as it kept the socket open: 40 such connections took the agent from 55
//! to 742 MB, and 5 were still open after 145 s (issue 33). Headers that never come are
//! `HEADER_READ_TIMEOUT`'s; this is the other direction.
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a write may make no progress (the client reads nothing).
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a response may take to be written out in all, however slowly the client reads.
pub const WRITE_BUDGET: Duration = Duration::from_secs(30);

/// `S` with its writes watched.
pub struct WriteGuard<S> {
    inner: S,
    stall: Pin<Box<Sleep>>,
    /// The stall timer runs (a write is pending since the last progress).
    armed: bool,
    /// When the data now being written first had to wait; cleared once a flush completes.
    behind_since: Option<Instant>,
    stall_timeout: Duration,
    budget: Duration,
}

impl<S> WriteGuard<S> {
    pub fn new(inner: S) -> Self {
        Self::with_limits(inner, WRITE_STALL_TIMEOUT, WRITE_BUDGET)
    }

    pub fn with_limits(inner: S, stall_timeout: Duration, budget: Duration) -> Self {
        Self {
            inner,
            stall: Box::pin(tokio::time::sleep(stall_timeout)),
            armed: false,
            behind_since: None,
            stall_timeout,
            budget,
        }
    }

    /// A write or flush is pending: arms the stall timer, and fails once either limit passed.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let now = Instant::now();
        let since = *self.behind_since.get_or_insert(now);
        if !self.armed {
            self.stall.as_mut().reset(now + self.stall_timeout);
            self.armed = true;
        }
        let over_budget = now.duration_since(since) >= self.budget;
        if over_budget || self.stall.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                if over_budget {
                    "the response was not read out within its budget"
                } else {
                    "the client stopped reading"
                },
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.waiting(cx),
            ready => {
                if matches!(ready, Poll::Ready(Ok(n)) if n > 0) {
                    self.armed = false;
                }
                ready
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.waiting(cx),
            ready => {
                if matches!(ready, Poll::Ready(Ok(()))) {
                    self.armed = false;
                    self.behind_since = None;
                }
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.waiting(cx),
            ready => {
                if matches!(ready, Poll::Ready(Ok(n)) if n > 0) {
                    self.armed = false;
                }
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_never_reads_is_dropped_after_the_stall_timeout() {
        // A pipe with 64 bytes of room, whose other end reads nothing.
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut guarded = WriteGuard::with_limits(ours, Duration::from_secs(10), WRITE_BUDGET);
        let started = Instant::now();
        let err = guarded.write_all(&[0u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_keeps_the_connection_until_the_budget() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        // reads 64 bytes every 5 s: progress within every stall timeout, never done
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if tokio::io::AsyncReadExt::read(&mut theirs, &mut buf)
                    .await
                    .unwrap_or(0)
                    == 0
                {
                    return;
                }
            }
        });
        let mut guarded =
            WriteGuard::with_limits(ours, Duration::from_secs(10), Duration::from_secs(30));
        let started = Instant::now();
        let err = guarded.write_all(&[0u8; 1 << 20]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(
            (Duration::from_secs(30)..Duration::from_secs(36)).contains(&took),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_up_is_never_cut() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut theirs, &mut all)
                .await
                .unwrap();
            all.len()
        });
        let mut guarded =
            WriteGuard::with_limits(ours, Duration::from_secs(10), Duration::from_secs(30));
        guarded.write_all(&[7u8; 100_000]).await.unwrap();
        guarded.flush().await.unwrap();
        guarded.shutdown().await.unwrap();
        drop(guarded);
        assert_eq!(reader.await.unwrap(), 100_000);
    }
}
