//! Basic-auth checks that cannot take the agent (or the training job beside it) down, and
//! cannot lock out the right user:
//!
//! - bcrypt runs on blocking threads, never on the async workers that serve `/metrics`: at most
//!   [`bcrypt_at_once`] at a time (half the CPUs, 1 to 4), with at most [`QUEUE_PER_CHECK`]
//!   requests waiting per running check; past that a request is answered `429` at once.
//! - Failures are counted per user named in the header and per source network (all of
//!   loopback as one, an IPv6 /64 as one, an IPv4 address alone): a guesser cycling through
//!   127.x.y.z or an IPv6 prefix is one client, and failures for one user name do not touch
//!   another. After [`MAX_FAILURES`] within [`FAILURE_WINDOW`], that user from that network is
//!   checked once per [`SLOW_CHECK_EVERY`], [`SLOW_LANE_QUEUE`] request waiting at most (else
//!   `429`): a header that verifies still gets in at its turn, and a guesser keeps the rate
//!   of the lock, 10 a minute.
//! - Each source network has at most [`SOURCE_AT_ONCE`] checks running or waiting, whatever
//!   user names it sends: a guesser cycling through user names (each never locked) cannot fill
//!   the bcrypt queue, and the right user from another network is checked after at most a few
//!   checks (random user names from one address delayed a right user's first login ~16 s).
//! - A header verified before is let in without a check.
//!
//! A guesser on the same network naming the same user shares that user's lock: the right
//! password from there is let in at the lane's turn, not at once, as nothing but a check tells
//! the two apart.
use super::source::Network;
use super::web_config::BasicAuth;
use base64::Engine;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

pub const MAX_FAILURES: u32 = 10;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Requests that may wait per bcrypt check running.
pub const QUEUE_PER_CHECK: usize = 4;
/// Checks one source network may have running or waiting at once.
pub const SOURCE_AT_ONCE: usize = 2;
/// Requests of a locked user and network that may wait for its next check.
pub const SLOW_LANE_QUEUE: usize = 1;
/// A locked user and network is checked once per this long: a guesser keeps the rate the lock
/// allows ([`MAX_FAILURES`] per [`FAILURE_WINDOW`]), and a right header is let in at its turn.
pub const SLOW_CHECK_EVERY: Duration = Duration::from_secs(6);
/// Keys (user, network) remembered at most; past it the ones whose window is over are
/// forgotten.
const CLIENTS_KEPT: usize = 4096;
/// The most characters of a user name kept as a key.
const USER_MAX_CHARS: usize = 64;

/// bcrypt checks at once: each takes tens of milliseconds of one CPU, and the host's CPUs are
/// the training jobs'.
pub fn bcrypt_at_once() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / 2).clamp(1, 4)
}

#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Denied,
    /// Too many failures, or too many waiting: retry after this many seconds.
    TooMany(u64),
}

/// Failures are counted per (user named, network).
type Key = (String, Network);

/// The user an `Authorization: Basic` header names (empty when it names none).
fn user_of(header: &str) -> String {
    header
        .strip_prefix("Basic ")
        .and_then(|e| {
            base64::engine::general_purpose::STANDARD
                .decode(e.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|t| {
            t.split_once(':')
                .map(|(u, _)| u.chars().take(USER_MAX_CHARS).collect())
        })
        .unwrap_or_default()
}

pub struct LoginGate {
    auth: Arc<BasicAuth>,
    bcrypt: Arc<Semaphore>,
    /// Requests waiting for a bcrypt permit, and how many may.
    waiting: AtomicUsize,
    queue_max: usize,
    /// One check at a time per locked key, and how many of its requests wait for it.
    slow_lanes: Mutex<HashMap<Key, Arc<SlowLane>>>,
    /// [`SLOW_CHECK_EVERY`] (shorter in tests).
    slow_every: Duration,
    /// Checks running or waiting per source network.
    by_source: Arc<Mutex<HashMap<Network, usize>>>,
    failures: Mutex<Failures>,
}

impl LoginGate {
    pub fn new(auth: BasicAuth) -> Self {
        Self::with_checks(auth, bcrypt_at_once(), SLOW_CHECK_EVERY)
    }

    fn with_checks(auth: BasicAuth, at_once: usize, slow_every: Duration) -> Self {
        Self {
            auth: Arc::new(auth),
            bcrypt: Arc::new(Semaphore::new(at_once)),
            waiting: AtomicUsize::new(0),
            queue_max: at_once * QUEUE_PER_CHECK,
            slow_lanes: Mutex::new(HashMap::new()),
            slow_every,
            by_source: Arc::new(Mutex::new(HashMap::new())),
            failures: Mutex::new(Failures::default()),
        }
    }

    /// Whether the request from `peer` with this `Authorization` header gets in.
    pub async fn check(&self, peer: IpAddr, header: Option<String>) -> Decision {
        // No credentials is no guess: refused at no cost, and not counted against the client
        // (a scraper without them must not lock out one with them from the same address).
        let Some(h) = header.as_deref() else {
            return Decision::Denied;
        };
        if self.auth.remembers(h) {
            return Decision::Allowed;
        }
        let key: Key = (user_of(h), Network::of(peer));
        let locked = lock(&self.failures).blocked(&key, Instant::now());
        // A locked key is checked one request at a time, a few waiting.
        let _lane = match locked {
            None => None,
            Some(wait) => match self.slow_lane(&key).await {
                Some(permit) => Some(permit),
                None => return Decision::TooMany(wait.as_secs().max(1)),
            },
        };
        // The source's places bound its checks, not its turns waited in a lane.
        let Some(_source) = self.source_turn(&key.1) else {
            return Decision::TooMany(1);
        };
        let Some(allowed) = self.verify(header).await else {
            return Decision::TooMany(1);
        };
        let mut f = lock(&self.failures);
        if allowed {
            f.clear(&key);
            Decision::Allowed
        } else {
            f.add(key, Instant::now());
            Decision::Denied
        }
    }

    /// A place among the checks of `source`, or `None` when it has [`SOURCE_AT_ONCE`] already.
    fn source_turn(&self, source: &Network) -> Option<SourceTurn> {
        let mut by_source = lock(&self.by_source);
        let n = by_source.entry(source.clone()).or_insert(0);
        if *n >= SOURCE_AT_ONCE {
            return None;
        }
        *n += 1;
        Some(SourceTurn {
            source: source.clone(),
            by_source: self.by_source.clone(),
        })
    }

    /// The key's one check at a time, waited for when few wait; `None` when too many do. The
    /// turn counts as waiting until it is dropped, after its check.
    async fn slow_lane(&self, key: &Key) -> Option<LaneTurn> {
        let lane = {
            let mut lanes = lock(&self.slow_lanes);
            if lanes.len() >= CLIENTS_KEPT {
                lanes.retain(|_, l| Arc::strong_count(l) > 1);
            }
            lanes.entry(key.clone()).or_default().clone()
        };
        // The one checking and those waiting.
        if lane.waiting.fetch_add(1, Ordering::SeqCst) > SLOW_LANE_QUEUE {
            lane.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // From here the turn holds its place in `waiting`, whatever happens to the future.
        let mut turn = LaneTurn {
            lane: lane.clone(),
            permit: None,
        };
        turn.permit = lane.check.clone().acquire_owned().await.ok();
        let due = {
            let mut next = lock(&lane.next_check);
            let due = (*next).max(Instant::now());
            *next = due + self.slow_every;
            due
        };
        tokio::time::sleep_until(due.into()).await;
        turn.permit.is_some().then_some(turn)
    }

    /// bcrypt on a blocking thread, behind the bounded queue; `None` when the queue is full.
    async fn verify(&self, header: Option<String>) -> Option<bool> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue_max {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let permit = self.bcrypt.clone().acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let permit = permit.ok()?; // the semaphore is never closed
        let auth = self.auth.clone();
        Some(
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                auth.allows(header.as_deref())
            })
            .await
            .unwrap_or(false),
        )
    }
}

/// A request's place among its source network's checks, given up when dropped (answered, or
/// the client hung up).
struct SourceTurn {
    source: Network,
    by_source: Arc<Mutex<HashMap<Network, usize>>>,
}

impl Drop for SourceTurn {
    fn drop(&mut self) {
        let mut by_source = lock(&self.by_source);
        if let Some(n) = by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                by_source.remove(&self.source);
            }
        }
    }
}

/// A locked key's lane: one check at a time, once per [`SLOW_CHECK_EVERY`]; the requests in
/// it, waiting for their turn.
struct SlowLane {
    check: Arc<Semaphore>,
    waiting: AtomicUsize,
    next_check: Mutex<Instant>,
}

/// A request's turn in a locked key's lane: the lane's one check while it holds the permit.
/// It counts among the lane's waiting from the moment it queues until it is dropped, after the
/// check: the one checking and those waiting, as [`SLOW_LANE_QUEUE`] bounds them. (Counted only
/// until its turn came, a check whose turn was due at once left the count before its bcrypt,
/// and a third request got in line instead of a `429`.)
struct LaneTurn {
    lane: Arc<SlowLane>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for LaneTurn {
    fn drop(&mut self) {
        self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for SlowLane {
    fn default() -> Self {
        Self {
            check: Arc::new(Semaphore::new(1)),
            waiting: AtomicUsize::new(0),
            next_check: Mutex::new(Instant::now()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Failed attempts per key: (count, when the window began).
#[derive(Debug, Default)]
struct Failures(HashMap<Key, (u32, Instant)>);

impl Failures {
    /// How long `key` must wait, if it has used up its attempts.
    fn blocked(&self, key: &Key, now: Instant) -> Option<Duration> {
        let (count, since) = self.0.get(key)?;
        let left = FAILURE_WINDOW
            .checked_sub(now.duration_since(*since))
            .filter(|d| !d.is_zero())?;
        (*count >= MAX_FAILURES).then_some(left)
    }

    fn add(&mut self, key: Key, now: Instant) {
        if self.0.len() >= CLIENTS_KEPT {
            self.0
                .retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
        }
        let e = self.0.entry(key).or_insert((0, now));
        if now.duration_since(e.1) >= FAILURE_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }

    fn clear(&mut self, key: &Key) {
        self.0.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::collections::BTreeMap;

    fn header(user: &str, password: &str) -> Option<String> {
        let raw = format!("{user}:{password}");
        Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        ))
    }

    #[test]
    fn failures_block_a_client_for_the_rest_of_the_window() {
        let key = |ip: &str| -> Key { ("u".into(), Network::of(ip.parse().unwrap())) };
        let (a, b) = (key("10.0.0.1"), key("10.0.0.2"));
        let t0 = Instant::now();
        let mut f = Failures::default();
        for _ in 0..MAX_FAILURES - 1 {
            f.add(a.clone(), t0);
        }
        assert_eq!(f.blocked(&a, t0), None, "attempts left");
        f.add(a.clone(), t0);
        let wait = f.blocked(&a, t0 + Duration::from_secs(20)).unwrap();
        assert_eq!(wait, Duration::from_secs(40));
        assert_eq!(f.blocked(&b, t0), None, "another client is not blocked");
        assert_eq!(
            f.blocked(&a, t0 + FAILURE_WINDOW),
            None,
            "the window is over"
        );
        f.add(a.clone(), t0 + FAILURE_WINDOW);
        assert_eq!(
            f.blocked(&a, t0 + FAILURE_WINDOW),
            None,
            "a new window counts anew"
        );
    }

    fn gate(every: Duration) -> LoginGate {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new(BTreeMap::from([("alice".to_owned(), hash)])).unwrap();
        LoginGate::with_checks(auth, 1, every)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_user_is_read_from_the_header() {
        assert_eq!(user_of(header("alice", "x").as_deref().unwrap()), "alice");
        assert_eq!(user_of("Bearer abc"), "");
    }

    #[test]
    fn a_locked_user_still_gets_in_with_the_right_password_and_a_guesser_slows_down() {
        let gate = gate(Duration::from_millis(300));
        let rt = runtime();
        let scraper: IpAddr = "127.0.0.1".parse().unwrap();
        rt.block_on(async {
            for _ in 0..2 * MAX_FAILURES {
                assert_eq!(gate.check(scraper, None).await, Decision::Denied);
            }
            // Ten wrong passwords for alice, from other loopback addresses: one client.
            for i in 0..MAX_FAILURES {
                let peer: IpAddr = format!("127.0.{i}.9").parse().unwrap();
                assert_eq!(
                    gate.check(peer, header("alice", "guess")).await,
                    Decision::Denied
                );
            }
            // Another user from the same network is not locked.
            let t = Instant::now();
            assert_eq!(
                gate.check(scraper, header("bob", "guess")).await,
                Decision::Denied
            );
            assert!(t.elapsed() < Duration::from_millis(250), "bob waited");
            // Locked: checked at the lane's rate, one waiting, the rest 429.
            let t = Instant::now();
            let (a, b, c) = tokio::join!(
                gate.check(scraper, header("alice", "guess")),
                gate.check(scraper, header("alice", "guess")),
                gate.check(scraper, header("alice", "guess")),
            );
            let mut got = [a, b, c].map(|d| matches!(d, Decision::TooMany(_)));
            got.sort();
            assert_eq!(got, [false, false, true], "two checked, one refused");
            assert!(
                t.elapsed() >= Duration::from_millis(300),
                "the second waited its turn"
            );
            // The right password gets in, at its turn, and unlocks.
            assert_eq!(
                gate.check(scraper, header("alice", "s3cret")).await,
                Decision::Allowed
            );
        });
    }

    #[test]
    fn requests_dropped_while_they_wait_leave_the_lane() {
        // A client that hangs up while its request waits in a locked key's lane gives its
        // place up: else a few hang-ups would fill the lane and refuse the right password for
        // good.
        let gate = gate(Duration::from_millis(100));
        let rt = runtime();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        rt.block_on(async {
            for _ in 0..MAX_FAILURES {
                assert_eq!(
                    gate.check(peer, header("alice", "guess")).await,
                    Decision::Denied
                );
            }
            for _ in 0..3 * (SLOW_LANE_QUEUE + 1) {
                let hung_up = tokio::time::timeout(
                    Duration::from_millis(20),
                    gate.check(peer, header("alice", "guess")),
                );
                let _ = hung_up.await;
            }
            assert_eq!(
                gate.check(peer, header("alice", "s3cret")).await,
                Decision::Allowed
            );
        });
    }

    #[test]
    fn the_bcrypt_queue_is_bounded() {
        let gate = gate(Duration::from_millis(300));
        let rt = runtime();
        rt.block_on(async {
            // One check at a time and four waiting: of eight at once, some are refused.
            let peers: Vec<IpAddr> = (0..8)
                .map(|i| format!("192.0.2.{i}").parse().unwrap())
                .collect();
            let checks = peers
                .iter()
                .map(|p| gate.check(*p, header("alice", "guess")));
            let results = futures_join_all(checks).await;
            let refused = results
                .iter()
                .filter(|d| matches!(d, Decision::TooMany(_)))
                .count();
            assert!(refused >= 1, "{results:?}");
            assert!(results.iter().filter(|d| **d == Decision::Denied).count() >= 5);
        });
    }

    /// A guesser sending user names that never lock, many at once from one address, holds
    /// two checks at most: the right user from elsewhere is checked, not refused for a full
    /// queue (it got 429, or waited ~16 s behind the guesses, before sources were bounded).
    #[test]
    fn a_guesser_cycling_user_names_holds_two_checks_and_the_right_user_gets_in() {
        let gate = gate(Duration::from_millis(300));
        let rt = runtime();
        rt.block_on(async {
            let guesser: IpAddr = "192.0.2.66".parse().unwrap();
            let names: Vec<String> = (0..20).map(|i| format!("user{i}")).collect();
            let guesses = names
                .iter()
                .map(|u| gate.check(guesser, header(u, "guess")));
            let right = gate.check("198.51.100.7".parse().unwrap(), header("alice", "s3cret"));
            let (guessed, right) = tokio::join!(futures_join_all(guesses), right);
            assert_eq!(right, Decision::Allowed);
            let checked = guessed.iter().filter(|d| **d == Decision::Denied).count();
            assert_eq!(checked, SOURCE_AT_ONCE, "{guessed:?}");
            // Its places come back once answered.
            assert_eq!(
                gate.check(guesser, header("user0", "guess")).await,
                Decision::Denied
            );
        });
    }

    /// Runs the futures at once (what `futures::future::join_all` does).
    async fn futures_join_all<F: std::future::Future>(
        fs: impl Iterator<Item = F>,
    ) -> Vec<F::Output> {
        let mut set = Vec::new();
        for f in fs {
            set.push(Box::pin(f));
        }
        let mut out = Vec::new();
        // Poll them together: each is started before any is awaited to the end.
        let mut pending: Vec<_> = set.into_iter().map(Some).collect();
        std::future::poll_fn(|cx| {
            let mut all_done = true;
            for slot in pending.iter_mut() {
                if let Some(f) = slot {
                    match f.as_mut().poll(cx) {
                        std::task::Poll::Ready(v) => {
                            out.push(v);
                            *slot = None;
                        }
                        std::task::Poll::Pending => all_done = false,
                    }
                }
            }
            if all_done {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        out
    }
}
