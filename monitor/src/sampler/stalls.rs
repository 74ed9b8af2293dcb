//! The stall probe's side of a round: points the kernel filter at the round's cgroups, reads
//! the cumulative per-task counters, and turns this round's minus the previous round's into
//! each cgroup's [`StallWindow`].
use super::demand::TracingMode;
use super::io_tracing::{IoDemand, IoTracingConfig};
use super::process_checks::ProcessChecks;
use crate::events::{
    EventCounters, EventKind, ProbeFilterFull, ProbeIoAttachFailed, ProbeMapReadFailed,
};
use crate::model::{
    IoSummary, IoTracing, IoTracingState, ProbeHealth, ProcessRole, ProcessStall, SourceError,
    SourceState, StallWindow, ThreadTimes,
};
use crate::sources::host::pid::PidSet;
use crate::sources::host::HostReader;
use crate::sources::stall_probe::{Accumulate, ProbeTotals, StallProbe};
use monitor_common::{probe_stat, task_thread, IoStats, TaskKey, TaskTimes, LATENCY_BUCKETS};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

pub struct Stalls {
    probe: Result<StallProbe, SourceError>,
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
    /// Time already put in earlier windows of a GPU process's main thread that is still in
    /// one state (see [`Stalls::window`]), by (cgroup, pid), with the round it was last set.
    in_progress: HashMap<(u64, u32), (ThreadTimes, u64)>,
    round: u64,
}

/// Exited tasks are looked for every this many rounds: a look per unmoved task's process every
/// round was a twentieth of a round, and an exited task's entry only takes map space meanwhile
/// (its counters stand still, so it adds nothing to a window).
const FORGET_EVERY_ROUNDS: u64 = 5;

impl Stalls {
    pub fn load(enabled: bool, io: IoTracingConfig) -> Self {
        let probe = if enabled {
            match io.mode {
                TracingMode::Always => StallProbe::loader().load(),
                _ => StallProbe::loader().attach_io(false).load(),
            }
            .map_err(|e| SourceError::failed(format_args!("stall tracing unavailable: {e}")))
        } else {
            Err(SourceError::disabled("stall tracing disabled"))
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
            in_progress: HashMap::new(),
            round: 0,
        }
    }

    /// (the probes are loaded, programs may be attached later): what still needs privileges.
    pub fn privileged_use(&self) -> (bool, bool) {
        let loaded = self.probe.is_ok();
        (
            loaded,
            loaded && self.demand.mode() == TracingMode::Adaptive,
        )
    }

    pub fn source_state(&self) -> SourceState {
        match &self.probe {
            Ok(p) if p.missing.is_empty() => SourceState::up(),
            Ok(p) => SourceState::partial(format!(
                "not traced on this kernel: {}",
                p.missing.join("; ")
            )),
            Err(e) => SourceState::from_error(e.clone()),
        }
    }

    pub fn health(&self) -> Option<ProbeHealth> {
        self.probe.as_ref().ok().map(|p| ProbeHealth {
            missing: p.missing.clone(),
            map_update_failed: self.failures[probe_stat::MAP_UPDATE_FAILED as usize],
            field_read_failed: self.failures[probe_stat::FIELD_READ_FAILED as usize],
            unmatched_end: self.failures[probe_stat::UNMATCHED_END as usize],
            task_map_entries: p.task_entries,
            task_map_entries_used: self.previous.as_ref().map_or(0, |t| t.times.len()),
            io_tracing: IoTracingState {
                mode: self.demand.mode().as_str(),
                state: p.io_state(),
                on_since_unix_ms: self.on_since_unix_ms,
                reason: self.demand.reason().map(str::to_owned),
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
                tracing::info!(reason = ?self.demand.reason(), "read tracing on");
            }
            Ok(IoTracing::Off) if before != IoTracing::Off => {
                tracing::info!("read tracing off: no workload needed it");
            }
            Ok(_) => {}
            Err(e) => events.emit(ProbeIoAttachFailed {
                error: e.to_string(),
            }),
        }
    }

    /// Points the kernel filter at `cgroups` and reads the counters. False when there is no
    /// probe or the read failed (the round then has no stall windows).
    pub fn read(&mut self, cgroups: &HashSet<u64>, events: &EventCounters) -> bool {
        let Ok(probe) = self.probe.as_mut() else {
            return false;
        };
        match probe.watch(cgroups) {
            Ok(0) => {}
            Ok(unwatched) => events.emit(ProbeFilterFull {
                unwatched,
                capacity: monitor_common::WATCHED_CGROUP_ENTRIES as usize,
            }),
            Err(e) => events.emit(ProbeMapReadFailed {
                probe: "stall",
                error: e.to_string(),
            }),
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
                let evicted = self.totals.evicted_during_read
                    + self
                        .previous
                        .as_ref()
                        .map_or(0, |p| evicted_since(p, &self.totals));
                if evicted > 0 {
                    events.add(EventKind::ProbeEntriesEvicted, evicted);
                }
                true
            }
            Err(e) => {
                events.emit(ProbeMapReadFailed {
                    probe: "stall",
                    error: e.to_string(),
                });
                false
            }
        }
    }

    /// Ends a round that read the counters: drops the tasks that exited and did not move since
    /// (their last window is counted), and keeps this round's counters as the next baseline.
    pub fn end_round(&mut self, host: &HostReader) {
        if self.round.is_multiple_of(FORGET_EVERY_ROUNDS) {
            self.forget_exited_tasks(host);
        }
        let round = self.round;
        self.in_progress.retain(|_, (_, r)| *r == round);
        self.round += 1;
        let current = std::mem::take(&mut self.totals);
        self.totals = self.previous.take().unwrap_or_default();
        self.previous = Some(current);
    }

    fn forget_exited_tasks(&mut self, host: &HostReader) {
        let (Ok(probe), Some(previous)) = (self.probe.as_mut(), self.previous.as_ref()) else {
            return;
        };
        // A process's main thread and its other threads are two keys: one look per process.
        let mut exited: HashMap<u32, bool> = HashMap::new();
        let gone: Vec<TaskKey> = self
            .totals
            .times
            .iter()
            .filter(|(k, now)| {
                previous.times.get(k) == Some(now)
                    && *exited.entry(k.tgid).or_insert_with(|| !host.alive(k.tgid))
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
    ///
    /// The probes charge a thread's time in a state when it leaves the state, so a GPU
    /// process's main thread that stays asleep (waiting for a batch) or running through the
    /// whole window shows nothing in it, and the whole stretch lands in the window where it
    /// ends. On the H200's I/O-bound phase, with 1-s windows and 3-s waits, that read as no
    /// wait in every third window. Where such a process's main thread did not switch, or its
    /// charged times leave part of the window uncharged, its state now (`/proc/<pid>/stat`)
    /// stands for the rest, and what was put in earlier windows is taken off the stretch once
    /// it is charged. A GPU process of the workload (`workload_gpu_pids`) none of whose threads
    /// switched (one thread asleep or spinning throughout) is in the window all the same.
    pub fn window(
        &mut self,
        cgroup_id: u64,
        gpu_pids: &PidSet,
        workload_gpu_pids: &BTreeSet<u32>,
        window_seconds: Option<f64>,
        checks: &mut ProcessChecks,
        events: &EventCounters,
    ) -> Option<StallWindow> {
        let mut w = self.charged_window(cgroup_id, gpu_pids, events)?;
        if window_seconds.is_some() {
            for &pid in workload_gpu_pids {
                if !w.processes.iter().any(|p| p.pid == pid) {
                    w.processes.push(uncharged_gpu_process(pid));
                }
            }
            w.processes.sort_by_key(|p| p.pid);
        }
        for p in w
            .processes
            .iter_mut()
            .filter(|p| p.role == ProcessRole::Gpu)
        {
            let key = (cgroup_id, p.pid);
            if p.main_thread.is_some() {
                if let Some((early, _)) = self.in_progress.remove(&key) {
                    debit(p, &early);
                }
            }
            let Some(window) = window_seconds else {
                continue;
            };
            // A stretch still going on at the window's end is charged only when it ends.
            let rest = match &p.main_thread {
                Some(m) => Some(window - traced(m)).filter(|r| *r > UNCHARGED_MIN * window),
                None => Some(window),
            };
            let Some(extra) =
                rest.and_then(|r| checks.stat(p.pid).and_then(|s| in_state(s.state, r)))
            else {
                continue;
            };
            credit(p, &extra);
            let early = self.in_progress.entry(key).or_default();
            add(&mut early.0, &extra);
            early.1 = self.round;
        }
        // A GPU process added above whose state could not be read (it exited) is not there.
        w.processes
            .retain(|p| p.main_thread.is_some() || p.switches > 0 || process_traced(p) > 0.0);
        Some(w)
    }

    fn charged_window(
        &self,
        cgroup_id: u64,
        gpu_pids: &PidSet,
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
                    events.add(EventKind::ProbeEntriesEvicted, 1);
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

fn add(to: &mut ThreadTimes, t: &ThreadTimes) {
    to.on_cpu_seconds += t.on_cpu_seconds;
    to.runq_seconds += t.runq_seconds;
    to.blocked_seconds += t.blocked_seconds;
    to.sleep_seconds += t.sleep_seconds;
}

/// The share of a window a main thread's charged times leave uncharged, from which the
/// stretch still going on at its end is credited from the thread's state (smaller gaps are the
/// last stint before the round, charged with the next).
const UNCHARGED_MIN: f64 = 0.1;

/// All of a thread's charged time in the window.
fn traced(m: &ThreadTimes) -> f64 {
    m.on_cpu_seconds + m.runq_seconds + m.blocked_seconds + m.sleep_seconds
}

/// `seconds` in the state `/proc/<pid>/stat` gives (`S`, `D`, `R`), `None` for another.
fn in_state(state: char, seconds: f64) -> Option<ThreadTimes> {
    let mut m = ThreadTimes::default();
    match state {
        'S' => m.sleep_seconds = seconds,
        'D' => m.blocked_seconds = seconds,
        'R' => m.on_cpu_seconds = seconds,
        _ => return None,
    }
    Some(m)
}

/// A GPU process of the workload with no charged time in the window: its state comes next.
fn uncharged_gpu_process(pid: u32) -> ProcessStall {
    ProcessStall {
        pid,
        role: ProcessRole::Gpu,
        on_cpu_seconds: 0.0,
        runq_seconds: 0.0,
        blocked_seconds: 0.0,
        sleep_seconds: 0.0,
        switches: 0,
        blocked_switches: 0,
        main_thread: None,
    }
}

/// All of a process's charged time in the window, its threads together.
fn process_traced(p: &ProcessStall) -> f64 {
    p.on_cpu_seconds + p.runq_seconds + p.blocked_seconds + p.sleep_seconds
}

/// Credits `t` (its state now) to a process's main thread and to the process, which holds it.
fn credit(p: &mut ProcessStall, t: &ThreadTimes) {
    add(p.main_thread.get_or_insert_with(ThreadTimes::default), t);
    p.on_cpu_seconds += t.on_cpu_seconds;
    p.runq_seconds += t.runq_seconds;
    p.blocked_seconds += t.blocked_seconds;
    p.sleep_seconds += t.sleep_seconds;
}

/// Takes what earlier windows credited off a main thread's stretch now charged, and off the
/// process that holds it.
fn debit(p: &mut ProcessStall, early: &ThreadTimes) {
    if let Some(m) = p.main_thread.as_mut() {
        take_off(m, early);
    }
    let less = |v: &mut f64, e: f64| *v = (*v - e).max(0.0);
    less(&mut p.on_cpu_seconds, early.on_cpu_seconds);
    less(&mut p.runq_seconds, early.runq_seconds);
    less(&mut p.blocked_seconds, early.blocked_seconds);
    less(&mut p.sleep_seconds, early.sleep_seconds);
}

/// `m` less what earlier windows already showed of it (never below 0).
fn take_off(m: &mut ThreadTimes, early: &ThreadTimes) {
    let less = |v: &mut f64, e: f64| *v = (*v - e).max(0.0);
    less(&mut m.on_cpu_seconds, early.on_cpu_seconds);
    less(&mut m.runq_seconds, early.runq_seconds);
    less(&mut m.blocked_seconds, early.blocked_seconds);
    less(&mut m.sleep_seconds, early.sleep_seconds);
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

/// Task entries of the last read that this one lacks. Exited tasks are forgotten (deleted from
/// the maps and the baseline) at the end of a round, and the kernel deletes no task entry
/// itself, so an entry that vanished was evicted: its map was full.
fn evicted_since(previous: &ProbeTotals, now: &ProbeTotals) -> u64 {
    previous
        .times
        .keys()
        .filter(|k| !now.times.contains_key(k))
        .count() as u64
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
/// operations of 16 ms or more (bucket 14 up; bucket 13 is [8, 16) ms) of an I/O window. A
/// reads histogram holds weighted samples (`monitor_common::reads`), so its percentiles are
/// taken over its own weight, which is close to the count but not the count.
pub(crate) fn io_summary(s: &IoStats) -> IoSummary {
    let weight: u64 = s.hist.iter().sum();
    let percentile = |q: f64| -> Option<f64> {
        if weight == 0 {
            return None;
        }
        let target = ((q * weight as f64).ceil() as u64).max(1);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::host::fake_proc::FakeProc;
    use monitor_common::task_thread::{MAIN, OTHERS};

    const CG: u64 = 77;
    const S: u64 = 1_000_000_000;

    fn times(on_cpu_ns: u64, sleep_ns: u64) -> TaskTimes {
        TaskTimes {
            on_cpu_ns,
            sleep_ns,
            switches: 1,
            ..Default::default()
        }
    }

    /// One round of counters: the process's other threads always move; its main thread only
    /// when `main` says so (cumulative, as the kernel keeps them).
    fn totals(others: TaskTimes, main: Option<TaskTimes>) -> ProbeTotals {
        let mut t = ProbeTotals::default();
        let key = |thread| TaskKey {
            cgroup_id: CG,
            tgid: 42,
            thread,
        };
        t.times.insert(key(OTHERS), others);
        if let Some(m) = main {
            t.times.insert(key(MAIN), m);
        }
        t
    }

    /// An entry of the last read missing from this one was evicted (a full map); one that
    /// is new, or present in both, was not.
    #[test]
    fn entries_that_vanish_between_reads_are_counted_as_evicted() {
        let before = totals(times(1, 1), Some(times(1, 1)));
        let mut now = totals(times(2, 2), None);
        now.times.insert(
            TaskKey {
                cgroup_id: CG,
                tgid: 43,
                thread: OTHERS,
            },
            times(1, 0),
        );
        assert_eq!(evicted_since(&before, &now), 1, "the main thread's entry");
        assert_eq!(evicted_since(&before, &before), 0);
    }

    fn proc_state(root: &FakeProc, state: char) {
        root.write(
            "42/stat",
            format!("42 (python) {state} 1 1 1 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0 99 0 0\n"),
        );
    }

    #[test]
    fn a_main_thread_asleep_through_windows_waits_in_each_and_is_not_counted_twice() {
        let root = FakeProc::new();
        let host = HostReader::new(root.path());
        let mut checks = ProcessChecks::new(&host);
        let mut s = Stalls::load(false, IoTracingConfig::default());
        let events = EventCounters::default();
        let gpu: PidSet = [42].into_iter().collect();
        let own = BTreeSet::from([42]);
        // Round 0: the main thread has run 0.1 s and gone to sleep waiting for a batch.
        s.totals = totals(times(S / 10, 0), Some(times(S / 10, 0)));
        s.end_round(&host);
        // Rounds 1 and 2 (1 s each): it sleeps on; only its other threads switch.
        proc_state(&root, 'S');
        let mut waits = Vec::new();
        for k in 1..=2u64 {
            // Its main thread's counters have not moved: nothing of it in the window.
            s.totals = totals(times(S / 10 + k * S / 10, 0), Some(times(S / 10, 0)));
            let w = s
                .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
                .unwrap();
            let m = w.processes[0].main_thread.unwrap();
            waits.push(m.sleep_seconds);
            s.end_round(&host);
        }
        assert_eq!(waits, [1.0, 1.0], "asleep through each window");
        // Round 3: it wakes after 2.5 s asleep, runs 0.2 s and sleeps again (the state read
        // says so); the kernel charges the 2.5 s and the 0.2 s now, the new sleep later.
        s.totals = totals(times(S, 0), Some(times(S / 10 + S / 5, 5 * S / 2)));
        let w = s
            .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
            .unwrap();
        let m = w.processes[0].main_thread.unwrap();
        // 0.5 s of the old sleep, 0.2 s on a CPU, and the rest of the window asleep again.
        assert!((m.sleep_seconds - 0.8).abs() < 1e-9, "{m:?}");
        assert!((m.on_cpu_seconds - 0.2).abs() < 1e-9, "{m:?}");
        // Round 4: that sleep ends after 0.5 s and it runs, 0.5 s charged at a switch-out and
        // the rest still running (R): the 0.3 s of sleep already counted is not counted again.
        s.end_round(&host);
        proc_state(&root, 'R');
        s.totals = totals(
            times(3 * S / 2, 0),
            Some(times(S / 10 + S / 5 + S / 2, 3 * S)),
        );
        let w = s
            .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
            .unwrap();
        let m = w.processes[0].main_thread.unwrap();
        assert!((m.sleep_seconds - 0.2).abs() < 1e-9, "{m:?}");
        assert!((m.on_cpu_seconds - 0.8).abs() < 1e-9, "{m:?}");
        // Running through a whole window reads as running, not as no wait known.
        s.end_round(&host);
        s.totals = totals(times(2 * S, 0), Some(times(S / 10 + S / 5 + S / 2, 3 * S)));
        let w = s
            .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
            .unwrap();
        assert_eq!(w.processes[0].main_thread.unwrap().on_cpu_seconds, 1.0);
    }

    /// The demo's loader job, and any single-threaded GPU process: none of its threads
    /// switches in the window, so the probes charge nothing to it. It is in the window in its
    /// state, its main thread and the process alike; a GPU process that is gone is not, nor is
    /// one that is not the workload's.
    #[test]
    fn a_gpu_process_none_of_whose_threads_switched_is_in_the_window_in_its_state() {
        let root = FakeProc::new();
        let host = HostReader::new(root.path());
        let mut checks = ProcessChecks::new(&host);
        let mut s = Stalls::load(false, IoTracingConfig::default());
        let events = EventCounters::default();
        // 43 holds a GPU too but has exited; 44 is another workload's.
        let gpu: PidSet = [42, 43, 44].into_iter().collect();
        let own = BTreeSet::from([42, 43]);
        let still = || totals(times(S / 10, 0), Some(times(S / 10, 0)));
        s.totals = still();
        s.end_round(&host);
        for (state, expect) in [('S', (0.0, 1.0)), ('R', (1.0, 0.0))] {
            proc_state(&root, state);
            s.totals = still();
            let w = s
                .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
                .unwrap();
            let pids: Vec<u32> = w.processes.iter().map(|p| p.pid).collect();
            assert_eq!(pids, [42], "{state}");
            let p = &w.processes[0];
            let m = p.main_thread.unwrap();
            assert_eq!((m.on_cpu_seconds, m.sleep_seconds), expect, "{state}");
            assert_eq!((p.on_cpu_seconds, p.sleep_seconds), expect, "{state}");
            s.end_round(&host);
        }
        // Without a window length nothing is credited, and nothing uncharged is added.
        s.totals = still();
        let w = s
            .window(CG, &gpu, &own, None, &mut checks, &events)
            .unwrap();
        assert!(w.processes.is_empty(), "{:?}", w.processes);
    }

    /// A credited stretch counts in the process's time as in its main thread's, and comes off
    /// both once the kernel charges it: the other threads' time (process less main thread)
    /// stays theirs.
    #[test]
    fn a_credited_stretch_is_the_process_time_too_and_is_not_counted_twice() {
        let root = FakeProc::new();
        let host = HostReader::new(root.path());
        let mut checks = ProcessChecks::new(&host);
        let mut s = Stalls::load(false, IoTracingConfig::default());
        let events = EventCounters::default();
        let gpu: PidSet = [42].into_iter().collect();
        let own = BTreeSet::from([42]);
        s.totals = totals(times(0, 0), Some(times(0, 0)));
        s.end_round(&host);
        // Round 1: the other threads run 0.3 s; the main thread spins on (R) uncharged.
        proc_state(&root, 'R');
        s.totals = totals(times(3 * S / 10, 0), Some(times(0, 0)));
        let w = s
            .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
            .unwrap();
        let p = &w.processes[0];
        assert!((p.on_cpu_seconds - 1.3).abs() < 1e-9, "{p:?}");
        assert_eq!(p.main_thread.unwrap().on_cpu_seconds, 1.0);
        s.end_round(&host);
        // Round 2: the main thread switches out after 1.5 s on a CPU and sleeps on; the other
        // threads run 0.3 s more. 1 s of the 1.5 was credited already.
        proc_state(&root, 'S');
        s.totals = totals(times(6 * S / 10, 0), Some(times(3 * S / 2, 0)));
        let w = s
            .window(CG, &gpu, &own, Some(1.0), &mut checks, &events)
            .unwrap();
        let p = &w.processes[0];
        let m = p.main_thread.unwrap();
        assert!((m.on_cpu_seconds - 0.5).abs() < 1e-9, "{m:?}");
        assert!((m.sleep_seconds - 0.5).abs() < 1e-9, "{m:?}");
        let others = p.on_cpu_seconds - m.on_cpu_seconds;
        assert!((others - 0.3).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn read_percentiles_are_taken_over_the_sampled_weight() {
        // 100 reads: 92 fast ones of which 11 were timed (weight 8 each, 88), and 8 slow ones
        // that blocked (always timed, weight 1). The weight is 96, not the count.
        let mut hist = [0u64; LATENCY_BUCKETS];
        hist[0] = 88;
        hist[14] = 8;
        let s = IoStats {
            count: 100,
            bytes: 100 << 14,
            total_ns: 88 * 1_500 + 8 * 20_000_000,
            hist,
        };
        let summary = io_summary(&s);
        assert_eq!(summary.p50_latency_ms, Some(0.002));
        // The 96th of 96 is slow; against the count (99th of 100) it would have been missed.
        assert_eq!(summary.p99_latency_ms, Some(32.768));
        assert_eq!(summary.slow_count, 8);
        let mean = summary.mean_latency_ms.unwrap();
        assert!((mean - 1.60132).abs() < 1e-9, "{mean}");
    }
}
