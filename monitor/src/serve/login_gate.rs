//! Basic-auth checks that cannot take the agent (or the training job beside it) down: bcrypt
//! runs on blocking threads, at most [`BCRYPT_AT_ONCE`] at a time, never on the async workers
//! that serve `/metrics`; a client that fails [`MAX_FAILURES`] times within [`FAILURE_WINDOW`]
//! is answered `429` without a check until the window passes.
use super::web_config::BasicAuth;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// bcrypt checks running at once (each takes tens of milliseconds of one CPU).
pub const BCRYPT_AT_ONCE: usize = 2;
pub const MAX_FAILURES: u32 = 10;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Clients remembered at most; past it the ones whose window is over are forgotten.
const CLIENTS_KEPT: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Denied,
    /// Too many failures from this client: retry after this many seconds.
    TooMany(u64),
}

pub struct LoginGate {
    auth: Arc<BasicAuth>,
    bcrypt: Arc<Semaphore>,
    failures: Mutex<Failures>,
}

impl LoginGate {
    pub fn new(auth: BasicAuth) -> Self {
        Self {
            auth: Arc::new(auth),
            bcrypt: Arc::new(Semaphore::new(BCRYPT_AT_ONCE)),
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
        if let Some(wait) = self.lock().blocked(peer, Instant::now()) {
            return Decision::TooMany(wait.as_secs().max(1));
        }
        let allowed = match self.bcrypt.clone().acquire_owned().await {
            Ok(permit) => {
                let auth = self.auth.clone();
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    auth.allows(header.as_deref())
                })
                .await
                .unwrap_or(false)
            }
            Err(_) => false, // the semaphore is never closed
        };
        let mut f = self.lock();
        if allowed {
            f.clear(peer);
            Decision::Allowed
        } else {
            f.add(peer, Instant::now());
            Decision::Denied
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Failures> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Failed attempts per client: (count, when the window began).
#[derive(Debug, Default)]
struct Failures(HashMap<IpAddr, (u32, Instant)>);

impl Failures {
    /// How long `peer` must wait, if it has used up its attempts.
    fn blocked(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let (count, since) = self.0.get(&peer)?;
        let left = FAILURE_WINDOW
            .checked_sub(now.duration_since(*since))
            .filter(|d| !d.is_zero())?;
        (*count >= MAX_FAILURES).then_some(left)
    }

    fn add(&mut self, peer: IpAddr, now: Instant) {
        if self.0.len() >= CLIENTS_KEPT {
            self.0
                .retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
        }
        let e = self.0.entry(peer).or_insert((0, now));
        if now.duration_since(e.1) >= FAILURE_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }

    fn clear(&mut self, peer: IpAddr) {
        self.0.remove(&peer);
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
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        let mut f = Failures::default();
        for _ in 0..MAX_FAILURES - 1 {
            f.add(a, t0);
        }
        assert_eq!(f.blocked(a, t0), None, "attempts left");
        f.add(a, t0);
        let wait = f.blocked(a, t0 + Duration::from_secs(20)).unwrap();
        assert_eq!(wait, Duration::from_secs(40));
        assert_eq!(f.blocked(b, t0), None, "another client is not blocked");
        assert_eq!(
            f.blocked(a, t0 + FAILURE_WINDOW),
            None,
            "the window is over"
        );
        f.add(a, t0 + FAILURE_WINDOW);
        assert_eq!(
            f.blocked(a, t0 + FAILURE_WINDOW),
            None,
            "a new window counts anew"
        );
    }

    #[test]
    fn the_gate_checks_off_the_workers_and_stops_a_guesser() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new(BTreeMap::from([("alice".to_owned(), hash)])).unwrap();
        let gate = LoginGate::new(auth);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        rt.block_on(async {
            assert_eq!(
                gate.check(peer, header("alice", "s3cret")).await,
                Decision::Allowed
            );
            for _ in 0..2 * MAX_FAILURES {
                assert_eq!(gate.check(peer, None).await, Decision::Denied);
            }
            assert_eq!(
                gate.check(peer, header("bob", "guess")).await,
                Decision::Denied,
                "requests without credentials were not counted"
            );
            for _ in 0..MAX_FAILURES - 1 {
                assert_eq!(
                    gate.check(peer, header("alice", "guess")).await,
                    Decision::Denied
                );
            }
            assert!(matches!(
                gate.check(peer, header("alice", "guess")).await,
                Decision::TooMany(s) if s > 0 && s <= 60
            ));
            // A header verified before still gets in: the cap is on checks, not on users.
            assert_eq!(
                gate.check(peer, header("alice", "s3cret")).await,
                Decision::Allowed
            );
        });
    }
}
