//! The loop of rounds: a round every interval until the duration is up or `stop` is set, each
//! completed snapshot to the caller in order, and at the end the rounds still held for the GPU
//! series, completed with what it has. Snapshots come out as the series covers them (every
//! `series_interval`), so several at a time.
use super::Agent;
use crate::model::Snapshot;
use std::sync::atomic::AtomicBool;
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

/// Runs rounds on `schedule`, handing each completed snapshot to `each`; ends early on the
/// first error `each` returns.
pub fn rounds<E>(
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
