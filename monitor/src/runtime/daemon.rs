//! The continuous loop of `watch` and `serve`: a round every interval, the alert rules on each
//! completed snapshot (the first included: a lost GPU fires at once), every transition to the
//! notifier, and the snapshot handed to the caller (to print, or to publish). Snapshots come
//! out as their GPU series arrives (every `series_interval`), several at a time, in order; the
//! rules go by each snapshot's own time. It ends on `stop`, at `duration`, or on the caller's
//! error; the notifier then gets a few seconds to drain.
use crate::agent::Agent;
use crate::config::Config;
use crate::events::InternalEvent;
use crate::health::alerts::{AlertEngine, RoundOutcome};
use crate::model::Snapshot;
use crate::notify::Notifier;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// How long queued notifications may take to go out at the end.
const NOTIFY_DRAIN: Duration = Duration::from_secs(5);

pub fn run_rounds<E>(
    agent: &mut Agent,
    config: &Config,
    interval: Duration,
    duration: Option<Duration>,
    stop: &AtomicBool,
    mut each: impl FnMut(Snapshot, &RoundOutcome, &AlertEngine) -> Result<(), E>,
) -> Result<(), E> {
    let started = Instant::now();
    let mut snaps = agent.round();
    let hostname = snaps
        .first()
        .map_or_else(String::new, |s| s.host.hostname.clone());
    let events = agent.events.clone();
    let notifier = Notifier::start(&config.notify, &hostname, events.clone());
    let mut engine = AlertEngine::new(&config.alerts);
    // One completed snapshot: the rules, the notifications, then the caller.
    let mut handle = |snap: Snapshot| -> Result<(), E> {
        let round = engine.evaluate(&snap);
        for a in &round.notify {
            notifier.send(a);
        }
        for a in &round.rate_limited {
            events.emit(
                InternalEvent::NotificationRateLimited,
                format_args!("{} {:?} held back by the rate limit", a.key, a.state),
            );
        }
        // The snapshot is the caller's now (to print, or to publish without a copy).
        each(snap, &round, &engine)
    };
    let mut next = started + interval;
    let result = loop {
        if let Err(e) = snaps.into_iter().try_for_each(&mut handle) {
            break Err(e);
        }
        if duration.is_some_and(|d| started.elapsed() >= d) || !agent.wait_until(next, stop) {
            // The rounds still waiting for their GPU series go through the rules too.
            break agent.flush().into_iter().try_for_each(&mut handle);
        }
        next += interval;
        snaps = agent.round();
    };
    notifier.shutdown(NOTIFY_DRAIN);
    result
}
