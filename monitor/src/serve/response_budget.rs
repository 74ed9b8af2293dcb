//! The bytes of all responses not yet written out, together, within a budget: a response holds
//! its share from the moment it is rendered until its last byte left the agent, or its
//! connection closed. Past the budget a request is answered `503` with `Retry-After`, at no cost.
//!
//! The write guard closes a connection that stops reading within 30 s, but until then each
//! holds its whole response: 40 slow readers of a 33.5-MB response took the agent from 406 MB to
//! 1.6 GB, 68 to 1.87 GB, and reconnecting kept it there (issue 57). Small answers (health,
//! errors) are not counted: they cannot add up to much within the connection limit, and a
//! health check must answer while slow readers hold the budget.
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The bytes of responses all connections may hold at once: sixteen answers of 2 MB (`/metrics`
/// of a host with a few hundred containers is under one) not yet read out. 100 slow readers of
/// a 2.2-MB snapshot took the debug build 65 MB over its baseline with it, 226 MB without.
pub const RESPONSES_MAX_BYTES: usize = 32 << 20;
/// A response this small is not counted.
pub const UNCOUNTED_MAX_BYTES: usize = 4 << 10;
/// The body is handed to the connection in pieces of this size, so that what the connection has
/// buffered and not yet sent stays small and the rest is still counted here.
const CHUNK_BYTES: usize = 64 << 10;

/// The responses' budget, shared by every connection.
#[derive(Clone)]
pub struct ResponseBudget {
    held: Arc<AtomicUsize>,
    max: usize,
}

impl ResponseBudget {
    pub fn new(max: usize) -> Self {
        Self {
            held: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// The bytes held by responses not yet written out.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Whether less than an eighth of the budget is left: a request is then refused before its
    /// answer is rendered (rendering a large one costs more CPU than refusing it afterwards).
    pub fn nearly_spent(&self) -> bool {
        self.held() > self.max - self.max / 8
    }

    /// `data` as a response body not counted (a short answer).
    pub fn uncounted(&self, data: Bytes) -> CountedBody {
        CountedBody {
            data,
            counted: 0,
            held: self.held.clone(),
        }
    }

    /// `data` as a response body holding its share of the budget until dropped; `None` when the
    /// budget has no room for it.
    pub fn body(&self, data: Bytes) -> Option<CountedBody> {
        let len = data.len();
        if len <= UNCOUNTED_MAX_BYTES {
            return Some(self.uncounted(data));
        }
        let counted = {
            let mut held = self.held.load(Ordering::SeqCst);
            loop {
                if held + len > self.max {
                    return None;
                }
                match self.held.compare_exchange(
                    held,
                    held + len,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break len,
                    Err(now) => held = now,
                }
            }
        };
        Some(CountedBody {
            data,
            counted,
            held: self.held.clone(),
        })
    }
}

/// A response body that gives its bytes back to the budget when dropped: once written out, or
/// when its connection closes.
pub struct CountedBody {
    data: Bytes,
    counted: usize,
    held: Arc<AtomicUsize>,
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.held.fetch_sub(self.counted, Ordering::SeqCst);
    }
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.data.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.data.len().min(CHUNK_BYTES);
        Poll::Ready(Some(Ok(Frame::data(self.data.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(mut body: CountedBody) -> Vec<u8> {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut out = Vec::new();
        while let Poll::Ready(Some(Ok(f))) = Pin::new(&mut body).poll_frame(&mut cx) {
            let chunk = f.into_data().unwrap();
            assert!(chunk.len() <= CHUNK_BYTES);
            out.extend_from_slice(&chunk);
        }
        assert!(body.is_end_stream());
        out
    }

    #[test]
    fn responses_hold_their_bytes_until_dropped_and_none_past_the_budget() {
        let budget = ResponseBudget::new(1 << 20);
        let big = Bytes::from(vec![7u8; 600 << 10]);
        let first = budget.body(big.clone()).unwrap();
        assert_eq!(budget.held(), 600 << 10);
        assert!(!budget.nearly_spent());
        assert!(budget.body(big.clone()).is_none(), "past the budget");
        let nearly = budget.body(Bytes::from(vec![0u8; 350 << 10])).unwrap();
        assert!(budget.nearly_spent());
        drop(nearly);
        // Small answers pass while the budget is full.
        assert!(budget.body(Bytes::from_static(b"OK\n")).is_some());
        assert_eq!(drain(first), big.to_vec());
        assert_eq!(budget.held(), 0, "given back once written out");
        let second = budget.body(big).unwrap();
        drop(second); // its connection closed
        assert_eq!(budget.held(), 0);
    }
}
