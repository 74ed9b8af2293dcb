//! Internal events: every failure inside the agent is a named event that both logs (tracing) and
//! counts. The counts appear in every snapshot (`internal_events`) so nothing fails silently.
//!
//! Every occurrence is counted, but an event repeating with the same detail is logged once per
//! [`REPEAT_QUIET`]: the first line, then, at the next occurrence after it, one line with how
//! many were left out. A source that fails every round (a GPU's sensor, a process the agent may
//! not read) writes a line every few minutes, not one a second.
use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an event with the same detail stays out of the log after it was logged.
pub const REPEAT_QUIET: Duration = Duration::from_secs(300);
/// The distinct (event, detail) pairs remembered; past it the oldest half is forgotten (they
/// are then logged again when they recur).
const REPEATS_KEPT: usize = 1024;

macro_rules! internal_events {
    ($($variant:ident => $name:literal, $level:ident;)*) => {
        /// A named internal event.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum InternalEvent { $($variant,)* }

        impl InternalEvent {
            const ALL: &'static [InternalEvent] = &[$(InternalEvent::$variant,)*];

            /// The event's name in logs and snapshots.
            pub fn name(self) -> &'static str {
                match self { $(InternalEvent::$variant => $name,)* }
            }

            fn log(self, detail: &str, left_out: u64) {
                match (self, left_out) {
                    $(
                        (InternalEvent::$variant, 0) => tracing::$level!(event = $name, "{detail}"),
                        (InternalEvent::$variant, n) => tracing::$level!(
                            event = $name,
                            repeated = n,
                            "{detail} (and {n} more times since it was last logged)"
                        ),
                    )*
                }
            }
        }
    };
}

internal_events! {
    NvmlCallFailed => "nvml_call_failed", warn;
    GpuProcessVanished => "gpu_process_vanished", debug;
    ProcReadFailed => "proc_read_failed", warn;
    CgroupStatsFailed => "cgroup_stats_failed", debug;
    DockerRequestFailed => "docker_request_failed", warn;
    DockerEventStreamLost => "docker_event_stream_lost", warn;
    ProbeMapReadFailed => "probe_map_read_failed", warn;
    ProbeEntriesEvicted => "probe_entries_evicted", warn;
    ProbeFilterFull => "probe_filter_full", warn;
    ProbeIoAttachFailed => "probe_io_attach_failed", warn;
    CudaProbeAttachFailed => "cuda_probe_attach_failed", warn;
    NotificationFailed => "notification_failed", warn;
    NotificationDropped => "notification_dropped", warn;
    NotificationRateLimited => "notification_rate_limited", warn;
    SourceHung => "source_hung", error;
    CgroupLookalike => "cgroup_lookalike", warn;
    CriSpecUnreadable => "cri_spec_unreadable", warn;
}

/// Counters of [`InternalEvent`]s, shared by all sources.
#[derive(Debug)]
pub struct EventCounters {
    counts: Vec<AtomicU64>,
    repeats: Mutex<Repeats>,
}

impl Default for EventCounters {
    fn default() -> Self {
        Self {
            counts: InternalEvent::ALL
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
            repeats: Mutex::new(Repeats::default()),
        }
    }
}

/// When each (event, detail) was last logged, and how many of it were left out since.
#[derive(Debug, Default)]
struct Repeats {
    by_key: HashMap<(InternalEvent, u64), Repeat>,
}

#[derive(Debug)]
struct Repeat {
    logged_at: Instant,
    left_out: u64,
}

impl Repeats {
    /// Whether an occurrence at `now` is logged, and then how many were left out before it.
    fn log_now(&mut self, key: (InternalEvent, u64), now: Instant) -> Option<u64> {
        if let Some(r) = self.by_key.get_mut(&key) {
            if now.saturating_duration_since(r.logged_at) < REPEAT_QUIET {
                r.left_out += 1;
                return None;
            }
            let left_out = r.left_out;
            *r = Repeat {
                logged_at: now,
                left_out: 0,
            };
            return Some(left_out);
        }
        if self.by_key.len() >= REPEATS_KEPT {
            let mut times: Vec<Instant> = self.by_key.values().map(|r| r.logged_at).collect();
            times.sort_unstable();
            let cut = times[times.len() / 2];
            self.by_key.retain(|_, r| r.logged_at > cut);
        }
        self.by_key.insert(
            key,
            Repeat {
                logged_at: now,
                left_out: 0,
            },
        );
        Some(0)
    }
}

fn hash_of(detail: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    detail.hash(&mut h);
    h.finish()
}

impl EventCounters {
    /// Counts `event` and logs it with `detail`, unless the same detail was logged within
    /// [`REPEAT_QUIET`].
    pub fn emit(&self, event: InternalEvent, detail: impl Display) {
        self.add(event, 1);
        let detail = detail.to_string();
        let key = (event, hash_of(&detail));
        let logged = self
            .repeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .log_now(key, Instant::now());
        if let Some(left_out) = logged {
            event.log(&detail, left_out);
        }
    }

    /// Counts `n` occurrences without logging (for bulk counts already logged once).
    pub fn add(&self, event: InternalEvent, n: u64) {
        self.counts[event as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, event: InternalEvent) -> u64 {
        self.counts[event as usize].load(Ordering::Relaxed)
    }

    /// All counters by name, zeros included (a stable set of keys for consumers).
    pub fn to_map(&self) -> BTreeMap<&'static str, u64> {
        InternalEvent::ALL
            .iter()
            .map(|e| (e.name(), self.get(*e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_name() {
        let c = EventCounters::default();
        c.emit(InternalEvent::GpuProcessVanished, "pid 1");
        c.add(InternalEvent::GpuProcessVanished, 2);
        let m = c.to_map();
        assert_eq!(m["gpu_process_vanished"], 3);
        assert_eq!(m["nvml_call_failed"], 0);
        assert_eq!(m.len(), InternalEvent::ALL.len());
    }

    #[test]
    fn a_repeated_detail_is_logged_once_per_quiet_period_with_the_count_left_out() {
        let mut r = Repeats::default();
        let t0 = Instant::now();
        let key = (
            InternalEvent::NvmlCallFailed,
            hash_of("GPU 0: temperature: Unknown"),
        );
        let other = (
            InternalEvent::NvmlCallFailed,
            hash_of("GPU 1: temperature: Unknown"),
        );
        assert_eq!(r.log_now(key, t0), Some(0));
        for s in 1..=299 {
            assert_eq!(r.log_now(key, t0 + Duration::from_secs(s)), None, "{s} s");
        }
        assert_eq!(r.log_now(other, t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(r.log_now(key, t0 + REPEAT_QUIET), Some(299));
        assert_eq!(
            r.log_now(key, t0 + REPEAT_QUIET + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn the_details_remembered_are_bounded() {
        let mut r = Repeats::default();
        let t0 = Instant::now();
        for i in 0..(REPEATS_KEPT as u64 * 3) {
            let at = t0 + Duration::from_millis(i);
            assert_eq!(r.log_now((InternalEvent::ProcReadFailed, i), at), Some(0));
        }
        assert!(r.by_key.len() <= REPEATS_KEPT, "{}", r.by_key.len());
    }

    #[test]
    fn every_occurrence_is_counted_whether_logged_or_not() {
        let c = EventCounters::default();
        for _ in 0..5 {
            c.emit(InternalEvent::ProcReadFailed, "pid 7: permission denied");
        }
        assert_eq!(c.get(InternalEvent::ProcReadFailed), 5);
    }
}
