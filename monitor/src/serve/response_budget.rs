//! The bytes of all responses not yet written out, together and per source network, within a
//! budget: a response holds its share from the moment it is rendered until its last byte left
//! the agent, or its connection closed. Past the budget, or past its source's quarter of it, a
//! request is answered `503` with `Retry-After`, at no cost.
//!
//! The write guard closes a connection that stops reading within 30 s, but until then each
//! holds its whole response: 40 slow readers of a 33.5-MB response took the agent from 406 MB to
//! 1.6 GB, 68 to 1.87 GB, and reconnecting kept it there (issue 57). A source's quarter keeps
//! one client's slow readers from spending the budget of every other. Small answers (health,
//! errors) are not counted: they cannot add up to much within the connection limit, and a
//! health check must answer while slow readers hold the budget.
use super::source::Network;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
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
    held: Arc<Mutex<Held>>,
    max: usize,
}

/// The bytes held, in all and by source.
#[derive(Default)]
struct Held {
    all: usize,
    by_source: HashMap<Network, usize>,
}

impl ResponseBudget {
    pub fn new(max: usize) -> Self {
        Self {
            held: Arc::new(Mutex::new(Held::default())),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        lock(&self.held)
    }

    /// The most one source may hold.
    fn source_max(&self) -> usize {
        self.max / 4
    }

    /// The bytes held by responses not yet written out.
    pub fn held(&self) -> usize {
        self.lock().all
    }

    /// Whether less than an eighth of the budget, or of `source`'s quarter, is left: a request
    /// is then refused before its answer is rendered (rendering a large one costs more CPU than
    /// refusing it afterwards).
    pub fn nearly_spent(&self, source: &Network) -> bool {
        let held = self.lock();
        let of_source = held.by_source.get(source).copied().unwrap_or(0);
        held.all > self.max - self.max / 8 || of_source > self.source_max() - self.source_max() / 8
    }

    /// `data` as a response body not counted (a short answer).
    pub fn uncounted(&self, data: Bytes) -> CountedBody {
        CountedBody {
            data,
            counted: None,
            held: self.held.clone(),
        }
    }

    /// `data` as a response body to `source` holding its share of the budget until dropped;
    /// `None` when the budget, or the source's quarter, has no room for it.
    pub fn body(&self, data: Bytes, source: &Network) -> Option<CountedBody> {
        let len = data.len();
        if len <= UNCOUNTED_MAX_BYTES {
            return Some(self.uncounted(data));
        }
        {
            let mut held = self.lock();
            let of_source = held.by_source.get(source).copied().unwrap_or(0);
            if held.all + len > self.max || of_source + len > self.source_max() {
                return None;
            }
            held.all += len;
            *held.by_source.entry(source.clone()).or_default() += len;
        }
        Some(CountedBody {
            data,
            counted: Some((source.clone(), len)),
            held: self.held.clone(),
        })
    }
}

fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
    // The counts are whole between statements: go on with them after a panic elsewhere.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A response body that gives its bytes back to the budget when dropped: once written out, or
/// when its connection closes.
pub struct CountedBody {
    data: Bytes,
    counted: Option<(Network, usize)>,
    held: Arc<Mutex<Held>>,
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        let Some((source, len)) = self.counted.take() else {
            return;
        };
        let mut held = lock(&self.held);
        held.all -= len;
        if let Some(n) = held.by_source.get_mut(&source) {
            *n -= len;
            if *n == 0 {
                held.by_source.remove(&source);
            }
        }
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

    fn source(ip: &str) -> Network {
        Network::of(ip.parse().unwrap())
    }

    #[test]
    fn responses_hold_their_bytes_until_dropped_and_none_past_the_budget() {
        let budget = ResponseBudget::new(4 << 20);
        let local = source("127.0.0.1");
        let big = Bytes::from(vec![7u8; 600 << 10]);
        let first = budget.body(big.clone(), &local).unwrap();
        assert_eq!(budget.held(), 600 << 10);
        assert!(!budget.nearly_spent(&local));
        // A source's quarter: one megabyte.
        assert!(
            budget.body(big.clone(), &local).is_none(),
            "past its quarter"
        );
        let nearly = budget
            .body(Bytes::from(vec![0u8; 350 << 10]), &local)
            .unwrap();
        assert!(budget.nearly_spent(&local));
        assert!(!budget.nearly_spent(&source("192.0.2.7")), "another source");
        drop(nearly);
        // Small answers pass while the source's share is spent.
        assert!(budget.body(Bytes::from_static(b"OK\n"), &local).is_some());
        assert_eq!(drain(first), big.to_vec());
        assert_eq!(budget.held(), 0, "given back once written out");
        // The whole budget: four sources' quarters, and no fifth.
        let held: Vec<_> = (1..=6)
            .map_while(|i| {
                budget.body(
                    Bytes::from(vec![0u8; 1 << 20]),
                    &source(&format!("192.0.2.{i}")),
                )
            })
            .collect();
        assert_eq!(held.len(), 4);
        drop(held);
        assert_eq!(budget.held(), 0, "given back when the connections closed");
    }
}
