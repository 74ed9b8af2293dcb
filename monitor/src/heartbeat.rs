//! Whether the sampling thread is making progress, for a watchdog on another thread.
//!
//! A source can hang: an NVML call that never returns (a wedged driver), a read of
//! `/proc/<pid>/…` behind a process stuck in the kernel. The sampling thread cannot notice
//! that itself. It marks when each round starts and ends, and which step it is in; the
//! watchdog and the HTTP health check read the marks and say which step has not returned, for
//! how long. Each mark also charges the sampling thread's CPU time since the last mark to the
//! step it leaves ([`Heartbeat::cpu`]): where the agent's own cost goes, as a counter a user can
//! rate on any host, profiler or not. Marking costs a `clock_gettime` and a few atomic stores;
//! nothing here blocks.
use crate::model::SamplingCpu;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The step a round is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Between rounds.
    Idle = 0,
    /// The round's own NVML calls.
    NvmlReadings = 1,
    /// The series fetch: NVML's utilisation series, GPM and the per-process split.
    NvmlSeries = 2,
    /// Listing and joining the workloads: the engine's cache, the cgroup tree, launch
    /// environments, container configurations.
    HostReadings = 3,
    /// Completing and judging the rounds the series covers.
    Publishing = 4,
    /// The GPU processes' `/proc` entries: attribution of new ones, state and CPU checks.
    ProcessReadings = 5,
    /// The workloads' cgroup counters: CPU, memory, pressure.
    CgroupReadings = 6,
    /// The stall and CUDA probes' maps.
    ProbeReadings = 7,
}

impl Step {
    /// The source a round stuck in this step waits on, as `gpuwatch_up` names it (`None`: the
    /// step reads several, or none).
    pub fn source(self) -> Option<&'static str> {
        match self {
            Step::NvmlReadings | Step::NvmlSeries => Some("nvml"),
            Step::Idle
            | Step::HostReadings
            | Step::Publishing
            | Step::ProcessReadings
            | Step::CgroupReadings
            | Step::ProbeReadings => None,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => Step::NvmlReadings,
            2 => Step::NvmlSeries,
            3 => Step::HostReadings,
            4 => Step::Publishing,
            5 => Step::ProcessReadings,
            6 => Step::CgroupReadings,
            7 => Step::ProbeReadings,
            _ => Step::Idle,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Idle => "idle",
            Step::NvmlReadings => "the GPU readings (NVML)",
            Step::NvmlSeries => "the GPU utilisation series and GPM (NVML)",
            Step::HostReadings => "listing the workloads",
            Step::Publishing => "publishing the rounds",
            Step::ProcessReadings => "the GPU processes' /proc readings",
            Step::CgroupReadings => "the cgroup readings",
            Step::ProbeReadings => "the probes' maps",
        })
    }
}

/// The sampling thread's marks. Times are milliseconds since the heartbeat was made, on the
/// monotonic clock (a wall-clock step cannot fake a stall or hide one).
#[derive(Debug)]
pub struct Heartbeat {
    origin: Instant,
    /// When the round in progress started (ms since `origin`, plus 1); 0 between rounds.
    round_started: AtomicU64,
    step: AtomicU8,
    /// When the current step started (ms since `origin`).
    step_started: AtomicU64,
    /// The marking thread's CPU time at the last mark, in nanoseconds.
    cpu_at_mark: AtomicU64,
    /// CPU nanoseconds charged to each step, by `Step as usize`.
    cpu_ns: [AtomicU64; STEPS],
}

const STEPS: usize = 8;

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            round_started: AtomicU64::new(0),
            step: AtomicU8::new(Step::Idle as u8),
            step_started: AtomicU64::new(0),
            cpu_at_mark: AtomicU64::new(0),
            cpu_ns: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The calling thread's CPU time, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec the call writes.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// A round that has not finished in time: the step it is in and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    pub step: Step,
    /// How long the round has been running.
    pub round_for: Duration,
    /// How long it has been in this step.
    pub step_for: Duration,
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a sampling round has been running for {:.0} s, {:.0} s of it in {}",
            self.round_for.as_secs_f64(),
            self.step_for.as_secs_f64(),
            self.step
        )
    }
}

impl Heartbeat {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// A round starts.
    pub fn round_begins(&self) {
        self.round_started
            .store(self.now_ms() + 1, Ordering::Relaxed);
        self.enter(Step::Idle);
    }

    /// The round moves to `step`. Call from the sampling thread: the CPU time it spent since
    /// the last mark is charged to the step it leaves.
    pub fn enter(&self, step: Step) {
        let now = thread_cpu_ns();
        let before = self.cpu_at_mark.swap(now, Ordering::Relaxed);
        let leaving = self.step.load(Ordering::Relaxed) as usize;
        // The first mark only sets the baseline (the thread's time before it is not the
        // sampler's).
        if before != 0 {
            self.cpu_ns[leaving.min(STEPS - 1)]
                .fetch_add(now.saturating_sub(before), Ordering::Relaxed);
        }
        self.step_started.store(self.now_ms(), Ordering::Relaxed);
        self.step.store(step as u8, Ordering::Relaxed);
    }

    /// The sampling thread's CPU time so far, by step (up to the last mark).
    pub fn cpu(&self) -> SamplingCpu {
        let s = |step: Step| self.cpu_ns[step as usize].load(Ordering::Relaxed) as f64 / 1e9;
        SamplingCpu {
            nvml_readings: s(Step::NvmlReadings),
            nvml_series: s(Step::NvmlSeries),
            host_readings: s(Step::HostReadings),
            process_readings: s(Step::ProcessReadings),
            cgroup_readings: s(Step::CgroupReadings),
            probe_readings: s(Step::ProbeReadings),
            publishing: s(Step::Publishing),
            other: s(Step::Idle),
        }
    }

    /// The round is over.
    pub fn round_ends(&self) {
        self.round_started.store(0, Ordering::Relaxed);
        self.enter(Step::Idle);
    }

    /// How long the round in progress has run, and in which step; `None` between rounds.
    pub fn running(&self) -> Option<Stall> {
        let started = self.round_started.load(Ordering::Relaxed);
        if started == 0 {
            return None;
        }
        let now = self.now_ms();
        let step_started = self.step_started.load(Ordering::Relaxed);
        Some(Stall {
            step: Step::from_u8(self.step.load(Ordering::Relaxed)),
            round_for: Duration::from_millis(now.saturating_sub(started - 1)),
            step_for: Duration::from_millis(now.saturating_sub(step_started)),
        })
    }

    /// The round in progress, if it has run longer than `limit`.
    pub fn stalled(&self, limit: Duration) -> Option<Stall> {
        self.running().filter(|s| s.round_for > limit)
    }
}

/// How long a round may run before it counts as hung: a round costs milliseconds (the series
/// fetch ~3 ms on an H200; `flush` waits at most a sample period), so anything near this is a
/// source that does not answer.
pub fn stall_limit(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_is_stalled_only_past_the_limit_and_says_where() {
        let h = Heartbeat::default();
        assert_eq!(h.running(), None, "between rounds");
        h.round_begins();
        h.enter(Step::NvmlSeries);
        let r = h.running().unwrap();
        assert_eq!(r.step, Step::NvmlSeries);
        assert!(h.stalled(Duration::from_secs(5)).is_none());
        std::thread::sleep(Duration::from_millis(30));
        let s = h.stalled(Duration::from_millis(10)).unwrap();
        assert!(s.round_for >= Duration::from_millis(30), "{s:?}");
        let text = s.to_string();
        assert!(text.contains("utilisation series"), "{text}");
        h.round_ends();
        assert_eq!(h.stalled(Duration::ZERO), None);
    }

    #[test]
    fn the_threads_cpu_time_is_charged_to_the_step_it_was_spent_in() {
        let spin = |ms: u64| {
            let start = thread_cpu_ns();
            while thread_cpu_ns() - start < ms * 1_000_000 {
                std::hint::black_box(start);
            }
        };
        let h = Heartbeat::default();
        spin(20); // before the first mark: not the sampler's
        h.round_begins();
        h.enter(Step::NvmlSeries);
        spin(60);
        h.enter(Step::HostReadings);
        spin(20);
        h.enter(Step::CgroupReadings);
        spin(40);
        h.round_ends();
        // Waiting between rounds costs nothing.
        std::thread::sleep(Duration::from_millis(50));
        let cpu = h.cpu();
        assert!((0.060..0.075).contains(&cpu.nvml_series), "{cpu:?}");
        assert!((0.020..0.030).contains(&cpu.host_readings), "{cpu:?}");
        assert!((0.040..0.050).contains(&cpu.cgroup_readings), "{cpu:?}");
        assert!(cpu.other < 0.005 && cpu.nvml_readings == 0.0, "{cpu:?}");
        assert!(
            cpu.process_readings == 0.0 && cpu.probe_readings == 0.0,
            "{cpu:?}"
        );
    }

    /// The step a watchdog reads back is the one entered, for every step.
    #[test]
    fn every_step_reads_back_as_the_one_entered() {
        let h = Heartbeat::default();
        h.round_begins();
        for step in [
            Step::NvmlReadings,
            Step::NvmlSeries,
            Step::HostReadings,
            Step::Publishing,
            Step::ProcessReadings,
            Step::CgroupReadings,
            Step::ProbeReadings,
        ] {
            h.enter(step);
            assert_eq!(h.running().map(|r| r.step), Some(step));
        }
    }

    #[test]
    fn the_limit_is_ten_seconds_or_three_intervals() {
        assert_eq!(stall_limit(Duration::from_secs(1)), Duration::from_secs(10));
        assert_eq!(stall_limit(Duration::from_secs(5)), Duration::from_secs(15));
    }
}
