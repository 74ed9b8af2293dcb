//! The stall probe's side of a round: points the kernel filter at the round's cgroups, reads
//! the cumulative per-task counters, and turns this round's minus the previous round's into
//! each cgroup's [`StallWindow`].
use super::io_tracing::{IoDemand, IoTracingConfig, IoTracingMode};
use crate::events::{EventCounters, InternalEvent};
use crate::model::{
    IoSummary, IoTracing, IoTracingState, ProbeHealth, ProcessRole, ProcessStall, SourceState,
    StallWindow, ThreadTimes,
};
use crate::sources::stall_probe::{Accumulate, ProbeTotals, StallProbe};
use monitor_common::{probe_stat, task_thread, IoStats, TaskKey, TaskTimes, LATENCY_BUCKETS};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

pub struct Stalls {
    probe: Result<StallProbe, String>,
    /// When the read and block programs are wanted.
    demand: IoDemand,
    on_since_unix_ms: Option<u64>,
    /// Where they stood at the last counter read, and whether they were on for its whole
    /// window (so its read and disk figures are complete).
    io_at_read: IoTracing,
    window_traced: bool,
    /// The counters of this round and of the previous one (swapped each round).
    totals: ProbeTotals,
    previous: Option<ProbeTotals>,
    /// The kernel side's failure counters as last read.
    failures: [u64; probe_stat::COUNT as usize],
}

impl Stalls {
    pub fn load(enabled: bool, io: IoTracingConfig) -> Self {
        let probe = if enabled {
            match io.mode {
                IoTracingMode::Always => StallProbe::load(true),
                _ => StallProbe::load_io_detached(true),
            }
            .map_err(|e| format!("stall tracing unavailable: {e}"))
        } else {
            Err("stall tracing disabled".to_owned())
        };
        if let (true, Err(e)) = (enabled, &probe) {
            tracing::warn!("{e}");
        }
        let io_at_read = probe.as_ref().map_or(IoTracing::Off, |p| p.io_state());
        Self {
            probe,
            demand: IoDemand::new(io),
            on_since_unix_ms: None,
            io_at_read,
            window_traced: false,
            totals: ProbeTotals::default(),
            previous: None,
            failures: [0; probe_stat::COUNT as usize],
        }
    }

    pub fn source_state(&self) -> SourceState {
        match &self.probe {
            Ok(p) if p.missing.is_empty() => SourceState::up(),
            Ok(p) => SourceState {
                up: true,
                detail: Some(format!(
                    "not traced on this kernel: {}",
                    p.missing.join("; ")
                )),
            },
            Err(e) => SourceState::down(e.clone()),
        }
    }

    pub fn health(&self) -> Option<ProbeHealth> {
        self.probe.as_ref().ok().map(|p| ProbeHealth {
            missing: p.missing.clone(),
            map_update_failed: self.failures[probe_stat::MAP_UPDATE_FAILED as usize],
            field_read_failed: self.failures[probe_stat::FIELD_READ_FAILED as usize],
            unmatched_end: self.failures[probe_stat::UNMATCHED_END as usize],
            io_tracing: IoTracingState {
                mode: self.demand.mode().as_str(),
                state: p.io_state(),
                on_since_unix_ms: self.on_since_unix_ms,
                reason: self.demand.reason.clone(),
            },
        })
    }

    /// Looks at a published round for a workload that needs the read evidence.
    pub fn observe(&mut self, snap: &crate::model::Snapshot) {
        self.demand.observe(snap, Instant::now());
    }

    /// Moves the read and block programs one step toward what is wanted now.
    pub fn step_io(&mut self, now_unix_ms: u64, events: &EventCounters) {
        let wanted = self.demand.wanted(Instant::now());
        let Ok(probe) = self.probe.as_mut() else {
            return;
        };
        let before = probe.io_state();
        match probe.step_io(wanted) {
            Ok(IoTracing::On) if before != IoTracing::On => {
                self.on_since_unix_ms = Some(now_unix_ms);
                tracing::info!(reason = ?self.demand.reason, "read tracing on");
            }
            Ok(IoTracing::Off) if before != IoTracing::Off => {
                tracing::info!("read tracing off: no workload needed it");
            }
            Ok(_) => {}
            Err(e) => events.emit(InternalEvent::ProbeIoAttachFailed, &e),
        }
    }

    /// Points the kernel filter at `cgroups` and reads the counters. False when there is no
    /// probe or the read failed (the round then has no stall windows).
    pub fn read(&mut self, cgroups: &HashSet<u64>, events: &EventCounters) -> bool {
        let Ok(probe) = self.probe.as_mut() else {
            return false;
        };
        if let Err(e) = probe.watch(cgroups) {
            events.emit(InternalEvent::ProbeMapReadFailed, &e);
        }
        let io = probe.io_state();
        self.window_traced = self.io_at_read == IoTracing::On && io == IoTracing::On;
        // Detached at the last read and since: that read holds the maps' final counts.
        let io_unchanged = self.io_at_read == IoTracing::Off && io == IoTracing::Off;
        let previous = self.previous.as_ref().filter(|_| io_unchanged);
        self.io_at_read = io;
        match probe.read(&mut self.totals, previous.is_none()) {
            Ok(()) => {
                if let Some(p) = previous {
                    self.totals.reads.clone_from(&p.reads);
                    self.totals.disk.clone_from(&p.disk);
                }
                self.failures = self.totals.failures;
                let evicted = self.totals.evicted_during_read;
                if evicted > 0 {
                    events.add(InternalEvent::ProbeEntriesEvicted, evicted);
                }
                true
            }
            Err(e) => {
                events.emit(InternalEvent::ProbeMapReadFailed, &e);
                false
            }
        }
    }

    /// Ends a round that read the counters: drops the tasks that exited and did not move since
    /// (their last window is counted), and keeps this round's counters as the next baseline.
    pub fn end_round(&mut self, proc_root: &Path) {
        self.forget_exited_tasks(proc_root);
        let current = std::mem::take(&mut self.totals);
        self.totals = self.previous.take().unwrap_or_default();
        self.previous = Some(current);
    }

    fn forget_exited_tasks(&mut self, proc_root: &Path) {
        let (Ok(probe), Some(previous)) = (self.probe.as_mut(), self.previous.as_ref()) else {
            return;
        };
        let gone: Vec<TaskKey> = self
            .totals
            .times
            .iter()
            .filter(|(k, now)| {
                previous.times.get(k) == Some(now) && !proc_root.join(k.tgid.to_string()).exists()
            })
            .map(|(k, _)| *k)
            .collect();
        if gone.is_empty() {
            return;
        }
        probe.forget(&gone);
        for k in &gone {
            self.totals.times.remove(k);
            self.totals.reads.remove(k);
            self.totals.disk.remove(k);
        }
    }

    /// One cgroup's window: this round's counters minus the previous round's, per process (its
    /// main thread apart too). `None` until there is a previous round.
    pub fn window(
        &self,
        cgroup_id: u64,
        gpu_pids: &crate::attribution::PidSet,
        events: &EventCounters,
    ) -> Option<StallWindow> {
        let previous = self.previous.as_ref()?;
        let mut per_process: BTreeMap<u32, (TaskTimes, Option<TaskTimes>)> = BTreeMap::new();
        for (key, now) in self
            .totals
            .times
            .iter()
            .filter(|(k, _)| k.cgroup_id == cgroup_id)
        {
            let d = match previous.times.get(key) {
                Some(before) => times_delta(now, before).unwrap_or_else(|| {
                    // evicted and re-created since the last round: only the new part is known
                    events.add(InternalEvent::ProbeEntriesEvicted, 1);
                    *now
                }),
                None => *now,
            };
            if d.switches == 0 && d.on_cpu_ns + d.runq_ns + d.blocked_ns + d.sleep_ns == 0 {
                continue;
            }
            let (total, main) = per_process.entry(key.tgid).or_default();
            total.accumulate(&d);
            if key.thread == task_thread::MAIN {
                *main = Some(d);
            }
        }
        let s = |ns: u64| ns as f64 / 1e9;
        let processes = per_process
            .into_iter()
            .map(|(pid, (d, main))| ProcessStall {
                pid,
                role: if gpu_pids.contains(&pid) {
                    ProcessRole::Gpu
                } else {
                    ProcessRole::Loader
                },
                on_cpu_seconds: s(d.on_cpu_ns),
                runq_seconds: s(d.runq_ns),
                blocked_seconds: s(d.blocked_ns),
                sleep_seconds: s(d.sleep_ns),
                switches: d.switches,
                blocked_switches: d.blocked_switches,
                main_thread: main.map(|m| ThreadTimes {
                    on_cpu_seconds: s(m.on_cpu_ns),
                    runq_seconds: s(m.runq_ns),
                    blocked_seconds: s(m.blocked_ns),
                    sleep_seconds: s(m.sleep_ns),
                }),
            })
            .collect();
        Some(StallWindow {
            cgroup_id,
            processes,
            reads: io_window(cgroup_id, &self.totals.reads, &previous.reads),
            disk: io_window(cgroup_id, &self.totals.disk, &previous.disk),
            io_traced: self.window_traced,
        })
    }
}

/// The I/O of one cgroup in the window, all its processes and threads together.
fn io_window(
    cgroup_id: u64,
    now: &HashMap<TaskKey, IoStats>,
    before: &HashMap<TaskKey, IoStats>,
) -> IoSummary {
    let mut total = IoStats::default();
    for (key, n) in now.iter().filter(|(k, _)| k.cgroup_id == cgroup_id) {
        let d = before.get(key).and_then(|b| io_delta(n, b)).unwrap_or(*n);
        total.accumulate(&d);
    }
    io_summary(&total)
}

/// `now - before`, or `None` if a counter went backwards (the entry was evicted and re-created).
fn times_delta(now: &TaskTimes, before: &TaskTimes) -> Option<TaskTimes> {
    Some(TaskTimes {
        on_cpu_ns: now.on_cpu_ns.checked_sub(before.on_cpu_ns)?,
        runq_ns: now.runq_ns.checked_sub(before.runq_ns)?,
        blocked_ns: now.blocked_ns.checked_sub(before.blocked_ns)?,
        sleep_ns: now.sleep_ns.checked_sub(before.sleep_ns)?,
        switches: now.switches.checked_sub(before.switches)?,
        blocked_switches: now.blocked_switches.checked_sub(before.blocked_switches)?,
    })
}

fn io_delta(now: &IoStats, before: &IoStats) -> Option<IoStats> {
    let mut hist = [0u64; LATENCY_BUCKETS];
    for (i, h) in hist.iter_mut().enumerate() {
        *h = now.hist[i].checked_sub(before.hist[i])?;
    }
    Some(IoStats {
        count: now.count.checked_sub(before.count)?,
        bytes: now.bytes.checked_sub(before.bytes)?,
        total_ns: now.total_ns.checked_sub(before.total_ns)?,
        hist,
    })
}

/// Mean, percentiles (the upper edge of the log2 bucket that holds them) and the count of
/// operations of 16 ms or more (bucket 14 up; bucket 13 is [8, 16) ms) of an I/O window.
pub(crate) fn io_summary(s: &IoStats) -> IoSummary {
    let percentile = |q: f64| -> Option<f64> {
        if s.count == 0 {
            return None;
        }
        let target = ((q * s.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in s.hist.iter().enumerate() {
            seen += n;
            if seen >= target {
                return Some((1u64 << (i + 1)) as f64 / 1000.0);
            }
        }
        None
    };
    IoSummary {
        count: s.count,
        bytes: s.bytes,
        mean_latency_ms: (s.count > 0).then(|| s.total_ns as f64 / s.count as f64 / 1e6),
        p50_latency_ms: percentile(0.5),
        p99_latency_ms: percentile(0.99),
        slow_count: s.hist.iter().skip(14).sum(),
    }
}
