//! The open connections, counted against the limit, each known as waiting for a request's
//! headers or serving one. At the limit a newcomer is not refused while some connection is
//! still waiting for its headers: the one that has waited longest is closed instead. Whoever
//! holds every slot with half-sent requests then cannot keep a real scrape out; a `503` is
//! left for the rare moment when every connection is busy answering.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::Notify;

/// The open connections of one listener, at most `limit`.
pub struct Connections {
    limit: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    by_id: HashMap<u64, Entry>,
}

struct Entry {
    /// Since when it waits for a request's headers (its first, or the next on a kept-alive
    /// connection); `None` while a request is being answered.
    waiting_since: Option<Instant>,
    close: Arc<Notify>,
}

/// What became of a new connection.
pub enum Admission {
    /// Served; `evicted` tells whether a connection waiting for its headers was closed to
    /// make room.
    Admitted { slot: Slot, evicted: bool },
    /// Every connection is answering a request: refuse this one.
    Full,
}

/// One admitted connection's place; dropping it frees the place.
pub struct Slot {
    id: u64,
    close: Arc<Notify>,
    connections: Arc<Connections>,
}

impl Connections {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: Mutex::new(Open::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        // A panic while holding the lock leaves a map that is still whole: go on with it.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a new connection, waiting for its headers from `now`.
    pub fn admit(self: &Arc<Self>, now: Instant) -> Admission {
        let mut open = self.lock();
        let mut evicted = false;
        if open.by_id.len() >= self.limit {
            let oldest = open
                .by_id
                .iter()
                .filter_map(|(id, e)| e.waiting_since.map(|t| (t, *id)))
                .min();
            let Some((_, id)) = oldest else {
                return Admission::Full;
            };
            if let Some(e) = open.by_id.remove(&id) {
                e.close.notify_one();
                evicted = true;
            }
        }
        let id = open.next_id;
        open.next_id += 1;
        let close = Arc::new(Notify::new());
        open.by_id.insert(
            id,
            Entry {
                waiting_since: Some(now),
                close: close.clone(),
            },
        );
        Admission::Admitted {
            slot: Slot {
                id,
                close,
                connections: self.clone(),
            },
            evicted,
        }
    }

    /// Connections open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}

impl Slot {
    /// A request's headers arrived: it is being answered, and not to be closed for a newcomer.
    pub fn answering(&self) {
        if let Some(e) = self.connections.lock().by_id.get_mut(&self.id) {
            e.waiting_since = None;
        }
    }

    /// The answer is handed over: the connection waits for its next request from `now`.
    pub fn waiting(&self, now: Instant) {
        if let Some(e) = self.connections.lock().by_id.get_mut(&self.id) {
            e.waiting_since = Some(now);
        }
    }

    /// Resolves when the connection is to be closed for a newcomer.
    pub async fn evicted(&self) {
        self.close.notified().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.lock().by_id.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn admitted(a: Admission) -> (Slot, bool) {
        match a {
            Admission::Admitted { slot, evicted } => (slot, evicted),
            Admission::Full => panic!("refused"),
        }
    }

    #[test]
    fn at_the_limit_the_longest_waiting_connection_makes_room() {
        let c = Connections::new(3);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let (busy, _) = admitted(c.admit(at(0)));
        busy.answering();
        let (second, _) = admitted(c.admit(at(1)));
        let (third, _) = admitted(c.admit(at(2)));
        // `second` waits again from 5 s, after an answer: `third` has waited longer.
        second.answering();
        second.waiting(at(5));
        let (_fourth, evicted) = admitted(c.admit(at(6)));
        assert!(evicted);
        assert_eq!(c.len(), 3);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let told = |s: &Slot| {
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_millis(50), s.evicted())
                    .await
                    .is_ok()
            })
        };
        assert!(told(&third), "the longest waiting is closed");
        assert!(!told(&second) && !told(&busy), "the others stay");
        drop(third);
        assert_eq!(c.len(), 3, "its place went to the newcomer already");
    }

    #[test]
    fn when_every_connection_is_answering_a_newcomer_is_refused() {
        let c = Connections::new(2);
        let now = Instant::now();
        let (a, _) = admitted(c.admit(now));
        let (b, _) = admitted(c.admit(now));
        a.answering();
        b.answering();
        assert!(matches!(c.admit(now), Admission::Full));
        drop(a);
        let (_c, evicted) = admitted(c.admit(now));
        assert!(!evicted, "a free place: nobody closed");
        assert_eq!(c.len(), 2);
    }
}
