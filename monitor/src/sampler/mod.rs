//! The sampler: one round reads every source once and assembles a [`Snapshot`].
//!
//! Data flows one way: sources → attribution → snapshot. Per round the cost is NVML's cheap
//! calls, `/proc` reads only for PIDs new to this round (see [`attribution`]) and a slice
//! of the others' state ([`process_checks`]), a few cgroup files per workload and one walk
//! of the probe's maps; Docker metadata comes from the cache. Every `series_interval` a round
//! also fetches the GPU utilisation series, and rounds wait in [`pending`] until the series
//! covers them.
pub mod attribution;
mod busy_split;
mod cgroup_vetting;
mod cgroups;
mod config_reader;
pub mod cuda_tracing;
pub mod demand;
mod gpu_open;
mod gpu_side;
pub mod io_tracing;
mod pending;
pub mod process_checks;
mod rank_envs;
mod stalls;

use crate::events::{
    CgroupStatsFailed, CriSpecUnreadable, EventCounters, GpuProcessVanished, ProcReadFailed,
};
use crate::heartbeat::{Heartbeat, Step};
use crate::model::{BlindSpot, ContainerInfo, DeviceReading, WorkloadId, WorkloadKind};
use crate::model::{
    CpuUsage, Gpu, GpuProcess, HostInfo, MemoryUsage, Pressure, PressureTotals, ProcessCpu,
    Snapshot, SourceState, Sources, Workload, WorkloadGpu, WorkloadGpuShare, SCHEMA_VERSION,
};
use crate::sources::containerd::CriTasks;
use crate::sources::docker::DockerCache;
use crate::sources::gpu::GpuSourceConfig;
use crate::sources::host::cgroup::namespace::NamespaceRoot;
use crate::sources::host::cgroup::{CgroupLayout, CgroupMembership};
use crate::sources::host::pid::{PidMap, PidSet};
use crate::sources::host::{cgroup_tree, system, HostReader};
use attribution::{ProcessReadError, ProcessTable};
use cgroups::{membership_for_path, WorkloadCgroup};
use config_reader::ConfigReader;
pub use gpu_open::{DRIVER_LIST_CHECK_EVERY, GPU_RETRY_FIRST, GPU_RETRY_MAX};
use gpu_side::GpuSide;
use pending::PendingRound;
use process_checks::ProcessChecks;
use stalls::Stalls;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// How often the GPU utilisation series (and GPM, and the shared GPUs' split) is fetched.
    /// Rounds are published once the series covers them, so up to this much late. The driver
    /// keeps about 14 s of series: longer intervals lose part of it.
    pub series_interval: Duration,
    /// When the read and block programs are attached.
    pub io_tracing: io_tracing::IoTracingConfig,
    /// When the CUDA driver probes are attached.
    pub cuda_tracing: cuda_tracing::CudaTracingConfig,
    /// containerd's running tasks (`io.containerd.runtime.v2.task`), to name the pods of
    /// containerd nodes; `None` turns it off.
    pub cri_tasks: Option<PathBuf>,
}

/// Why a blkio-throttled container's `stalls.disk` misses requests. The throttle queues the
/// bios over its limit and submits them later from a kernel worker (`blk_throtl_dispatch_work_fn`
/// calls `submit_bio_noacct_nocheck`, which fires `block_bio_queue`; `block_rq_issue` follows
/// there), so no block tracepoint runs in the container's task for them; bios within the limit
/// go through in the task and are counted. Measured: a container reading 256 KiB direct reads
/// under `--device-read-bps 1mb` showed 29 requests, 116 KiB, against its reads' MiBs.
const DISK_UNDER_THROTTLE: &str = "incomplete: the container's block I/O is throttled \
    (--device-read-bps and the like), and the kernel issues the requests it holds back from \
    its own worker thread, where they cannot be attributed; the read latency in stalls.reads \
    includes the throttle's wait";

/// The default series interval: 10 s, within the H200 driver's 14 s of history.
pub const DEFAULT_SERIES_INTERVAL: Duration = Duration::from_secs(10);

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            gpu: Some(GpuSourceConfig::default()),
            probes: true,
            proc_root: PathBuf::from("/proc"),
            cri_tasks: Some(PathBuf::from(crate::sources::containerd::DEFAULT_TASK_DIR)),
            revalidate_rounds: 30,
            series_interval: DEFAULT_SERIES_INTERVAL,
            io_tracing: io_tracing::IoTracingConfig::default(),
            cuda_tracing: cuda_tracing::CudaTracingConfig::default(),
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Previous {
    cpu_seconds: Option<f64>,
    throttled_seconds: Option<f64>,
    pressure: Option<PressureTotals>,
}

pub struct Sampler {
    layout: CgroupLayout,
    host: HostInfo,
    /// NVML, and the rounds waiting for its series.
    gpu_side: GpuSide,
    docker: Option<Arc<DockerCache>>,
    /// Names the pods of containerd nodes, where no Docker lists them.
    cri: Option<CriTasks>,
    stalls: Stalls,
    /// The CUDA driver probes.
    cuda: cuda_tracing::CudaTracing,
    processes: ProcessTable,
    checks: ProcessChecks,
    /// The launch environment of each rank of a job holding several GPUs.
    rank_envs: rank_envs::RankEnvs,
    /// `/proc`, read from the agent's cgroup namespace.
    host_reader: HostReader,
    container_configs: ConfigReader,
    /// The containers the cgroup tree shows, while Docker cannot be asked.
    docker_cgroups: cgroup_tree::DockerCgroupScan,
    /// The engine's containers' own cgroup paths, to tell a container from a look-alike.
    vetting: cgroup_vetting::CgroupVetting,
    cgroups: HashMap<WorkloadId, WorkloadCgroup>,
    previous: HashMap<WorkloadId, Previous>,
    previous_at: Option<(Instant, u64)>,
    /// The previous round's workloads, to report one that stops with its partial window.
    last_workloads: BTreeMap<WorkloadId, Workload>,
    /// The previous round's GPU processes and their workloads, to attribute one that exits.
    last_pid_workload: PidMap<WorkloadId>,
    events: Arc<EventCounters>,
    /// Which step a round is in, for the watchdog on another thread.
    heartbeat: Arc<Heartbeat>,
}

fn now_unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
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
        // The probes first: loading them parses the kernel's BTF twice (ours for five field
        // offsets, aya's in `EbpfLoader::new`, ~23 MB at its peak), all freed again at once.
        // Handed back to the system before NVML's own allocations (~18 MB on an H200) come,
        // the two peaks do not add up, and the heap does not keep it for the agent's whole life.
        let linger = |l| demand::effective_linger(l, config.series_interval);
        let io_tracing = io_tracing::IoTracingConfig {
            linger: linger(config.io_tracing.linger),
            ..config.io_tracing
        };
        let cuda_tracing = cuda_tracing::CudaTracingConfig {
            linger: linger(config.cuda_tracing.linger),
            ..config.cuda_tracing
        };
        let stalls = Stalls::load(config.probes, io_tracing);
        let cuda = cuda_tracing::CudaTracing::load(config.probes, cuda_tracing);
        system::trim_heap();
        let (gpu_opener, gpu) = gpu_open::GpuOpener::open(config.gpu.as_ref(), events.clone());
        let heartbeat = Arc::<Heartbeat>::default();
        let host_reader = HostReader::new(&config.proc_root);
        let mut blind_spots = host_reader.blind_spots();
        let cgroup_ns = own_cgroup_namespace(&layout, &config.proc_root, &mut blind_spots);
        let host_reader = host_reader.with_cgroup_namespace(cgroup_ns);
        let host = HostInfo {
            hostname: system::hostname(),
            kernel: system::kernel_release(),
            cgroup_mode: layout.mode,
            nvml_driver_version: gpu.as_ref().ok().and_then(|g| g.driver_version.clone()),
            blind_spots,
        };
        for spot in &host.blind_spots {
            tracing::warn!("{}; {}", spot.consequence(), spot.fix());
        }
        Self {
            layout,
            host,
            docker,
            cri: config.cri_tasks.as_ref().map(CriTasks::new),
            stalls,
            cuda,
            processes: ProcessTable::new(host_reader.clone(), config.revalidate_rounds),
            checks: ProcessChecks::new(&host_reader),
            rank_envs: rank_envs::RankEnvs::new(host_reader.clone()),
            host_reader,
            container_configs: ConfigReader::default(),
            docker_cgroups: cgroup_tree::DockerCgroupScan::default(),
            vetting: cgroup_vetting::CgroupVetting::default(),
            cgroups: HashMap::new(),
            previous: HashMap::new(),
            previous_at: None,
            last_workloads: BTreeMap::new(),
            last_pid_workload: PidMap::default(),
            gpu_side: GpuSide::new(gpu, gpu_opener, config.series_interval, heartbeat.clone()),
            events,
            heartbeat,
        }
    }

    /// Tends the GPU source (see [`GpuSide::tend`]); the rounds it completed.
    fn tend_gpu(&mut self) -> Vec<Snapshot> {
        let keep_from = self.previous_at.map(|p| p.1);
        let tended = self.gpu_side.tend(keep_from);
        if tended.opened {
            self.host.nvml_driver_version = self.gpu_side.driver_version();
        }
        self.completed(tended.done)
    }

    /// Rounds just completed, as of now: the events counted so far (the fetches that completed
    /// them included), and each observed by the probes' demand.
    fn completed(&mut self, mut done: Vec<Snapshot>) -> Vec<Snapshot> {
        for d in &mut done {
            d.internal_events = self.events.to_map();
            self.stalls.observe(d);
            self.cuda.observe(d);
        }
        done
    }

    /// The marks of the round in progress, for a watchdog: which step, since when.
    /// The probes are loaded; programs may be attached later (adaptive read tracing, and the
    /// CUDA driver probes, attached to each new driver library a GPU process maps).
    pub fn probe_use(&self) -> (bool, bool) {
        let (maps, later) = self.stalls.privileged_use();
        let cuda = self.cuda.loaded();
        (maps || cuda, later || cuda)
    }

    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }

    /// Takes a round. Returns the rounds now complete, oldest first: usually none between
    /// series fetches, then those the fetch covers (the first round at once: it has no window).
    pub fn round(&mut self) -> Vec<Snapshot> {
        let mut done = self.tend_gpu();
        let p = self.take_round();
        let keep_from = self.previous_at.map(|p| p.1);
        let held = self.gpu_side.hold(p, keep_from);
        done.extend(self.completed(held));
        done
    }

    /// Fetches the series now and completes every pending round, waiting up to one sample
    /// period for the series to reach the end of the newest window. For the end of a run and
    /// one-shot commands.
    pub fn flush(&mut self) -> Vec<Snapshot> {
        let keep_from = self.previous_at.map(|p| p.1);
        let done = self.gpu_side.flush(keep_from);
        self.completed(done)
    }

    /// Reads every source once into a round that waits for its GPU series.
    fn take_round(&mut self) -> PendingRound {
        let started = Instant::now();
        let monotonic_ms = crate::model::monotonic_now_ms();
        let taken_at = time::OffsetDateTime::now_utc();
        let now_us = (taken_at.unix_timestamp_nanos() / 1000) as u64;
        let window_seconds = self
            .previous_at
            .map(|(p, _)| started.duration_since(p).as_secs_f64());
        let window_us = self.previous_at.map(|(_, a)| (a, now_us));

        let (readings, nvml_query_seconds) = self.gpu_side.readings();
        self.heartbeat.enter(Step::HostReadings);
        let mut gpus = self.attribute(readings);
        // A listed process found gone: the next round asks the driver for the lists again.
        for x in gpus
            .iter()
            .filter(|x| x.processes.iter().any(|p| p.vanished))
        {
            self.gpu_side.relist(x.device.index);
        }
        // Without stall tracing, the GPU processes' CPU time is what tells the training loop's
        // work from the loader's: measured every round then, as on shared GPUs.
        let shared_gpus: Vec<u32> = gpus
            .iter()
            .filter(|g| is_shared(g))
            .map(|g| g.device.index)
            .collect();
        let every_round: Vec<u32> = if self.stalls.source_state().up {
            shared_gpus.clone()
        } else {
            gpus.iter().map(|g| g.device.index).collect()
        };
        self.check_processes(&mut gpus, &every_round);
        let docker_state = self.docker_state();
        let window = window_seconds.filter(|w| *w > 0.0);
        let mut workloads = self.workloads(&docker_state);
        self.add_ended(&mut workloads, &gpus);
        let gpu_pids = join_gpu_holders(&mut workloads, &gpus, |id| self.unverified_container(id));
        self.name_cri_containers(&mut workloads);
        for w in workloads.values_mut() {
            w.ranks = self.rank_envs.ranks(w, &gpus);
        }
        self.rank_envs.end_round();
        self.stalls.step_io(now_us / 1000, &self.events);
        let probe_ok = self.read_counters(&mut workloads, window, &gpu_pids);
        self.read_container_configs(&mut workloads, &gpus, window);
        if probe_ok {
            self.stalls.end_round(&self.host_reader);
        }
        self.cuda.observe_taken(workloads.values(), &gpus, window);
        if self
            .cuda
            .step(&gpus, &self.host_reader, now_us / 1000, &self.events)
        {
            for w in workloads.values_mut() {
                let pids: HashSet<u32> = w
                    .gpu
                    .per_gpu
                    .iter()
                    .flat_map(|g| g.pids.iter().copied())
                    .collect();
                w.cuda = self.cuda.window(&pids);
            }
            self.cuda.end_round(&self.host_reader);
        }
        self.cgroups.retain(|id, _| workloads.contains_key(id));
        self.vetting.retain_listed(self.docker.as_deref());
        self.previous_at = Some((started, now_us));

        let sources = Sources {
            nvml: self.gpu_side.state(),
            docker: docker_state,
            ebpf: self.stalls.source_state(),
            cuda: self.cuda.source_state(),
        };
        let mut workloads: Vec<Workload> = workloads.into_values().collect();
        self.last_workloads = workloads
            .iter()
            .filter(|w| !w.exited)
            .map(|w| (w.id.clone(), w.clone()))
            .collect();
        workloads.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        PendingRound {
            snapshot: Snapshot {
                schema_version: SCHEMA_VERSION,
                taken_at: taken_at
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                taken_at_unix_ms: now_us / 1000,
                monotonic_ms,
                window_seconds,
                collection_seconds: started.elapsed().as_secs_f64(),
                nvml_query_seconds,
                series_fetch_seconds: None,
                sampling_cpu_seconds: self.heartbeat.cpu(),
                host: self.host.clone(),
                sources,
                gpus,
                workloads,
                internal_events: self.events.to_map(),
                probes: self.stalls.health(),
                cuda_tracing: self.cuda.state(),
            },
            window_us,
            taken: started,
            shared_gpus,
        }
    }

    /// The GPU readings with each process attributed to its workload.
    fn attribute(&mut self, readings: Vec<DeviceReading>) -> Vec<Gpu> {
        self.processes.begin_round();
        let mut gpus = Vec::with_capacity(readings.len());
        let mut new_memberships: Vec<(WorkloadId, CgroupMembership)> = Vec::new();
        for mut device in readings {
            let mut processes: Vec<GpuProcess> = Vec::with_capacity(device.processes.len());
            for reading in std::mem::take(&mut device.processes) {
                let known = processes.last().and_then(|p| p.workload.as_ref());
                let p = self.attribute_process(reading, device.index, known, &mut new_memberships);
                processes.push(p);
            }
            gpus.push(Gpu {
                device,
                busy: None,
                sm_activity: None,
                gpm: None,
                pcie: None,
                energy_joules: None,
                processes,
            });
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
        gpus
    }

    /// One process attributed. `known`: a workload already looked up this round (the previous
    /// process's: a job's processes come together), whose cgroup needs no new lookup.
    fn attribute_process(
        &mut self,
        reading: crate::model::ProcessReading,
        gpu_index: u32,
        known: Option<&WorkloadId>,
        new_memberships: &mut Vec<(WorkloadId, CgroupMembership)>,
    ) -> GpuProcess {
        let pid = reading.pid;
        let blank = |reading, workload, vanished| GpuProcess {
            reading,
            start_time_ticks: None,
            command: None,
            workload,
            vanished,
            state: None,
            stuck: false,
            host_cpu_seconds: None,
            driver_sm_percent: None,
            busy_fraction: None,
        };
        match self.processes.resolve(pid) {
            Ok(info) => {
                let workload = self.vetting.vet(
                    info.workload.clone(),
                    info.membership.identity_path(),
                    self.docker.as_deref(),
                    &self.host_reader,
                    &self.events,
                );
                if known != Some(&workload) && !self.cgroups.contains_key(&workload) {
                    new_memberships.push((workload.clone(), info.membership.clone()));
                }
                let mut p = blank(reading, Some(workload), false);
                p.start_time_ticks = Some(info.key.start_time);
                p.command = Some(info.name.clone());
                p
            }
            Err(e) => {
                let vanished = matches!(e, ProcessReadError::Vanished { .. });
                if vanished {
                    self.events.emit(GpuProcessVanished {
                        gpu: gpu_index,
                        error: e.to_string(),
                    });
                } else {
                    self.events.emit(ProcReadFailed {
                        subject: format!("GPU {gpu_index}"),
                        error: e.to_string(),
                    });
                }
                // gone since the last round: its work up to the exit still belongs to the
                // workload it had then
                let workload = vanished
                    .then(|| self.last_pid_workload.get(&pid).cloned())
                    .flatten();
                blank(reading, workload, vanished)
            }
        }
    }

    /// State, stuck-ness and host CPU of the GPU processes: every round on the GPUs in
    /// `every_round` (shared ones: the split's evidence), in rotation on the others (the ghost
    /// rule's).
    fn check_processes(&mut self, gpus: &mut [Gpu], every_round: &[u32]) {
        // Each PID once, however many GPUs it holds (a DDP rank holds them all).
        let mut every = PidSet::default();
        let mut others = PidSet::default();
        for g in gpus.iter() {
            let list = if every_round.contains(&g.device.index) {
                &mut every
            } else {
                &mut others
            };
            list.extend(
                g.processes
                    .iter()
                    .filter(|p| !p.vanished)
                    .map(|p| p.reading.pid),
            );
        }
        let every: Vec<u32> = every.into_iter().collect();
        let mut others: Vec<u32> = others.into_iter().filter(|p| !every.contains(p)).collect();
        // A stable order, so the rotation goes round the same list.
        others.sort_unstable();
        let observed = self.checks.observe(&every, &others);
        for g in gpus.iter_mut() {
            for p in &mut g.processes {
                if let Some(o) = observed.get(&p.reading.pid) {
                    p.state = o.state;
                    p.stuck = o.stuck;
                    p.host_cpu_seconds = o.cpu_seconds;
                }
            }
        }
    }

    fn docker_state(&self) -> SourceState {
        match &self.docker {
            None => SourceState::disabled("disabled"),
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
        }
    }

    /// The round's workloads before the GPU holders join: running containers (from the cache,
    /// which keeps the last known ones while Docker is away), the cgroup tree's containers when
    /// Docker is down, and the workloads that stopped since the last round.
    fn workloads(&mut self, docker_state: &SourceState) -> BTreeMap<WorkloadId, Workload> {
        let mut workloads: BTreeMap<WorkloadId, Workload> = BTreeMap::new();
        let containers: Vec<Arc<ContainerInfo>> = self
            .docker
            .as_ref()
            .map(|c| c.containers())
            .unwrap_or_default();
        for c in &containers {
            let id = self.container_workload(c);
            workloads.insert(id.clone(), new_workload(id, Some(c)));
        }
        if !docker_state.up {
            let found = self
                .docker_cgroups
                .containers(&self.layout, Instant::now())
                .to_vec();
            for (id, path) in found {
                if !self.cgroups.contains_key(&id) {
                    let membership = membership_for_path(&self.layout, &path);
                    self.remember_cgroup(id.clone(), &membership);
                }
                workloads
                    .entry(id.clone())
                    .or_insert_with(|| new_workload(id, None));
            }
        }
        workloads
    }

    /// The workload a listed container is: `docker:<id>`, or its pod's `kubernetes:<uid>/<id>`
    /// where its labels name a pod *and* its init process's cgroup sits under that pod (labels
    /// are the tenant's to set; the cgroup is not). Remembers its cgroup at the first sight.
    fn container_workload(&mut self, c: &ContainerInfo) -> WorkloadId {
        let docker = c.engine_workload_id();
        let labelled = c.workload_id();
        for id in [&labelled, &docker] {
            if self.cgroups.contains_key(id) {
                return id.clone();
            }
        }
        let Some(pid) = c.init_pid else {
            return docker;
        };
        match self.host_reader.process(pid) {
            Ok(info) => {
                let id = if info.workload == labelled {
                    labelled
                } else {
                    docker
                };
                self.remember_cgroup(id.clone(), &info.membership);
                id
            }
            Err(e) => {
                self.events.emit(ProcReadFailed {
                    subject: format!("container {} init process", c.name),
                    error: e.to_string(),
                });
                docker
            }
        }
    }

    /// The Kubernetes workloads no Docker described (a containerd node's pods), named from
    /// containerd's task specs.
    fn name_cri_containers(&mut self, workloads: &mut BTreeMap<WorkloadId, Workload>) {
        let Some(cri) = &mut self.cri else { return };
        for (id, w) in workloads
            .iter_mut()
            .filter(|(id, w)| id.kind == WorkloadKind::Kubernetes && w.container.is_none())
        {
            match cri.container(id) {
                Ok(Some(c)) => {
                    w.name = c.name.clone();
                    w.container = Some(c);
                    w.container_unverified = None;
                }
                Ok(None) => {}
                Err(e) => self.events.emit(CriSpecUnreadable {
                    error: e.to_string(),
                }),
            }
        }
        let live: HashSet<&str> = workloads
            .keys()
            .filter_map(|id| id.container_id())
            .collect();
        cri.retain(|id| live.contains(id));
    }

    /// Why a Docker workload the cache does not hold is still running: Docker lists it, but
    /// inspecting it failed (the cache retries).
    fn unverified_container(&self, id: &WorkloadId) -> Option<String> {
        if !matches!(
            id.kind,
            WorkloadKind::Docker | WorkloadKind::Podman | WorkloadKind::Kubernetes
        ) {
            return None;
        }
        self.docker.as_ref()?.unverified(id.container_id()?)
    }

    /// The previous round's workloads that are not in this one and whose cgroup is gone, marked
    /// as exited with their partial window (before the GPU holders join: a vanished process's
    /// work goes to the exited workload). One a live GPU process still holds is here, and
    /// costs no look at its cgroup directory.
    fn add_ended(&mut self, workloads: &mut BTreeMap<WorkloadId, Workload>, gpus: &[Gpu]) {
        let held: HashSet<&WorkloadId> = gpus
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| !p.vanished)
            .filter_map(|p| p.workload.as_ref())
            .collect();
        let ended: Vec<WorkloadId> = self
            .last_workloads
            .keys()
            .filter(|id| !workloads.contains_key(*id) && !held.contains(id))
            .filter(|id| self.cgroups.get(*id).is_some_and(WorkloadCgroup::removed))
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
    }

    /// Cgroup CPU and memory, and what the probes saw, per workload. Returns whether the probe
    /// counters were read.
    fn read_counters(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        window: Option<f64>,
        gpu_pids: &PidSet,
    ) -> bool {
        let ids: HashSet<u64> = workloads
            .keys()
            .filter_map(|id| self.cgroups.get(id)?.cgroup_id)
            .collect();
        let probe_ok = self.stalls.read(&ids, &self.events);
        for (id, w) in workloads.iter_mut() {
            let prev = self.previous.get(id).copied().unwrap_or_default();
            let mut now = Previous::default();
            let Some(cg) = self.cgroups.get_mut(id) else {
                w.errors.insert(
                    "cgroup",
                    "no member process to locate the cgroup".to_owned(),
                );
                self.previous.insert(id.clone(), now);
                continue;
            };
            w.cgroup_path = Some(cg.path.clone());
            // An exited workload's cgroup is gone: it keeps the values last read.
            if !w.exited {
                match &mut cg.stats {
                    Ok(paths) => match paths.read(&mut cg.limits) {
                        Ok(u) => {
                            let rate = |n: Option<f64>, b: Option<f64>| match (n, b, window) {
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
                                quota_periods: u.periods_total,
                            });
                            now.throttled_seconds = u.throttled_seconds_total;
                            now.pressure = u.pressure;
                            w.pressure = match (prev.pressure, u.pressure, window) {
                                (Some(a), Some(b), Some(win)) => Pressure::between(&a, &b, win),
                                _ => None,
                            };
                            w.memory = Some(MemoryUsage::new(
                                u.memory_bytes,
                                u.memory_limit_bytes,
                                u.page_cache_bytes.map(|c| (c, u.shmem_bytes.unwrap_or(0))),
                            ));
                            now.cpu_seconds = Some(u.cpu_usage_seconds_total);
                        }
                        Err(e) => {
                            self.events.emit(CgroupStatsFailed {
                                workload: id.to_string(),
                                error: e.to_string(),
                            });
                            w.errors.insert("cgroup", e.to_string());
                        }
                    },
                    Err(e) => {
                        w.errors.insert("cgroup", e.to_string());
                    }
                }
            }
            if let (Some(cgroup_id), true) = (cg.cgroup_id, probe_ok) {
                w.stalls =
                    self.stalls
                        .window(cgroup_id, gpu_pids, window, &mut self.checks, &self.events);
            }
            self.previous.insert(id.clone(), now);
        }
        self.previous.retain(|id, _| workloads.contains_key(id));
        probe_ok
    }

    /// Each running container's configuration section (and the note on its disk figures under
    /// blkio throttling), after its counters are read.
    fn read_container_configs(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        gpus: &[Gpu],
        window: Option<f64>,
    ) {
        for w in workloads.values_mut().filter(|w| !w.exited) {
            let Some(c) = &w.container else { continue };
            if c.blkio_throttled && w.stalls.is_some() {
                w.errors.insert("disk", DISK_UNDER_THROTTLE.to_owned());
            }
            let config = self
                .container_configs
                .read(&self.host_reader, c, w, gpus, window);
            w.config = Some(config);
        }
        let running: HashSet<&str> = workloads
            .values()
            .filter(|w| !w.exited)
            .filter_map(|w| Some(w.container.as_ref()?.id.as_str()))
            .collect();
        self.container_configs.retain(|id| running.contains(id));
    }

    fn remember_cgroup(&mut self, id: WorkloadId, membership: &CgroupMembership) {
        self.cgroups
            .insert(id, WorkloadCgroup::resolve(&self.layout, membership));
    }
}

/// True when the GPU's processes belong to more than one workload (an unattributed process
/// counts as one of its own): their busy time must be split.
/// The join: each attributed GPU process's memory goes to its workload's share of that GPU; a
/// workload that holds a GPU but was not listed (a cgroup, a service, a container the engine
/// could not describe: `unverified` says why) is created. Returns the PIDs that hold a GPU.
fn join_gpu_holders(
    workloads: &mut BTreeMap<WorkloadId, Workload>,
    gpus: &[Gpu],
    unverified: impl Fn(&WorkloadId) -> Option<String>,
) -> PidSet {
    let mut gpu_pids = PidSet::default();
    // Each workload's GPU processes with their CPU time, each PID once (a DDP rank holds
    // several GPUs).
    let mut cpu: BTreeMap<&WorkloadId, BTreeMap<u32, Option<f64>>> = BTreeMap::new();
    for gpu in gpus {
        for p in &gpu.processes {
            let Some(id) = &p.workload else { continue };
            gpu_pids.insert(p.reading.pid);
            let w = workloads.entry(id.clone()).or_insert_with(|| {
                let mut w = new_workload(id.clone(), None);
                w.container_unverified = unverified(id);
                w
            });
            add_gpu_share(&mut w.gpu, gpu, p);
            cpu.entry(id)
                .or_default()
                .insert(p.reading.pid, p.host_cpu_seconds);
        }
    }
    for (id, pids) in cpu {
        if let Some(w) = workloads.get_mut(id) {
            // Known only when every one of them was measured this round.
            w.gpu.process_cpu =
                pids.values()
                    .copied()
                    .sum::<Option<f64>>()
                    .map(|seconds| ProcessCpu {
                        seconds,
                        processes: pids.len(),
                    });
        }
    }
    gpu_pids
}

fn is_shared(g: &Gpu) -> bool {
    let mut first: Option<&Option<WorkloadId>> = None;
    g.processes.iter().any(|p| match first {
        None => {
            first = Some(&p.workload);
            p.workload.is_none() && g.processes.len() > 1
        }
        Some(f) => f != &p.workload || p.workload.is_none(),
    })
}

/// Where the agent's cgroup namespace is rooted on the host, when it runs in one of its own and
/// the host's hierarchies are mounted whole: other processes' paths are then put back on the
/// host's root, and the namespace is no blind spot. Otherwise the host's (paths unchanged), and
/// the blind spot stays with why.
fn own_cgroup_namespace(
    layout: &CgroupLayout,
    proc_root: &std::path::Path,
    blind_spots: &mut Vec<BlindSpot>,
) -> NamespaceRoot {
    if !blind_spots.contains(&BlindSpot::PrivateCgroupNamespace) {
        return NamespaceRoot::host();
    }
    match NamespaceRoot::find(layout, proc_root, std::process::id()) {
        Ok(root) if !root.is_host() => {
            tracing::info!(
                "in a cgroup namespace of its own, rooted at {} on the host: other processes' \
                 cgroup paths are read from there",
                root.describe()
            );
            blind_spots.retain(|s| *s != BlindSpot::PrivateCgroupNamespace);
            root
        }
        Ok(_) => NamespaceRoot::host(),
        Err(e) => {
            tracing::warn!("in a cgroup namespace of its own, and its root is not found: {e}");
            NamespaceRoot::host()
        }
    }
}

fn new_workload(id: WorkloadId, container: Option<&Arc<ContainerInfo>>) -> Workload {
    let name = match (container, id.kind) {
        (Some(c), _) => c.name.clone(),
        (None, WorkloadKind::Docker | WorkloadKind::Podman) => id.id.chars().take(12).collect(),
        (None, _) => id.id.to_string(),
    };
    Workload::new(id, name, container.cloned())
}

/// Adds a process's memory and identity to its workload's share of `gpu`; the busy share comes
/// when the round is completed.
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
            w.per_gpu.push(WorkloadGpuShare::new(
                gpu.device.index,
                gpu.device.uuid.clone(),
            ));
            w.per_gpu.last_mut().expect("just pushed")
        }
    };
    share.memory_bytes += mem;
    share.pids.push(p.reading.pid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{gpu, process};
    use std::collections::BTreeMap;

    fn id(name: &str) -> WorkloadId {
        WorkloadId {
            kind: WorkloadKind::Docker,
            id: name.into(),
        }
    }

    /// Two GPUs: a listed container on both, a cgroup nobody listed on one, an unattributed
    /// (vanished) process beside them. Memory and PIDs add up per workload and GPU, in GPU
    /// order; the unlisted workload is created, with why it is unverified; the unattributed
    /// process belongs to nobody.
    #[test]
    fn gpu_processes_join_their_workloads_per_gpu() {
        let (train, job) = (id("train"), id("job"));
        let mut workloads = BTreeMap::new();
        workloads.insert(train.clone(), new_workload(train.clone(), None));
        let mut g0 = gpu(0);
        let measured = |mut p: GpuProcess, cpu: f64| {
            p.host_cpu_seconds = Some(cpu);
            p
        };
        g0.processes = vec![
            measured(process(10, Some(&train), 3 << 30), 0.5),
            measured(process(11, Some(&train), 1 << 30), 0.25),
            process(12, Some(&job), 2 << 30),
            process(13, None, 5 << 30),
        ];
        let mut g1 = gpu(1);
        g1.processes = vec![measured(process(10, Some(&train), 4 << 30), 0.5)];
        let pids = join_gpu_holders(&mut workloads, &[g0, g1], |id| {
            (id.id.as_ref() == "job").then(|| "inspect failed".to_owned())
        });
        let mut held: Vec<u32> = pids.iter().copied().collect();
        held.sort_unstable();
        assert_eq!(held, [10, 11, 12]);
        let t = &workloads[&train];
        assert_eq!(t.gpu.processes, 3);
        assert_eq!(t.gpu.memory_bytes, 8 << 30);
        let shares: Vec<_> = t
            .gpu
            .per_gpu
            .iter()
            .map(|s| (s.index, s.memory_bytes, s.pids.clone()))
            .collect();
        assert_eq!(shares, [(0, 4 << 30, vec![10, 11]), (1, 4 << 30, vec![10])]);
        assert_eq!(t.container_unverified, None);
        // Its GPU processes' CPU time, PID 10 once though it holds both GPUs.
        assert_eq!(
            t.gpu.process_cpu,
            Some(ProcessCpu {
                seconds: 0.75,
                processes: 2
            })
        );
        let j = &workloads[&job];
        assert_eq!(j.gpu.process_cpu, None, "its process was not measured");
        assert_eq!((j.gpu.processes, j.gpu.memory_bytes), (1, 2 << 30));
        assert_eq!(j.container_unverified.as_deref(), Some("inspect failed"));
        assert_eq!(
            workloads.len(),
            2,
            "the unattributed process makes no workload"
        );
    }

    #[test]
    fn a_gpu_is_shared_when_its_processes_belong_to_several_workloads() {
        let (a, b) = (id("a"), id("b"));
        let mut g = gpu(0);
        assert!(!is_shared(&g), "no processes");
        g.processes = vec![process(1, Some(&a), 1), process(2, Some(&a), 1)];
        assert!(!is_shared(&g));
        g.processes.push(process(3, Some(&b), 1));
        assert!(is_shared(&g));
        g.processes = vec![process(1, Some(&a), 1), process(9, None, 1)];
        assert!(
            is_shared(&g),
            "an unattributed process is a holder of its own"
        );
        g.processes = vec![process(9, None, 1)];
        assert!(!is_shared(&g), "one holder, even unattributed");
    }

    /// Sources turned off on purpose say so, so that doctor reports no finding for them; one
    /// that fails is down without being disabled.
    #[test]
    fn sources_turned_off_read_as_disabled() {
        let config = SamplerConfig {
            gpu: None,
            probes: false,
            cri_tasks: None,
            ..SamplerConfig::default()
        };
        let mut sampler = Sampler::new(&config, None, Arc::default());
        // The first round has no window: it is complete at once.
        let snap = sampler.round().pop().expect("the first round");
        let s = &snap.sources;
        assert!(s.nvml.is_disabled(), "{:?}", s.nvml);
        assert!(s.docker.is_disabled(), "{:?}", s.docker);
        assert!(s.ebpf.is_disabled(), "{:?}", s.ebpf);
        assert!(s.cuda.is_disabled(), "{:?}", s.cuda);
    }
}
