//! The loop of rounds: a round every interval until the duration is up or `stop` is set, each
//! completed snapshot to the caller in order, and at the end the rounds still held for the GPU
//! series, completed with what it has. Snapshots come out as the series covers them (every
//! `series_interval`), so several at a time.
//!
//! A watchdog thread beside the loop notices a round that does not end (a source that hangs:
//! see [`crate::heartbeat`]): it logs and counts `source_hung` naming the step, and once a stop
//! was asked for and the round still has not returned after [`SHUTDOWN_GRACE`], it ends the
//! process rather than wait for the source forever.
use super::Agent;
use crate::events::{EventCounters, SourceHung};
use crate::heartbeat::{stall_limit, Heartbeat};
use crate::model::Snapshot;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// When rounds are taken.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub interval: Duration,
    /// Stop after this long (the last round's snapshots, and the held ones, still go out).
    pub duration: Option<Duration>,
    /// Whether the first round goes to the caller, or is only the baseline the next round's
    /// rates and windows start from.
    pub first_round_out: bool,
}

/// How long a stop waits for a round that is stuck in a source before the process ends anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// The exit status when the process ends without its round (1 stays "the command failed").
pub const EXIT_SOURCE_HUNG: i32 = 3;

/// Runs rounds on `schedule`, handing each completed snapshot to `each`; ends early on the
/// first error `each` returns.
pub fn rounds<E>(
    agent: &mut Agent,
    schedule: Schedule,
    stop: &AtomicBool,
    each: impl FnMut(Snapshot) -> Result<(), E>,
) -> Result<(), E> {
    let heartbeat = agent.sampler.heartbeat();
    let events = agent.events.clone();
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watchdog = std::thread::Builder::new()
            .name("gpuwatch-watchdog".to_owned())
            .spawn_scoped(scope, || {
                let limit = stall_limit(schedule.interval);
                watchdog(&heartbeat, limit, stop, &finished, &events);
            })
            .ok();
        let result = run(agent, schedule, stop, each);
        finished.store(true, Ordering::Relaxed);
        if let Some(w) = watchdog {
            w.thread().unpark(); // ends it now, not at its next look
        }
        result
    })
}

fn run<E>(
    agent: &mut Agent,
    schedule: Schedule,
    stop: &AtomicBool,
    mut each: impl FnMut(Snapshot) -> Result<(), E>,
) -> Result<(), E> {
    let started = Instant::now();
    let first = agent.round();
    if schedule.first_round_out {
        first.into_iter().try_for_each(&mut each)?;
    }
    let mut next = started + schedule.interval;
    loop {
        let done = schedule.duration.is_some_and(|d| started.elapsed() >= d);
        if done || !agent.wait_until(next, stop) {
            break;
        }
        agent.round().into_iter().try_for_each(&mut each)?;
        next += schedule.interval;
    }
    agent.flush().into_iter().try_for_each(&mut each)
}

/// Looks at the round in progress once a second (a wake-up costs the agent CPU; the limits are
/// seconds) until the loop is `finished`.
fn watchdog(
    heartbeat: &Heartbeat,
    limit: Duration,
    stop: &AtomicBool,
    finished: &AtomicBool,
    events: &EventCounters,
) {
    let mut reported = false;
    let mut stop_asked: Option<Instant> = None;
    while !finished.load(Ordering::Relaxed) {
        std::thread::park_timeout(Duration::from_secs(1));
        match heartbeat.stalled(limit) {
            Some(stall) if !reported => {
                events.emit(SourceHung {
                    stall: stall.to_string(),
                });
                reported = true;
            }
            None if reported => {
                tracing::info!("the sampling round returned: the sources answer again");
                reported = false;
            }
            _ => {}
        }
        if !stop.load(Ordering::Relaxed) {
            continue;
        }
        let asked = *stop_asked.get_or_insert_with(Instant::now);
        let stuck = heartbeat.running().filter(|r| r.round_for > SHUTDOWN_GRACE);
        if let (true, Some(r)) = (asked.elapsed() > SHUTDOWN_GRACE, stuck) {
            tracing::error!("stopping without the sampling round's results: {r}");
            std::process::exit(EXIT_SOURCE_HUNG);
        }
    }
}
