//! The sampler: one round reads every source once and assembles a [`Snapshot`].
//!
//! Data flows one way: sources → attribution → snapshot. Per round the cost is the NVML queries,
//! `/proc` reads only for PIDs new to this round (see [`crate::attribution`]), a few cgroup files
//! per workload and one walk of the probe's map; Docker metadata comes from the cache.
use crate::analysis::{self, VerdictConfig};
use crate::attribution::{read_process, AttributionError, ProcessTable};
use crate::cgroup::stats::CgroupStatsPaths;
use crate::cgroup::{classify, CgroupLayout, CgroupMembership, WorkloadId, WorkloadKind};
use crate::events::{EventCounters, InternalEvent};
use crate::health::headroom::{self, HeadroomConfig};
use crate::snapshot::{
    ContainerMeta, CpuUsage, Gpu, GpuProcess, HostInfo, IoSummary, MemoryUsage, ProbeHealth,
    ProcessRole, ProcessStall, Snapshot, SourceState, Sources, StallWindow, Workload, WorkloadGpu,
    WorkloadGpuShare, SCHEMA_VERSION,
};
use crate::sources::docker::{ContainerInfo, DockerCache};
use crate::sources::gpu::{GpuSource, GpuSourceConfig};
use crate::sources::stall_probe::{Accumulate, ProbeTotals, StallProbe};
use monitor_common::{probe_stat, IoStats, TaskKey, TaskTimes, LATENCY_BUCKETS};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What the sampler reads and how.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// `None` turns the GPU source off.
    pub gpu: Option<GpuSourceConfig>,
    /// Load the eBPF scheduler probe.
    pub probes: bool,
    /// Where `/proc` is (tests and containerised agents may differ).
    pub proc_root: PathBuf,
    /// Re-read `/proc` for a PID that stayed on a GPU after this many rounds (cgroup moves).
    pub revalidate_rounds: u64,
    pub verdict: VerdictConfig,
    pub headroom: HeadroomConfig,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            gpu: Some(GpuSourceConfig::default()),
            probes: true,
            proc_root: PathBuf::from("/proc"),
            revalidate_rounds: 30,
            verdict: VerdictConfig::default(),
            headroom: HeadroomConfig::default(),
        }
    }
}

/// A workload's cgroup, resolved once from a member process.
struct WorkloadCgroup {
    path: String,
    stats: Result<CgroupStatsPaths, String>,
    /// Inode of the unified-hierarchy directory: the id eBPF reports.
    cgroup_id: Option<u64>,
    /// A directory of the cgroup, to notice when it is removed (the workload stopped).
    dir: Option<PathBuf>,
}

#[derive(Default, Clone, Copy)]
struct Previous {
    cpu_seconds: Option<f64>,
    throttled_seconds: Option<f64>,
}

pub struct Sampler {
    layout: CgroupLayout,
    host: HostInfo,
    gpu: Result<GpuSource, String>,
    docker: Option<Arc<DockerCache>>,
    probe: Result<StallProbe, String>,
    processes: ProcessTable,
    proc_root: PathBuf,
    cgroups: HashMap<WorkloadId, WorkloadCgroup>,
    previous: HashMap<WorkloadId, Previous>,
    previous_at: Option<Instant>,
    /// The probe counters of this round and of the previous one (swapped each round).
    totals: ProbeTotals,
    previous_totals: Option<ProbeTotals>,
    verdict: VerdictConfig,
    headroom: HeadroomConfig,
    /// The kernel side's failure counters as last read.
    latest_failures: [u64; probe_stat::COUNT as usize],
    /// The previous round's workloads, to report one that stops with its partial window.
    last_workloads: BTreeMap<WorkloadId, Workload>,
    /// The previous round's GPU processes and their workloads, to attribute one that exits.
    last_pid_workload: HashMap<u32, WorkloadId>,
    events: Arc<EventCounters>,
}

impl Sampler {
    /// Opens the sources. None of them failing stops the sampler: each is reported as down.
    pub fn new(
        config: &SamplerConfig,
        docker: Option<Arc<DockerCache>>,
        events: Arc<EventCounters>,
    ) -> Self {
        let layout = CgroupLayout::detect().unwrap_or_else(|e| {
            tracing::warn!(
                "cannot detect the cgroup layout ({e}); treating every process as the host"
            );
            CgroupLayout::from_mountinfo("")
        });
        let gpu = match &config.gpu {
            None => Err("disabled".to_owned()),
            Some(c) => GpuSource::open(c, events.clone()).map_err(|e| e.to_string()),
        };
        if let Err(e) = &gpu {
            if config.gpu.is_some() {
                tracing::warn!("GPU source unavailable: {e}; listing containers without GPU data");
            }
        }
        let probe = if config.probes {
            StallProbe::load(true).map_err(|e| format!("stall tracing unavailable: {e}"))
        } else {
            Err("stall tracing disabled".to_owned())
        };
        if let (true, Err(e)) = (config.probes, &probe) {
            tracing::warn!("{e}");
        }
        let host = HostInfo {
            hostname: read_trimmed("/proc/sys/kernel/hostname"),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            cgroup_mode: layout.mode,
            nvml_driver_version: gpu.as_ref().ok().and_then(|g| g.driver_version.clone()),
        };
        Self {
            layout,
            host,
            gpu,
            docker,
            probe,
            processes: ProcessTable::new(&config.proc_root, config.revalidate_rounds),
            proc_root: config.proc_root.clone(),
            cgroups: HashMap::new(),
            previous: HashMap::new(),
            previous_at: None,
            totals: ProbeTotals::default(),
            previous_totals: None,
            verdict: config.verdict,
            headroom: config.headroom,
            latest_failures: [0; probe_stat::COUNT as usize],
            last_workloads: BTreeMap::new(),
            last_pid_workload: HashMap::new(),
            events,
        }
    }

    /// Between rounds further apart than about a second: pulls NVML's per-process samples so
    /// none age out of the driver's short history before the next round.
    pub fn poll(&mut self) {
        if let Ok(g) = &mut self.gpu {
            g.poll_samples();
        }
    }

    /// Reads every source once and returns the snapshot of this round.
    pub fn round(&mut self) -> Snapshot {
        let started = Instant::now();
        let taken_at = time::OffsetDateTime::now_utc();
        let window_seconds = self
            .previous_at
            .map(|p| started.duration_since(p).as_secs_f64());

        // 1. GPUs and their processes, attributed.
        let nvml_started = Instant::now();
        let (readings, nvml_query_seconds) = match &mut self.gpu {
            Ok(g) => (g.collect(), Some(nvml_started.elapsed().as_secs_f64())),
            Err(_) => (Vec::new(), None),
        };
        self.processes.begin_round();
        let mut gpus = Vec::with_capacity(readings.len());
        let mut new_memberships: Vec<(WorkloadId, CgroupMembership)> = Vec::new();
        for mut device in readings {
            let processes = std::mem::take(&mut device.processes)
                .into_iter()
                .map(|reading| {
                    let pid = reading.pid;
                    match self.processes.resolve(pid) {
                        Ok(info) => {
                            if !self.cgroups.contains_key(&info.workload) {
                                new_memberships
                                    .push((info.workload.clone(), info.membership.clone()));
                            }
                            let (start, command, workload) = (
                                info.key.start_time,
                                info.name.clone(),
                                info.workload.clone(),
                            );
                            let state = (reading.samples == 0)
                                .then(|| self.processes.state(pid))
                                .flatten();
                            GpuProcess {
                                reading,
                                start_time_ticks: Some(start),
                                command: Some(command),
                                workload: Some(workload),
                                vanished: false,
                                state,
                            }
                        }
                        Err(e) => {
                            let vanished = matches!(e, AttributionError::Vanished { .. });
                            let event = if vanished {
                                InternalEvent::GpuProcessVanished
                            } else {
                                InternalEvent::ProcReadFailed
                            };
                            self.events
                                .emit(event, format_args!("GPU {}: {e}", device.index));
                            GpuProcess {
                                reading,
                                start_time_ticks: None,
                                command: None,
                                // gone since the last round: its samples up to the exit still
                                // belong to the workload it had then
                                workload: vanished
                                    .then(|| self.last_pid_workload.get(&pid).cloned())
                                    .flatten(),
                                vanished,
                                state: None,
                            }
                        }
                    }
                })
                .collect();
            gpus.push(Gpu { device, processes });
        }
        self.processes.end_round();
        self.last_pid_workload = gpus
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| !p.vanished)
            .filter_map(|p| Some((p.reading.pid, p.workload.clone()?)))
            .collect();
        for (id, membership) in new_memberships {
            self.remember_cgroup(id, &membership);
        }

        // 2. The workloads: running containers, plus whatever holds a GPU.
        let mut workloads: BTreeMap<WorkloadId, Workload> = BTreeMap::new();
        let docker_state = match &self.docker {
            None => SourceState::down("disabled"),
            Some(cache) => {
                let status = cache.status();
                if status.up {
                    SourceState::up()
                } else {
                    SourceState::down(
                        status
                            .error
                            .unwrap_or_else(|| "not connected yet".to_owned()),
                    )
                }
            }
        };
        // While Docker is away the cache keeps the last known containers (names stay right).
        let containers: Vec<Arc<ContainerInfo>> = self
            .docker
            .as_ref()
            .map(|c| c.containers())
            .unwrap_or_default();
        for c in &containers {
            let id = WorkloadId {
                kind: WorkloadKind::Docker,
                id: c.id.clone(),
            };
            if !self.cgroups.contains_key(&id) {
                if let Some(pid) = c.init_pid {
                    match read_process(&self.proc_root, pid) {
                        Ok(info) => self.remember_cgroup(id.clone(), &info.membership),
                        Err(e) => self.events.emit(
                            InternalEvent::ProcReadFailed,
                            format_args!("container {} init process: {e}", c.name),
                        ),
                    }
                }
            }
            workloads.insert(id.clone(), new_workload(id, Some(c)));
        }
        // Containers the cache does not know are found in the cgroup tree when Docker is down.
        if !docker_state.up {
            for (id, path) in discover_docker_cgroups(&self.layout) {
                if !self.cgroups.contains_key(&id) {
                    let membership = membership_for_path(&self.layout, &path);
                    self.remember_cgroup(id.clone(), &membership);
                }
                workloads
                    .entry(id.clone())
                    .or_insert_with(|| new_workload(id, None));
            }
        }
        // Workloads that stopped since the last round: their last, partial window.
        let ended: Vec<WorkloadId> = self
            .last_workloads
            .keys()
            .filter(|id| !workloads.contains_key(*id))
            .filter(|id| {
                let dir = self.cgroups.get(*id).and_then(|c| c.dir.as_ref());
                dir.is_some_and(|d| !d.exists())
            })
            .cloned()
            .collect();
        for id in ended {
            if let Some(mut w) = self.last_workloads.remove(&id) {
                w.exited = true;
                w.gpu = WorkloadGpu::default();
                w.stalls = None;
                w.verdict = None;
                w.errors.clear();
                if let Some(c) = &mut w.cpu {
                    c.cores = None;
                    c.throttled_fraction = None;
                }
                workloads.insert(id, w);
            }
        }
        let window = window_seconds.filter(|w| *w > 0.0);
        let mut gpu_pids: HashSet<u32> = HashSet::new();
        for gpu in &gpus {
            for p in &gpu.processes {
                let Some(id) = &p.workload else { continue };
                gpu_pids.insert(p.reading.pid);
                let w = workloads
                    .entry(id.clone())
                    .or_insert_with(|| new_workload(id.clone(), None));
                add_gpu_share(&mut w.gpu, gpu, p);
            }
        }
        for w in workloads.values_mut() {
            finish_gpu_shares(&mut w.gpu, window);
        }

        // 3. Cgroup counters and what the probes saw.
        let probe_ok = self.read_probe(&workloads);
        for (id, w) in &mut workloads {
            let prev = self.previous.get(id).copied().unwrap_or_default();
            let mut now = Previous::default();
            if let Some(cg) = self.cgroups.get(id) {
                w.cgroup_path = Some(cg.path.clone());
                // An exited workload's cgroup is gone: it keeps the values last read.
                let stats = if w.exited { None } else { Some(&cg.stats) };
                match stats {
                    None => {}
                    Some(Ok(paths)) => match paths.read() {
                        Ok(u) => {
                            let rate =
                                |now: Option<f64>, before: Option<f64>| match (now, before, window)
                                {
                                    (Some(n), Some(b), Some(win)) => Some(((n - b) / win).max(0.0)),
                                    _ => None,
                                };
                            w.cpu = Some(CpuUsage {
                                usage_seconds_total: u.cpu_usage_seconds_total,
                                cores: rate(Some(u.cpu_usage_seconds_total), prev.cpu_seconds),
                                limit_cores: u.cpu_limit_cores,
                                throttled_seconds_total: u.throttled_seconds_total,
                                throttled_fraction: rate(
                                    u.throttled_seconds_total,
                                    prev.throttled_seconds,
                                )
                                .map(|f| f.min(1.0)),
                            });
                            now.throttled_seconds = u.throttled_seconds_total;
                            w.memory = Some(MemoryUsage {
                                usage_bytes: u.memory_bytes,
                                limit_bytes: u.memory_limit_bytes,
                            });
                            now.cpu_seconds = Some(u.cpu_usage_seconds_total);
                        }
                        Err(e) => {
                            self.events
                                .emit(InternalEvent::CgroupStatsFailed, format_args!("{id}: {e}"));
                            w.errors.insert("cgroup", e.to_string());
                        }
                    },
                    Some(Err(e)) => {
                        w.errors.insert("cgroup", e.clone());
                    }
                }
                if let (Some(cgroup_id), true) = (cg.cgroup_id, probe_ok) {
                    w.stalls = self.stall_window(cgroup_id, &gpu_pids);
                }
            } else {
                w.errors.insert(
                    "cgroup",
                    "no member process to locate the cgroup".to_owned(),
                );
            }
            self.previous.insert(id.clone(), now);
        }
        self.previous.retain(|id, _| workloads.contains_key(id));
        if probe_ok {
            self.forget_exited_tasks();
            let current = std::mem::take(&mut self.totals);
            self.totals = self.previous_totals.take().unwrap_or_default();
            self.previous_totals = Some(current);
        }
        self.cgroups.retain(|id, _| workloads.contains_key(id));
        self.previous_at = Some(started);

        let sources = Sources {
            nvml: match &self.gpu {
                Ok(_) => SourceState::up(),
                Err(e) => SourceState::down(e.clone()),
            },
            docker: docker_state,
            ebpf: match &self.probe {
                Ok(p) if p.missing.is_empty() => SourceState::up(),
                Ok(p) => SourceState {
                    up: true,
                    detail: Some(format!(
                        "not traced on this kernel: {}",
                        p.missing.join("; ")
                    )),
                },
                Err(e) => SourceState::down(e.clone()),
            },
        };
        let mut workloads: Vec<Workload> = workloads.into_values().collect();
        for w in &mut workloads {
            w.verdict = analysis::assess(w, window, &sources.ebpf, &self.verdict);
            w.oom_headroom = headroom::oom_headroom(w, &gpus, &self.headroom);
        }
        self.last_workloads = workloads
            .iter()
            .filter(|w| !w.exited)
            .map(|w| (w.id.clone(), w.clone()))
            .collect();
        workloads.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        Snapshot {
            schema_version: SCHEMA_VERSION,
            taken_at: taken_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            taken_at_unix_ms: (taken_at.unix_timestamp_nanos() / 1_000_000) as u64,
            window_seconds,
            collection_seconds: started.elapsed().as_secs_f64(),
            nvml_query_seconds,
            host: self.host.clone(),
            sources,
            gpus,
            workloads,
            internal_events: self.events.to_map(),
            probes: self.probe.as_ref().ok().map(|p| ProbeHealth {
                missing: p.missing.clone(),
                map_update_failed: self.latest_failures[probe_stat::MAP_UPDATE_FAILED as usize],
                field_read_failed: self.latest_failures[probe_stat::FIELD_READ_FAILED as usize],
                unmatched_end: self.latest_failures[probe_stat::UNMATCHED_END as usize],
            }),
        }
    }

    fn remember_cgroup(&mut self, id: WorkloadId, membership: &CgroupMembership) {
        let path = membership.identity_path().to_owned();
        let stats = CgroupStatsPaths::resolve(&self.layout, membership).map_err(|e| e.to_string());
        let cgroup_id = membership
            .unified_dir(&self.layout)
            .and_then(|d| std::fs::metadata(d).ok())
            .map(|m| m.ino());
        // The root cgroup never goes away; any other one does when its workload stops.
        let dir = (path != "/")
            .then(|| {
                membership
                    .unified_dir(&self.layout)
                    .or_else(|| membership.controller_dir(&self.layout, "memory"))
            })
            .flatten();
        self.cgroups.insert(
            id,
            WorkloadCgroup {
                path,
                stats,
                cgroup_id,
                dir,
            },
        );
    }

    /// Points the kernel filter at this round's workloads and reads the counters into
    /// `self.totals`. False when there is no probe or the read failed.
    fn read_probe(&mut self, workloads: &BTreeMap<WorkloadId, Workload>) -> bool {
        let Ok(probe) = self.probe.as_mut() else {
            return false;
        };
        let ids: HashSet<u64> = workloads
            .keys()
            .filter_map(|id| self.cgroups.get(id)?.cgroup_id)
            .collect();
        if let Err(e) = probe.watch(&ids) {
            self.events.emit(InternalEvent::ProbeMapReadFailed, &e);
        }
        match probe.read(&mut self.totals) {
            Ok(()) => {
                self.latest_failures = self.totals.failures;
                let evicted = self.totals.evicted_during_read;
                if evicted > 0 {
                    self.events.add(InternalEvent::ProbeEntriesEvicted, evicted);
                }
                true
            }
            Err(e) => {
                self.events.emit(InternalEvent::ProbeMapReadFailed, &e);
                false
            }
        }
    }

    /// Drops from the probe maps the tasks that have exited and whose counters did not move in
    /// this round (their last window is already counted).
    fn forget_exited_tasks(&mut self) {
        let (Ok(probe), Some(previous)) = (self.probe.as_mut(), self.previous_totals.as_ref())
        else {
            return;
        };
        let gone: Vec<TaskKey> = self
            .totals
            .times
            .iter()
            .filter(|(k, now)| {
                previous.times.get(k) == Some(now)
                    && !self.proc_root.join(k.tgid.to_string()).exists()
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

    /// One cgroup's window: this round's counters minus the previous round's. `None` until
    /// there is a previous round.
    fn stall_window(&self, cgroup_id: u64, gpu_pids: &HashSet<u32>) -> Option<StallWindow> {
        let previous = self.previous_totals.as_ref()?;
        let mut processes = Vec::new();
        for (key, now) in self
            .totals
            .times
            .iter()
            .filter(|(k, _)| k.cgroup_id == cgroup_id)
        {
            let d = match previous.times.get(key) {
                Some(before) => times_delta(now, before).unwrap_or_else(|| {
                    // evicted and re-created since the last round: only the new part is known
                    self.events.add(InternalEvent::ProbeEntriesEvicted, 1);
                    *now
                }),
                None => *now,
            };
            if d.switches == 0 && d.on_cpu_ns + d.runq_ns + d.blocked_ns + d.sleep_ns == 0 {
                continue;
            }
            let s = |ns: u64| ns as f64 / 1e9;
            processes.push(ProcessStall {
                pid: key.tgid,
                role: if gpu_pids.contains(&key.tgid) {
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
            });
        }
        processes.sort_by_key(|p| p.pid);
        Some(StallWindow {
            cgroup_id,
            processes,
            reads: io_window(cgroup_id, &self.totals.reads, &previous.reads),
            disk: io_window(cgroup_id, &self.totals.disk, &previous.disk),
        })
    }
}

/// The I/O of one cgroup in the window, all its processes together.
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
pub fn io_summary(s: &IoStats) -> IoSummary {
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

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn new_workload(id: WorkloadId, container: Option<&Arc<ContainerInfo>>) -> Workload {
    let name = match (container, id.kind) {
        (Some(c), _) => c.name.clone(),
        (None, WorkloadKind::Docker | WorkloadKind::Podman) => id.id.chars().take(12).collect(),
        (None, _) => id.id.clone(),
    };
    let meta = container.map(|c| ContainerMeta::from(c.as_ref()));
    Workload::new(id, name, meta)
}

fn add_gpu_share(w: &mut WorkloadGpu, gpu: &Gpu, p: &GpuProcess) {
    let mem = p.reading.used_memory_bytes.unwrap_or(0);
    w.memory_bytes += mem;
    w.processes += 1;
    let share = match w
        .per_gpu
        .iter_mut()
        .position(|s| s.index == gpu.device.index)
    {
        Some(i) => &mut w.per_gpu[i],
        None => {
            w.per_gpu.push(WorkloadGpuShare {
                index: gpu.device.index,
                uuid: gpu.device.uuid.clone(),
                memory_bytes: 0,
                sm_util_percent: None,
                sm_busy_seconds: 0.0,
                busy_fraction: None,
                device_utilization_percent: gpu.device.utilization_gpu_percent,
                pids: Vec::new(),
            });
            w.per_gpu.last_mut().expect("just pushed")
        }
    };
    share.memory_bytes += mem;
    share.pids.push(p.reading.pid);
    if let Some(sm) = p.reading.sm_util_percent {
        *share.sm_util_percent.get_or_insert(0.0) += sm;
    }
    share.sm_busy_seconds += p.reading.sm_busy_seconds;
}

/// Busy fractions per GPU and overall, once all of the workload's processes are added.
fn finish_gpu_shares(w: &mut WorkloadGpu, window: Option<f64>) {
    let Some(window) = window else { return };
    for share in &mut w.per_gpu {
        share.busy_fraction = Some((share.sm_busy_seconds / window).min(1.0));
    }
    if !w.per_gpu.is_empty() {
        let sum: f64 = w.per_gpu.iter().filter_map(|s| s.busy_fraction).sum();
        w.busy_fraction = Some(sum / w.per_gpu.len() as f64);
    }
}

/// Docker containers visible in the cgroup tree (cgroupfs `/docker/<id>` and systemd
/// `/system.slice/docker-<id>.scope`), for when the daemon cannot be asked.
fn discover_docker_cgroups(layout: &CgroupLayout) -> Vec<(WorkloadId, String)> {
    let root = layout.unified.clone().or_else(|| {
        layout
            .v1_mount("name=systemd")
            .or_else(|| layout.v1_mount("cpu"))
            .map(|h| h.mount_point.clone())
    });
    let Some(root) = root else { return Vec::new() };
    let mut found = Vec::new();
    for parent in ["docker", "system.slice"] {
        let Ok(dir) = std::fs::read_dir(root.join(parent)) else {
            continue;
        };
        for entry in dir.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = format!("/{parent}/{}", entry.file_name().to_string_lossy());
            let id = classify(&path);
            if id.kind == WorkloadKind::Docker {
                found.push((id, path));
            }
        }
    }
    found
}

/// The membership a process in `path` would have: cgroupfs-driver runtimes use the same path in
/// every hierarchy.
fn membership_for_path(layout: &CgroupLayout, path: &str) -> CgroupMembership {
    CgroupMembership {
        unified: layout.unified.as_ref().map(|_| path.to_owned()),
        v1: layout
            .v1
            .iter()
            .map(|h| (h.controllers.clone(), path.to_owned()))
            .collect(),
    }
}
