//! The sampler: one round reads every source once and assembles a [`Snapshot`].
//!
//! Data flows one way: sources → stages → snapshot. A round runs the stages in order, each
//! owning its state: the GPU side's readings ([`gpu_side`]), attribution of the GPU processes
//! ([`attribution`]) and their checks ([`process_checks`]), the workload list and its join with
//! the GPU holders ([`workload_list`]), the cgroup counters ([`counters`]), then the probes'
//! windows, the containers' configuration and the ranks. The stages share one map of workload
//! cgroups ([`cgroups`]). Per round the cost is NVML's cheap calls, `/proc` reads only for PIDs
//! new to this round and a slice of the others' state, a few cgroup files per workload and one
//! walk of the probe's maps; Docker metadata comes from the cache. Every `series_interval` a
//! round also fetches the GPU utilisation series, and rounds wait in [`pending`] until the
//! series covers them.
mod attribution;
mod busy_split;
mod cgroup_vetting;
mod cgroups;
mod config_reader;
mod counters;
pub mod cuda_tracing;
pub mod demand;
mod gpu_open;
mod gpu_side;
pub mod io_tracing;
mod pending;
pub mod process_checks;
mod process_table;
mod rank_envs;
mod stalls;
mod workload_list;

use crate::events::EventCounters;
use crate::heartbeat::{Heartbeat, Step};
use crate::model::{
    BlindSpot, DeviceReading, Gpu, HostInfo, Snapshot, SourceState, Sources, Workload, WorkloadId,
    SCHEMA_VERSION,
};
use crate::sources::containerd::CriTasks;
use crate::sources::docker::DockerCache;
use crate::sources::gpu::GpuSourceConfig;
use crate::sources::host::cgroup::namespace::NamespaceRoot;
use crate::sources::host::cgroup::CgroupLayout;
use crate::sources::host::pid::PidSet;
use crate::sources::host::{system, HostReader};
use attribution::{Attribution, AttributionSources};
use busy_split::Holder;
use cgroups::WorkloadCgroups;
use config_reader::ConfigReader;
use counters::CgroupCounters;
pub use gpu_open::{DRIVER_LIST_CHECK_EVERY, GPU_RETRY_FIRST, GPU_RETRY_MAX};
use gpu_side::GpuSide;
use pending::PendingRound;
use process_checks::ProcessChecks;
use stalls::Stalls;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload_list::WorkloadList;

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

/// One round's stages, each owning its state; `take_round` runs them in order and joins what
/// they give.
pub struct Sampler {
    host: HostInfo,
    /// NVML, and the rounds waiting for its series.
    gpu_side: GpuSide,
    /// `/proc` and cgroupfs, read from the agent's cgroup namespace.
    host_reader: HostReader,
    /// Each workload's cgroup: filled by attribution and the workload list, read by the rest.
    cgroups: WorkloadCgroups,
    /// GPU process → workload.
    attribution: Attribution,
    /// The GPU processes' state and CPU time.
    checks: ProcessChecks,
    /// Containers, the cgroup tree's stand-ins, the workloads that ended.
    workload_list: WorkloadList,
    /// Cgroup CPU, memory and pressure.
    counters: CgroupCounters,
    /// The launch environment of each rank of a job holding several GPUs.
    rank_envs: rank_envs::RankEnvs,
    container_configs: ConfigReader,
    /// The scheduler, read and block probes.
    stalls: Stalls,
    /// The CUDA driver probes.
    cuda: cuda_tracing::CudaTracing,
    /// When the previous round was taken (monotonic, and µs since the epoch).
    previous_at: Option<(Instant, u64)>,
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
        let cuda = cuda_tracing::CudaTracing::load(
            config.probes,
            cuda_tracing,
            &config.proc_root,
            &events,
        );
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
            cpus: system::online_cpus(),
            cgroup_mode: layout.mode,
            nvml_driver_version: gpu.as_ref().ok().and_then(|g| g.driver_version.clone()),
            blind_spots,
        };
        for spot in &host.blind_spots {
            tracing::warn!("{}; {}", spot.consequence(), spot.fix());
        }
        Self {
            host,
            cgroups: WorkloadCgroups::new(layout),
            attribution: Attribution::new(host_reader.clone(), config.revalidate_rounds),
            checks: ProcessChecks::new(&host_reader),
            workload_list: WorkloadList::new(docker, config.cri_tasks.as_ref().map(CriTasks::new)),
            counters: CgroupCounters::default(),
            rank_envs: rank_envs::RankEnvs::new(host_reader.clone()),
            host_reader,
            container_configs: ConfigReader::default(),
            stalls,
            cuda,
            previous_at: None,
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
        self.heartbeat.enter(Step::ProcessReadings);
        let (gpus, shared_gpus) = self.gpu_round(readings);
        let driver_split_gpus = driver_split_gpus(&gpus, &shared_gpus, window_us);
        self.heartbeat.enter(Step::HostReadings);
        let docker_state = self.workload_list.docker_state();
        let window = window_seconds.filter(|w| *w > 0.0);
        let workloads = self.workload_round(&docker_state, &gpus, window, now_us / 1000);
        self.previous_at = Some((started, now_us));

        let sources = Sources {
            nvml: self.gpu_side.state(),
            docker: docker_state,
            ebpf: self.stalls.source_state(),
            cuda: self.cuda.source_state(),
        };
        let mut workloads: Vec<Workload> = workloads.into_values().collect();
        self.workload_list.end_round(&workloads);
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
            driver_split_gpus,
        }
    }

    /// The GPUs with their processes attributed and checked; the shared GPUs' indices.
    fn gpu_round(&mut self, readings: Vec<DeviceReading>) -> (Vec<Gpu>, Vec<u32>) {
        let mut gpus = self.attribution.attribute(
            readings,
            &mut self.cgroups,
            &AttributionSources {
                docker: self.workload_list.docker(),
                host: &self.host_reader,
                events: &self.events,
            },
        );
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
        (gpus, shared_gpus)
    }

    /// The round's workloads: listed, ended and GPU-holding ones joined, then each one's
    /// ranks, counters, stalls, configuration and CUDA window read.
    fn workload_round(
        &mut self,
        docker_state: &SourceState,
        gpus: &[Gpu],
        window: Option<f64>,
        now_ms: u64,
    ) -> BTreeMap<WorkloadId, Workload> {
        let mut workloads = self.workload_list.listed(
            docker_state,
            &mut self.cgroups,
            &self.host_reader,
            &self.events,
        );
        self.workload_list
            .add_ended(&mut workloads, gpus, &self.cgroups);
        let gpu_pids = self.workload_list.join(&mut workloads, gpus);
        self.workload_list
            .name_cri_containers(&mut workloads, &self.events);
        for w in workloads.values_mut() {
            w.ranks = self.rank_envs.ranks(w, gpus);
        }
        self.rank_envs.end_round();
        self.heartbeat.enter(Step::ProbeReadings);
        self.stalls.step_io(now_ms, &self.events);
        self.heartbeat.enter(Step::CgroupReadings);
        self.counters
            .read(&mut workloads, &mut self.cgroups, window, &self.events);
        self.heartbeat.enter(Step::ProbeReadings);
        let probe_ok = self.read_stall_windows(&mut workloads, window, &gpu_pids);
        self.heartbeat.enter(Step::HostReadings);
        self.read_container_configs(&mut workloads, gpus, window);
        self.heartbeat.enter(Step::ProbeReadings);
        if probe_ok {
            self.stalls.end_round(&self.host_reader);
        }
        self.read_cuda_windows(&mut workloads, gpus, window, now_ms);
        self.heartbeat.enter(Step::HostReadings);
        self.cgroups.retain(|id| workloads.contains_key(id));
        workloads
    }

    /// What the CUDA driver probes saw of each workload's GPU processes over the window.
    fn read_cuda_windows(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        gpus: &[Gpu],
        window: Option<f64>,
        now_ms: u64,
    ) {
        self.cuda.observe_taken(workloads.values(), gpus, window);
        if !self.cuda.step(gpus, now_ms, &self.events) {
            return;
        }
        for w in workloads.values_mut() {
            w.cuda = self.cuda.window(&w.gpu.pids());
        }
        self.cuda.end_round(&self.host_reader);
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

    /// What the probes saw of each workload over the window. Returns whether the probes'
    /// counters were read.
    fn read_stall_windows(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        window: Option<f64>,
        gpu_pids: &PidSet,
    ) -> bool {
        let ids = self.cgroups.ids(workloads.keys());
        if !self.stalls.read(&ids, &self.events) {
            return false;
        }
        for (id, w) in workloads.iter_mut() {
            if let Some(cgroup_id) = self.cgroups.get(id).and_then(|c| c.cgroup_id) {
                w.stalls = self.stalls.window(
                    cgroup_id,
                    gpu_pids,
                    &w.gpu.pids(),
                    window,
                    &mut self.checks,
                    &self.events,
                );
            }
        }
        true
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
}

/// The shared GPUs whose split over the round's window may need the driver's per-process
/// figures ([`busy_split::driver_could_matter`]); none in a round without a window, which is
/// never split.
fn driver_split_gpus(gpus: &[Gpu], shared: &[u32], window_us: Option<(u64, u64)>) -> Vec<u32> {
    let Some((a, b)) = window_us else {
        return Vec::new();
    };
    let window_seconds = b.saturating_sub(a) as f64 / 1e6;
    gpus.iter()
        .filter(|g| shared.contains(&g.device.index))
        .filter(|g| {
            let holders: Vec<Holder> = g.processes.iter().map(Holder::from).collect();
            busy_split::driver_could_matter(&holders, window_seconds)
        })
        .map(|g| g.device.index)
        .collect()
}

/// True when the GPU's processes belong to more than one workload (an unattributed process
/// counts as one of its own): their busy time must be split.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{docker_id as id, gpu, process};

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
