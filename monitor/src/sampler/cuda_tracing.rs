//! The CUDA driver probes' side of a round: hands the attacher (`sources::cuda_probe::attacher`,
//! on a thread of its own) the live GPU processes and whether their libraries should be probed
//! (adaptive, as read tracing is), and turns this round's counters minus the previous round's
//! into each workload's [`CudaWindow`].
//!
//! Wanted while a round shows a workload whose GPU idles at least `idle_share` of the window
//! while its training loop (every thread of its GPU processes) is at work at least
//! `active_share` of it: the case where thread states alone cannot tell copies, launches, synchronisation and the
//! loop's own CPU work apart. Rounds are looked at as they are taken (the GPU's instantaneous
//! reading for its busy share) and again once published (the series').
use super::demand::{Demand, TracingMode};
use crate::events::{EventCounters, ProbeMapReadFailed, SourceHung};
use crate::model::{
    CudaCalls, CudaProcessCalls, CudaTracingState, CudaWindow, Gpu, Snapshot, SourceError,
    SourceState, Transfer, Workload,
};
use crate::sources::cuda_probe::attacher::{AttachState, Attacher, Limits, Plan};
use crate::sources::cuda_probe::{self, Counters};
use crate::sources::host::HostReader;
use crate::units::duration;
use monitor_common::cuda::cuda_stat;
use monitor_common::{task_thread, CudaStats, TaskKey};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The config file's `sources.cuda_tracing` section.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaTracingConfig {
    pub mode: TracingMode,
    /// How long the probes stay attached after the last round that needed them.
    #[serde(with = "duration")]
    pub linger: Duration,
    /// A GPU idle at least this share of a round, while its training loop was on a CPU or
    /// waiting for one at least `active_share` of it, needs the evidence.
    pub idle_share: f64,
    pub active_share: f64,
    /// How long a round waits for the attacher to carry out a new plan before it reads the
    /// counters (the rest is done by the next round): short for rounds that repeat, long for a
    /// one-shot window, which is traced from its start or not at all.
    #[serde(skip)]
    pub settle: Duration,
}

/// A round waits this long for new processes' libraries to be probed...
const SETTLE: Duration = Duration::from_millis(200);
/// ... a one-shot window this long.
const SETTLE_ONE_SHOT: Duration = Duration::from_secs(5);
/// The attacher busy on one step this long is hung, as far as the round can tell.
const ATTACHER_HUNG: Duration = Duration::from_secs(30);

impl Default for CudaTracingConfig {
    fn default() -> Self {
        Self {
            mode: TracingMode::Adaptive,
            linger: Duration::from_secs(300),
            idle_share: 0.25,
            active_share: 0.5,
            settle: SETTLE,
        }
    }
}

impl CudaTracingConfig {
    /// For a one-shot window: traced from the start unless off.
    pub fn for_one_shot(self) -> Self {
        Self {
            mode: self.mode.for_one_shot(),
            settle: SETTLE_ONE_SHOT,
            ..self
        }
    }

    pub fn validate(&self) -> Result<(), crate::field_error::FieldError> {
        crate::field_error::check_shares(&[
            ("idle_share", self.idle_share),
            ("active_share", self.active_share),
        ])
    }
}

/// The loaded probes: their counters, read here, and the attacher thread that owns the
/// programs.
struct Probe {
    counters: Counters,
    attacher: Attacher,
}

pub struct CudaTracing {
    probe: Result<Probe, SourceError>,
    demand: Demand,
    config: CudaTracingConfig,
    /// The attacher's state at the last counter read.
    attach: AttachState,
    /// The attachments' epoch at the last read, when probes were attached then.
    read_epoch: Option<u64>,
    /// Attached for this round's whole window.
    window_traced: bool,
    on_since_unix_ms: Option<u64>,
    /// When the attacher was last reported hung (once per spell).
    hung_reported: Option<Instant>,
    totals: HashMap<TaskKey, CudaStats>,
    previous: Option<HashMap<TaskKey, CudaStats>>,
    failures: [u64; cuda_stat::COUNT as usize],
}

impl CudaTracing {
    pub fn load(
        enabled: bool,
        config: CudaTracingConfig,
        proc_root: &std::path::Path,
        events: &Arc<EventCounters>,
    ) -> Self {
        let probe = match (enabled, config.mode) {
            (false, _) => Err(SourceError::disabled(
                "CUDA call tracing disabled (eBPF off)",
            )),
            (true, TracingMode::Off) => Err(SourceError::disabled(
                "CUDA call tracing off (sources.cuda_tracing)",
            )),
            (true, _) => cuda_probe::load()
                .map_err(|e| e.to_string())
                .and_then(|(counters, programs)| {
                    let root = proc_root.to_path_buf();
                    Attacher::spawn(programs, root, Limits::default(), events.clone())
                        .map(|attacher| Probe { counters, attacher })
                        .map_err(|e| format!("starting its thread: {e}"))
                })
                .map_err(|e| {
                    SourceError::failed(format_args!("CUDA call tracing unavailable: {e}"))
                }),
        };
        if let (true, Err(e)) = (enabled && config.mode != TracingMode::Off, &probe) {
            tracing::warn!("{e}");
        }
        Self {
            probe,
            demand: Demand::new(config.mode, config.linger),
            config,
            attach: AttachState::default(),
            read_epoch: None,
            window_traced: false,
            on_since_unix_ms: None,
            hung_reported: None,
            totals: HashMap::new(),
            previous: None,
            failures: [0; cuda_stat::COUNT as usize],
        }
    }

    /// Whether the probes are loaded (so attaching later needs the tracing capabilities).
    pub fn loaded(&self) -> bool {
        self.probe.is_ok()
    }

    pub fn source_state(&self) -> SourceState {
        match &self.probe {
            Ok(_) => SourceState::up(),
            Err(e) => SourceState::from_error(e.clone()),
        }
    }

    pub fn state(&self) -> Option<CudaTracingState> {
        self.probe.as_ref().ok()?;
        Some(CudaTracingState {
            mode: self.demand.mode().as_str(),
            attached: self.attach.attached,
            on_since_unix_ms: self.on_since_unix_ms,
            reason: self.demand.reason.clone(),
            libraries: self.attach.libraries.clone(),
            unmatched_returns: self.failures[cuda_stat::UNMATCHED_RETURN as usize],
            map_update_failed: self.failures[cuda_stat::MAP_UPDATE_FAILED as usize],
        })
    }

    /// Looks at a published round for a workload that needs the evidence.
    pub fn observe(&mut self, snap: &Snapshot) {
        self.demand
            .note(needs_evidence(snap, &self.config), Instant::now());
    }

    /// Looks at a round as it is taken (see [`needs_evidence_now`]).
    pub fn observe_taken<'a>(
        &mut self,
        workloads: impl IntoIterator<Item = &'a Workload>,
        gpus: &[Gpu],
        window: Option<f64>,
    ) {
        let Some(window) = window.filter(|w| *w > 0.0) else {
            return;
        };
        let why = needs_evidence_now(workloads, gpus, window, &self.config);
        self.demand.note(why, Instant::now());
    }

    /// One round: hands the attacher the live GPU processes and whether probes are wanted,
    /// waits for it up to the settle time, and reads the counters. False when there is no
    /// probe or the read failed.
    pub fn step(&mut self, gpus: &[Gpu], now_unix_ms: u64, events: &EventCounters) -> bool {
        let wanted = self.demand.wanted(Instant::now());
        let Ok(probe) = self.probe.as_mut() else {
            return false;
        };
        let mut processes: Vec<(u32, Option<u64>)> = gpus
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| !p.vanished)
            .map(|p| (p.reading.pid, p.start_time_ticks))
            .collect();
        processes.sort_unstable();
        processes.dedup();
        let generation = probe.attacher.request(Plan { processes, wanted });
        let before = probe.attacher.settle(generation, self.config.settle);
        self.hung_reported = report_hung(&before, self.hung_reported, events);
        self.failures = probe.counters.failures();
        let read = probe.counters.read(&mut self.totals);
        let after = probe.attacher.state();
        // Traced throughout: attached at the last read and now, with no attach or detach
        // between (nor during this read).
        let steady = before.epoch == after.epoch;
        self.window_traced = before.attached && steady && self.read_epoch == Some(before.epoch);
        if before.attached && self.read_epoch.is_none() {
            self.on_since_unix_ms = Some(now_unix_ms);
            tracing::info!(reason = ?self.demand.reason, "CUDA call tracing on");
        } else if !before.attached && self.attach.attached {
            tracing::info!("CUDA call tracing off: no workload needed it");
        }
        self.read_epoch = (before.attached && steady).then_some(before.epoch);
        self.attach = before;
        match read {
            Ok(()) => true,
            Err(e) => {
                events.emit(ProbeMapReadFailed {
                    probe: "CUDA",
                    error: e.to_string(),
                });
                false
            }
        }
    }

    /// The CUDA window of a workload whose GPU processes are `pids`, `None` until there is a
    /// previous round (or without probes).
    pub fn window(&self, pids: &BTreeSet<u32>) -> Option<CudaWindow> {
        if self.probe.is_err() || pids.is_empty() {
            return None;
        }
        let previous = self.previous.as_ref()?;
        let mut per_process: BTreeMap<u32, (CudaCalls, CudaCalls)> = BTreeMap::new();
        for (key, now) in self.totals.iter().filter(|(k, _)| pids.contains(&k.tgid)) {
            let d = match previous.get(key) {
                Some(before) => delta(now, before).unwrap_or(*now),
                None => *now,
            };
            let calls = calls(&d);
            let (all, main) = per_process.entry(key.tgid).or_default();
            all.add(&calls);
            if key.thread == task_thread::MAIN {
                main.add(&calls);
            }
        }
        let mut total = CudaCalls::default();
        let processes = per_process
            .into_iter()
            .map(|(pid, (calls, main_thread))| {
                total.add(&calls);
                CudaProcessCalls {
                    pid,
                    calls,
                    main_thread,
                }
            })
            .collect();
        Some(CudaWindow {
            traced: self.window_traced,
            total,
            processes,
        })
    }

    /// Ends a round: forgets tasks that are gone, keeps this round's counters as the baseline.
    pub fn end_round(&mut self, host: &HostReader) {
        if let (Ok(probe), Some(previous)) = (self.probe.as_mut(), self.previous.as_ref()) {
            let gone: Vec<TaskKey> = self
                .totals
                .iter()
                .filter(|(k, now)| previous.get(k) == Some(now) && !host.alive(k.tgid))
                .map(|(k, _)| *k)
                .collect();
            probe.counters.forget(&gone);
            for k in &gone {
                self.totals.remove(k);
            }
        }
        let current = std::mem::take(&mut self.totals);
        self.totals = self.previous.take().unwrap_or_default();
        self.previous = Some(current);
    }
}

/// Reports the attacher busy on one step past [`ATTACHER_HUNG`], once per spell; the time it
/// was last reported.
fn report_hung(
    state: &AttachState,
    reported: Option<Instant>,
    events: &EventCounters,
) -> Option<Instant> {
    let (doing, since) = state.busy?;
    let busy = since.elapsed();
    if busy < ATTACHER_HUNG {
        return None;
    }
    if reported.is_some_and(|r| r >= since) {
        return reported;
    }
    events.emit(SourceHung {
        stall: format!(
            "the CUDA probes' thread has been {doing} for {} s (rounds go on without it)",
            busy.as_secs()
        ),
    });
    Some(Instant::now())
}

/// `now - before`, `None` when a counter went backwards (the entry was evicted and made anew).
fn delta(now: &CudaStats, before: &CudaStats) -> Option<CudaStats> {
    let mut d = CudaStats {
        launches: now.launches.checked_sub(before.launches)?,
        graph_launches: now.graph_launches.checked_sub(before.graph_launches)?,
        syncs: now.syncs.checked_sub(before.syncs)?,
        sync_ns: now.sync_ns.checked_sub(before.sync_ns)?,
        ..Default::default()
    };
    for (i, c) in d.copies.iter_mut().enumerate() {
        let (n, b) = (now.copies[i], before.copies[i]);
        c.count = n.count.checked_sub(b.count)?;
        c.bytes = n.bytes.checked_sub(b.bytes)?;
        c.call_ns = n.call_ns.checked_sub(b.call_ns)?;
        c.wait_ns = n.wait_ns.checked_sub(b.wait_ns)?;
        c.between_ns = n.between_ns.checked_sub(b.between_ns)?;
    }
    Some(d)
}

fn calls(s: &CudaStats) -> CudaCalls {
    let transfer = |i: usize| Transfer {
        count: s.copies[i].count,
        bytes: s.copies[i].bytes,
        call_seconds: s.copies[i].call_ns as f64 / 1e9,
        wait_seconds: s.copies[i].wait_ns as f64 / 1e9,
        between_seconds: s.copies[i].between_ns as f64 / 1e9,
    };
    CudaCalls {
        launches: s.launches,
        graph_launches: s.graph_launches,
        h2d: transfer(0),
        d2h: transfer(1),
        d2d: transfer(2),
        other_copies: transfer(3),
        syncs: s.syncs,
        sync_seconds: s.sync_ns as f64 / 1e9,
    }
}

/// The share of the window the workload's training loop (every thread of its GPU processes:
/// autograd launches the backward pass from a thread of its own) was at work.
fn loop_busy(w: &Workload, window: f64) -> Option<f64> {
    w.stalls.as_ref()?.loop_busy(window)
}

/// Why a workload whose GPU sat `idle` (share of the window) needs the evidence, in words, or
/// `None`.
fn needs(w: &Workload, idle: f64, window: f64, c: &CudaTracingConfig) -> Option<String> {
    let loop_busy = loop_busy(w, window)?;
    (!w.exited && idle >= c.idle_share && loop_busy >= c.active_share).then(|| {
        format!(
            "{}: GPU idle {:.0}% while its training loop is busy {:.0}%",
            w.name,
            idle * 100.0,
            loop_busy * 100.0
        )
    })
}

/// The first workload of a published round whose GPU idles while its training loop works.
fn needs_evidence(snap: &Snapshot, c: &CudaTracingConfig) -> Option<String> {
    let window = snap.window_seconds.filter(|w| *w > 0.0)?;
    snap.workloads
        .iter()
        .find_map(|w| needs(w, w.gpu.kernel_idle_fraction()?, window, c))
}

/// The same of a round as it is taken, before its GPU series: the instantaneous utilisation
/// reading of the GPUs a workload holds alone stands in for its busy share. A trigger only (it
/// can alias with a periodic load); it spares the wait for the series, up to
/// `nvml_series_interval` and more.
fn needs_evidence_now<'a>(
    workloads: impl IntoIterator<Item = &'a Workload>,
    gpus: &[Gpu],
    window: f64,
    c: &CudaTracingConfig,
) -> Option<String> {
    workloads.into_iter().find_map(|w| {
        let readings: Vec<f64> = w
            .gpu
            .per_gpu
            .iter()
            .map(|share| {
                let g = gpus.iter().find(|g| g.device.index == share.index)?;
                let alone = g
                    .processes
                    .iter()
                    .all(|p| p.workload.as_ref() == Some(&w.id));
                alone.then_some(g.device.utilization_gpu_percent? as f64 / 100.0)
            })
            .collect::<Option<_>>()?;
        if readings.is_empty() {
            return None;
        }
        let busy = readings.iter().sum::<f64>() / readings.len() as f64;
        needs(w, 1.0 - busy, window, c)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, snapshot};
    use crate::model::{ProcessRole, ProcessStall, StallWindow, ThreadTimes};

    fn round(busy: f64, trainer_on_cpu: f64) -> Snapshot {
        let mut w = container("trainer");
        w.gpu.processes = 1;
        w.gpu.busy_fraction = Some(busy);
        w.stalls = Some(StallWindow {
            cgroup_id: 1,
            processes: vec![ProcessStall {
                pid: 7,
                role: ProcessRole::Gpu,
                on_cpu_seconds: trainer_on_cpu,
                runq_seconds: 0.0,
                blocked_seconds: 0.0,
                sleep_seconds: 1.0 - trainer_on_cpu,
                switches: 3,
                blocked_switches: 0,
                main_thread: Some(ThreadTimes {
                    on_cpu_seconds: trainer_on_cpu,
                    sleep_seconds: 1.0 - trainer_on_cpu,
                    ..Default::default()
                }),
            }],
            reads: Default::default(),
            disk: Default::default(),
            io_traced: true,
        });
        snapshot(0, Vec::new(), vec![w])
    }

    #[test]
    fn wanted_while_a_gpu_idles_under_a_busy_training_loop_at_the_thresholds() {
        let c = CudaTracingConfig::default();
        // idle 0.25 and busy 0.5 are in; a hair below either is out
        assert!(needs_evidence(&round(0.75, 0.5), &c).is_some());
        assert!(needs_evidence(&round(0.76, 0.5), &c).is_none());
        assert!(needs_evidence(&round(0.75, 0.49), &c).is_none());
        let why = needs_evidence(&round(0.2, 0.97), &c).unwrap();
        assert!(
            why.contains("GPU idle 80% while its training loop is busy 97%"),
            "{why}"
        );
    }

    #[test]
    fn a_gpu_kept_busy_by_other_holders_is_not_idle() {
        use crate::model::WorkloadGpuShare;
        let c = CudaTracingConfig::default();
        // Its own share 12 % of a GPU all holders kept busy `device` of the window.
        let shared = |device: f64| {
            let mut snap = round(0.12, 0.9);
            let mut share = WorkloadGpuShare::new(0, None);
            share.busy_fraction = Some(0.12);
            share.device_busy_fraction = Some(device);
            snap.workloads[0].gpu.per_gpu = vec![share];
            snap
        };
        // Busy 95 % with the others' kernels: the wait is contention, not the loop's.
        assert!(needs_evidence(&shared(0.95), &c).is_none());
        // The GPU's own idle time at the threshold (0.25) and a hair under it.
        assert!(needs_evidence(&shared(0.75), &c).is_some());
        assert!(needs_evidence(&shared(0.76), &c).is_none());
        let why = needs_evidence(&shared(0.4), &c).unwrap();
        assert!(why.contains("GPU idle 60%"), "{why}");
    }

    #[test]
    fn a_round_as_taken_needs_it_from_the_gpus_reading_when_held_alone() {
        use crate::model::test_support::{gpu, process};
        use crate::model::WorkloadGpuShare;
        let c = CudaTracingConfig::default();
        let mut snap = round(0.0, 0.9);
        let w = &mut snap.workloads[0];
        w.gpu.busy_fraction = None; // not known until the series
        w.gpu.per_gpu.push(WorkloadGpuShare::new(0, None));
        let mut g = gpu(0);
        g.processes.push(process(7, Some(&w.id), 1 << 30));
        g.device.utilization_gpu_percent = Some(75);
        let w = &snap.workloads[0];
        assert!(needs_evidence_now([w], std::slice::from_ref(&g), 1.0, &c).is_some());
        g.device.utilization_gpu_percent = Some(76);
        assert!(needs_evidence_now([w], std::slice::from_ref(&g), 1.0, &c).is_none());
        // another workload's process on it: the reading is not this workload's
        g.device.utilization_gpu_percent = Some(20);
        g.processes.push(process(8, None, 1 << 30));
        assert!(needs_evidence_now([w], std::slice::from_ref(&g), 1.0, &c).is_none());
    }

    #[test]
    fn deltas_refuse_counters_that_went_backwards() {
        let mut before = CudaStats {
            launches: 10,
            ..Default::default()
        };
        before.copies[0].bytes = 100;
        let mut now = before;
        now.launches = 15;
        now.copies[0].bytes = 164;
        let d = delta(&now, &before).unwrap();
        assert_eq!((d.launches, d.copies[0].bytes), (5, 64));
        now.copies[0].bytes = 50;
        assert!(delta(&now, &before).is_none());
    }
}
