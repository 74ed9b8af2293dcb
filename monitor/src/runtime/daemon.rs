//! The continuous loop of `watch` and `serve`: a round every interval, the alert rules on each
//! completed snapshot (the first included: a lost GPU fires at once), every transition to the
//! notifier, and the snapshot handed to the caller (to print, or to publish). Snapshots come
//! out as their GPU series arrives (every `series_interval`), several at a time, in order; the
//! rules go by each snapshot's own time. It ends on `stop`, at `duration`, or on the caller's
//! error; the notifier then gets a few seconds to drain.
use super::{rounds, Agent, Schedule};
use crate::config::Config;
use crate::events::NotificationRateLimited;
use crate::health::alerts::{AlertEngine, Transitions};
use crate::model::Snapshot;
use crate::notify::Notifier;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// How long queued notifications may take to go out at the end.
const NOTIFY_DRAIN: Duration = Duration::from_secs(5);

pub fn run_rounds<E>(
    agent: &mut Agent,
    config: &Config,
    interval: Duration,
    duration: Option<Duration>,
    stop: &AtomicBool,
    mut each: impl FnMut(Snapshot, &Transitions, &AlertEngine) -> Result<(), E>,
) -> Result<(), E> {
    let events = agent.events.clone();
    // Started at the first snapshot, which names the host the notifications come from.
    let mut notifier: Option<Notifier> = None;
    let mut engine = AlertEngine::new(&config.alerts);
    // One completed snapshot: the rules, the notifications, then the caller.
    let handle = |snap: Snapshot| -> Result<(), E> {
        let notifier = notifier.get_or_insert_with(|| {
            Notifier::start(&config.notify, &snap.host.hostname, events.clone())
        });
        let round = engine.evaluate(&snap);
        for a in &round.notify {
            notifier.send(a);
        }
        for a in &round.rate_limited {
            events.emit(NotificationRateLimited {
                alert: a.key.to_string(),
                state: format!("{:?}", a.state),
            });
        }
        // The snapshot is the caller's now (to print, or to publish without a copy).
        each(snap, &round, &engine)
    };
    let schedule = Schedule {
        interval,
        duration,
        first_round_out: true,
    };
    let result = rounds(agent, schedule, stop, handle);
    if let Some(n) = notifier {
        n.shutdown(NOTIFY_DRAIN);
    }
    result
}
