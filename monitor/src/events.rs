//! Internal events: every failure inside the agent is a named event that both logs (tracing) and
//! counts. The counts appear in every snapshot (`internal_events`) so nothing fails silently.
use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

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

            fn log(self, detail: &dyn Display) {
                match self { $(InternalEvent::$variant => tracing::$level!(event = $name, "{detail}"),)* }
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
}

/// Counters of [`InternalEvent`]s, shared by all sources.
#[derive(Debug)]
pub struct EventCounters {
    counts: Vec<AtomicU64>,
}

impl Default for EventCounters {
    fn default() -> Self {
        Self {
            counts: InternalEvent::ALL
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }
}

impl EventCounters {
    /// Logs `event` with `detail` and counts it.
    pub fn emit(&self, event: InternalEvent, detail: impl Display) {
        event.log(&detail);
        self.add(event, 1);
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
}
