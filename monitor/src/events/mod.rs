//! Internal events, as Vector's `internal_events`: every failure inside the agent is a struct
//! of its own (one family of them per file) that logs its fields and counts under its name. The
//! counts appear in every snapshot (`internal_events`) and on `/metrics`, so nothing fails
//! silently.
//!
//! Every occurrence is counted, but an event repeating with the same words is logged once per
//! [`REPEAT_QUIET`]: the first line, then, at the next occurrence after it, one line with how
//! many were left out. A source that fails every round (a GPU's sensor, a process the agent may
//! not read) writes a line every few minutes, not one a second.
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an event with the same detail stays out of the log after it was logged.
pub const REPEAT_QUIET: Duration = Duration::from_secs(300);
/// The distinct (event, detail) pairs remembered; past it the oldest half is forgotten (they
/// are then logged again when they recur).
const REPEATS_KEPT: usize = 1024;

macro_rules! event_kinds {
    ($($variant:ident => $name:literal, $level:ident;)*) => {
        /// What an internal event is counted as: its name, and the level it is logged at.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EventKind { $($variant,)* }

        impl EventKind {
            const ALL: &'static [EventKind] = &[$(EventKind::$variant,)*];

            /// The event's name in logs, snapshots and `/metrics`.
            pub fn name(self) -> &'static str {
                match self { $(EventKind::$variant => $name,)* }
            }

            pub fn level(self) -> tracing::Level {
                match self { $(EventKind::$variant => level!($level),)* }
            }
        }
    };
}

macro_rules! level {
    (debug) => {
        tracing::Level::DEBUG
    };
    (warn) => {
        tracing::Level::WARN
    };
    (error) => {
        tracing::Level::ERROR
    };
}

event_kinds! {
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
    CudaProbeLimit => "cuda_probe_limit", warn;
    NotificationFailed => "notification_failed", warn;
    NotificationDropped => "notification_dropped", warn;
    NotificationRateLimited => "notification_rate_limited", warn;
    SourceHung => "source_hung", error;
    CgroupLookalike => "cgroup_lookalike", warn;
    CriSpecUnreadable => "cri_spec_unreadable", warn;
}

/// One internal event: what it is counted as, the line a person reads, and its fields logged
/// as fields. Written with [`internal_event!`].
pub trait InternalEvent {
    const KIND: EventKind;
    /// The line a person reads; two occurrences with the same line are repeats.
    fn message(&self) -> String;
    /// Logs the event with its fields at its kind's level; `left_out` repeats since the last.
    fn log(&self, message: &str, left_out: u64);
}

/// A field or message as a log line shows it: tenants name the files, cgroups and processes
/// events speak of, with any bytes, so control characters are escaped
/// ([`crate::model::bounded::terminal`]): a name cannot recolour the operator's terminal or
/// start a forged line of its own.
pub struct Printable<'a, T: std::fmt::Display>(pub &'a T);

impl<T: std::fmt::Display> std::fmt::Display for Printable<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::model::bounded::terminal(&self.0.to_string()))
    }
}

/// Logs at a level chosen at run time, with the event's name, its fields and the repeats.
macro_rules! log_event {
    ($kind:expr, $message:expr, $left_out:expr, $($field:ident = $value:expr),*) => {{
        let (name, message, n) = (
            $kind.name(),
            $crate::model::bounded::terminal($message),
            $left_out,
        );
        macro_rules! at {
            ($lvl:ident) => {
                if n == 0 {
                    tracing::$lvl!(
                        event = name,
                        $($field = %$crate::events::Printable(&$value),)*
                        "{message}"
                    )
                } else {
                    tracing::$lvl!(
                        event = name,
                        $($field = %$crate::events::Printable(&$value),)*
                        repeated = n,
                        "{message} (and {n} more times since it was last logged)"
                    )
                }
            };
        }
        match $kind.level() {
            tracing::Level::ERROR => at!(error),
            tracing::Level::WARN => at!(warn),
            tracing::Level::INFO => at!(info),
            tracing::Level::DEBUG => at!(debug),
            _ => at!(trace),
        }
    }};
}

/// Declares an event struct: its fields (each logged as a field with its `Display`) and, from
/// them, its message.
macro_rules! internal_event {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$fmeta:meta])* $field:ident: $ty:ty),* $(,)? }
        |$this:ident| $message:expr
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl $crate::events::InternalEvent for $name {
            const KIND: $crate::events::EventKind = $crate::events::EventKind::$name;

            fn message(&self) -> String {
                let $this = self;
                $message
            }

            fn log(&self, message: &str, left_out: u64) {
                log_event!(Self::KIND, message, left_out, $($field = self.$field),*);
            }
        }
    };
}

mod engine;
mod host;
mod notify;
mod nvml;
mod probes;
mod watchdog;

pub use engine::{CriSpecUnreadable, DockerEventStreamLost, DockerRequestFailed};
pub use host::{CgroupLookalike, CgroupStatsFailed, GpuProcessVanished, ProcReadFailed};
pub use notify::{NotificationDropped, NotificationFailed, NotificationRateLimited};
pub use nvml::NvmlCallFailed;
pub use probes::{
    CudaProbeAttachFailed, CudaProbeLimit, ProbeFilterFull, ProbeIoAttachFailed, ProbeMapReadFailed,
};
pub use watchdog::SourceHung;

/// Counters of internal events by [`EventKind`], shared by all sources.
#[derive(Debug)]
pub struct EventCounters {
    counts: Vec<AtomicU64>,
    repeats: Mutex<Repeats>,
}

impl Default for EventCounters {
    fn default() -> Self {
        Self {
            counts: EventKind::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            repeats: Mutex::new(Repeats::default()),
        }
    }
}

/// When each (event, detail) was last logged, and how many of it were left out since.
#[derive(Debug, Default)]
struct Repeats {
    by_key: HashMap<(EventKind, u64), Repeat>,
}

#[derive(Debug)]
struct Repeat {
    logged_at: Instant,
    left_out: u64,
}

impl Repeats {
    /// Whether an occurrence at `now` is logged, and then how many were left out before it.
    fn log_now(&mut self, key: (EventKind, u64), now: Instant) -> Option<u64> {
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
    /// Counts `event` and logs it, unless the same message was logged within
    /// [`REPEAT_QUIET`].
    pub fn emit<E: InternalEvent>(&self, event: E) {
        self.add(E::KIND, 1);
        let message = event.message();
        let key = (E::KIND, hash_of(&message));
        let logged = self
            .repeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .log_now(key, Instant::now());
        if let Some(left_out) = logged {
            event.log(&message, left_out);
        }
    }

    /// Counts `n` occurrences without logging (for bulk counts already logged once).
    pub fn add(&self, event: EventKind, n: u64) {
        self.counts[event as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, event: EventKind) -> u64 {
        self.counts[event as usize].load(Ordering::Relaxed)
    }

    /// All counters by name, zeros included (a stable set of keys for consumers).
    pub fn to_map(&self) -> BTreeMap<&'static str, u64> {
        EventKind::ALL
            .iter()
            .map(|e| (e.name(), self.get(*e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log line of one event, through a subscriber that writes to a buffer.
    fn logged<E: InternalEvent>(event: E) -> String {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            EventCounters::default().emit(event);
        });
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_tenant_named_library_reaches_the_log_escaped_in_its_message_and_fields() {
        // A container maps a "driver library" named with OSC and clear-screen bytes.
        let line = logged(CudaProbeAttachFailed {
            library: "/opt/\x1b]0;owned\x07\x1b[2J\nFAKE LINE/libcuda.so.1".into(),
            error: "not a regular file".into(),
        });
        assert!(!line.contains('\x1b') && !line.contains('\x07'), "{line:?}");
        assert_eq!(line.trim_end().lines().count(), 1, "{line:?}");
        assert!(line.contains("\\u{1b}]0;owned"), "{line:?}");
    }

    #[test]
    fn an_event_logs_its_fields_as_fields_at_its_level() {
        let line = logged(NvmlCallFailed::on_gpu(3, "temperature", "Unknown Error"));
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains("GPU 3: temperature: Unknown Error"), "{line}");
        for field in [
            "event=\"nvml_call_failed\"",
            "target=GPU 3",
            "call=temperature",
            "error=Unknown Error",
        ] {
            assert!(line.contains(field), "{field} in {line}");
        }
        let line = logged(SourceHung {
            stall: "reading NVML for 12 s".into(),
        });
        assert!(
            line.contains("ERROR") && line.contains("stall=reading NVML"),
            "{line}"
        );
        let line = logged(ProbeFilterFull {
            unwatched: 4,
            capacity: 1024,
        });
        assert!(line.contains("unwatched=4 capacity=1024"), "{line}");
    }

    #[test]
    fn counts_by_name() {
        let c = EventCounters::default();
        c.emit(GpuProcessVanished {
            gpu: 0,
            error: "process 1 has exited".into(),
        });
        c.add(EventKind::GpuProcessVanished, 2);
        let m = c.to_map();
        assert_eq!(m["gpu_process_vanished"], 3);
        assert_eq!(m["nvml_call_failed"], 0);
        assert_eq!(m.len(), EventKind::ALL.len());
    }

    #[test]
    fn a_repeated_detail_is_logged_once_per_quiet_period_with_the_count_left_out() {
        let mut r = Repeats::default();
        let t0 = Instant::now();
        let key = (
            EventKind::NvmlCallFailed,
            hash_of("GPU 0: temperature: Unknown"),
        );
        let other = (
            EventKind::NvmlCallFailed,
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
            assert_eq!(r.log_now((EventKind::ProcReadFailed, i), at), Some(0));
        }
        assert!(r.by_key.len() <= REPEATS_KEPT, "{}", r.by_key.len());
    }

    #[test]
    fn every_occurrence_is_counted_whether_logged_or_not() {
        let c = EventCounters::default();
        for _ in 0..5 {
            c.emit(ProcReadFailed {
                subject: "pid 7".into(),
                error: "permission denied".into(),
            });
        }
        assert_eq!(c.get(EventKind::ProcReadFailed), 5);
    }
}
