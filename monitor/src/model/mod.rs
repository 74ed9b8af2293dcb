//! The snapshot: one immutable picture of the host per sampling round. Every output (table, JSON,
//! CSV, Prometheus, plots, reports, the live view) and every health check reads snapshots; none
//! queries a source itself.
//!
//! The JSON form is documented in `docs/snapshot-schema.md`; bump [`SCHEMA_VERSION`] on any
//! incompatible change.
pub mod bounded;
mod container;
mod container_config;
mod cuda;
mod gpu;
mod gpu_claim;
mod headroom;
mod ranks;
mod source_state;
mod verdict;
mod workload;

pub use container::{ContainerInfo, Engine, GpuDeviceRequest, KubernetesPod};
pub use container_config::{
    AllocatedGpu, ContainerConfig, CpuLimit, GpuAllocation, Memlock, MemoryLimit, ResolvedClaim,
    ShmUse,
};
pub use cuda::{
    CudaCalls, CudaProcessCalls, CudaTracingState, CudaWindow, DriverLibrary, Transfer,
};
pub use gpu::{
    xid_meaning, DeviceReading, GpmState, PcieSource, PcieTraffic, ProcessKind, ProcessReading,
    SmActivity,
};
pub use gpu_claim::{parse_visible_devices, ClaimVia, ClaimedDevices, DeviceRef, GpuClaim};
pub use headroom::OomHeadroom;
pub use ranks::{Rank, RankEnv, Straggler, StragglerBasis};
pub use source_state::{SourceError, SourceState};
pub use verdict::{
    Contention, HostSide, IdleGpu, LoaderSummary, OtherHolder, Speedup, UnknownVerdict, Verdict,
    VerdictBasis, VerdictKind,
};
pub use workload::{CgroupMode, WorkloadId, WorkloadKind};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// 2: GPU busy from the device's utilisation series with its method (`busy`), GPM SM activity,
/// per-process shares and host CPU, the main thread's times in stall windows.
pub const SCHEMA_VERSION: u32 = 2;

/// Milliseconds on `CLOCK_BOOTTIME`: monotonic, counting suspended time, never stepped.
pub fn monotonic_now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_BOOTTIME exists on every kernel gpuwatch runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub schema_version: u32,
    /// RFC 3339, UTC.
    pub taken_at: String,
    pub taken_at_unix_ms: u64,
    /// When the round was taken on the host's monotonic clock ([`monotonic_now_ms`]): what
    /// durations between rounds are measured on (alert lifecycles, trends, staleness), so a
    /// wall-clock step neither holds an alert back nor fires one early. Not in the JSON.
    #[serde(skip)]
    pub monotonic_ms: u64,
    /// Seconds since the previous round: the span that rates and samples cover. `None` for the
    /// first round.
    pub window_seconds: Option<f64>,
    /// Wall time this round took to collect.
    pub collection_seconds: f64,
    /// Wall time of this round's NVML queries (all GPUs); `None` without NVML.
    pub nvml_query_seconds: Option<f64>,
    /// Wall time of the series fetch made during this round (utilisation series, GPM, split),
    /// when one was made.
    pub series_fetch_seconds: Option<f64>,
    /// The sampling thread's CPU time since the agent started, by step.
    pub sampling_cpu_seconds: SamplingCpu,
    pub host: HostInfo,
    pub sources: Sources,
    pub gpus: Vec<Gpu>,
    pub workloads: Vec<Workload>,
    /// Counts of the agent's own failures since it started, by name.
    pub internal_events: BTreeMap<&'static str, u64>,
    /// The eBPF probes' own health, when they are loaded.
    pub probes: Option<ProbeHealth>,
    /// Where the CUDA driver probes stand, when they can be used.
    pub cuda_tracing: Option<CudaTracingState>,
}

/// The sampling thread's CPU seconds since start, by the step of a round it was spent in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SamplingCpu {
    /// The round's own NVML calls.
    pub nvml_readings: f64,
    /// The series fetch: the utilisation series, GPM and the shared GPUs' split.
    pub nvml_series: f64,
    /// Listing and joining the workloads: the engine's cache, the cgroup tree, launch
    /// environments, container configurations.
    pub host_readings: f64,
    /// The GPU processes' `/proc` entries: attribution of new ones, state and CPU checks.
    pub process_readings: f64,
    /// The workloads' cgroup counters.
    pub cgroup_readings: f64,
    /// The stall and CUDA probes' maps.
    pub probe_readings: f64,
    /// Completing the rounds the series covers.
    pub publishing: f64,
    /// The rest of the thread's work: judging, alerts and the outputs, between rounds.
    pub other: f64,
}

/// What the kernel side counted against itself, and what this kernel cannot trace.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeHealth {
    /// Parts not traced on this kernel, with the reason (`"read latency: …"`).
    pub missing: Vec<String>,
    /// Map updates that failed in the kernel (a full map), since load.
    pub map_update_failed: u64,
    /// Tracepoint field reads that failed, since load.
    pub field_read_failed: u64,
    /// Syscall exits without their entry (entered before tracing, or the entry evicted).
    pub unmatched_end: u64,
    /// Entries in each per-task map, sized from the host's possible CPUs.
    pub task_map_entries: u32,
    /// Entries of the thread-state task map in use at the last read.
    pub task_map_entries_used: usize,
    /// The read and block programs: attached always, never, or while a workload needs them.
    pub io_tracing: IoTracingState,
}

/// Where the read-syscall and block programs stand. They go on and off in two steps (one a
/// round): the start programs, then the end programs, so no end meets a stale start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoTracing {
    #[default]
    Off,
    Starting,
    On,
    Stopping,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct IoTracingState {
    /// `adaptive`, `always` or `off` (the config's `sources.read_tracing`).
    pub mode: &'static str,
    pub state: IoTracing,
    /// When the read evidence last became live, Unix ms.
    pub on_since_unix_ms: Option<u64>,
    /// Why it is wanted now (a workload whose GPU idles while its processes work), or `None`.
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel: String,
    pub cgroup_mode: CgroupMode,
    pub nvml_driver_version: Option<String>,
    /// The host's online CPUs, read once at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// What the agent cannot see of the host from where it runs (a container started without
    /// the host's namespaces); empty when it sees everything.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blind_spots: Vec<BlindSpot>,
}

/// A host namespace the agent does not share, and so a part of the host it cannot see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlindSpot {
    /// Its own PID namespace: the GPU processes NVML names by host PID are not in its /proc.
    PrivatePidNamespace,
    /// Its own cgroup namespace, and the host's hierarchy not in view to find its root in:
    /// other processes' cgroup paths are relative to its own.
    PrivateCgroupNamespace,
}

impl BlindSpot {
    /// What the agent cannot do because of it.
    pub fn consequence(self) -> &'static str {
        match self {
            Self::PrivatePidNamespace => {
                "not in the host PID namespace: GPU processes cannot be attributed to containers"
            }
            Self::PrivateCgroupNamespace => {
                "not in the host cgroup namespace: container cgroups (CPU, memory, stalls) \
                 cannot be found"
            }
        }
    }

    /// How to give the agent the host's view.
    pub fn fix(self) -> &'static str {
        match self {
            Self::PrivatePidNamespace => {
                "run it with --pid=host (Kubernetes: hostPID: true), or give it the host's /proc \
                 with --proc-root"
            }
            Self::PrivateCgroupNamespace => {
                "run it with --cgroupns=host, or mount the host's /sys (-v /sys:/sys:ro)"
            }
        }
    }
}

impl fmt::Display for BlindSpot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.consequence())
    }
}

/// Whether each source is delivering, and why not.
#[derive(Clone, Debug, Serialize)]
pub struct Sources {
    pub nvml: SourceState,
    pub docker: SourceState,
    pub ebpf: SourceState,
    /// The CUDA driver probes (uprobes on the driver library).
    pub cuda: SourceState,
}

#[derive(Clone, Debug, Serialize)]
pub struct Gpu {
    #[serde(flatten)]
    pub device: DeviceReading,
    /// The share of the window a kernel ran on this GPU, and how that was measured; `None` in
    /// the first round or when nothing could measure it.
    pub busy: Option<GpuBusy>,
    /// GPM's averages over the span that holds this window (Hopper and newer).
    pub sm_activity: Option<SmActivity>,
    /// Whether this GPU offers GPM.
    pub gpm: Option<GpmState>,
    /// PCIe traffic over the span that holds this window.
    pub pcie: Option<PcieTraffic>,
    /// Its energy over the window (joules): the power reading times the window's length
    /// (`analysis::energy`); `None` in the first round or without a power reading.
    pub energy_joules: Option<f64>,
    pub processes: Vec<GpuProcess>,
}

/// A GPU's busy share over the window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GpuBusy {
    pub fraction: f64,
    /// The share of the window the source covered (`None` for an instantaneous reading).
    pub coverage: Option<f64>,
    pub source: BusySource,
    /// How this busy time was divided between the workloads holding the GPU.
    pub split: SplitMethod,
}

/// Where a GPU's busy share came from, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BusySource {
    /// The driver's complete utilisation series (`nvmlDeviceGetSamples`), over the window.
    UtilizationSamples,
    /// GPM's engine activity over the GPM span that holds the window.
    GpmEngine,
    /// One instantaneous reading (`nvmlDeviceGetUtilizationRates`, what nvidia-smi shows): a
    /// short window's figure that can miss a periodic load entirely.
    UtilizationReading,
}

/// How a GPU's busy time was divided between its holders (see `busy_split`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitMethod {
    /// Nobody holds the GPU.
    NoProcesses,
    /// One workload holds it: all of its busy time is that workload's.
    SoleHolder,
    /// Others hold memory on it, but only one workload did anything.
    SoleActiveHolder,
    /// The driver's per-process figures (each sample period to its busiest process).
    ProcessSamples,
    /// Estimated from the holders' host CPU time (the driver missed an active process).
    HostCpuEstimate,
    /// The driver's figures for the processes it credited; the other active ones unknown.
    Partial,
    /// The GPU was busy but no holder showed activity.
    Unknown,
}

impl SplitMethod {
    /// How the parts were found, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::NoProcesses => "no holders",
            Self::SoleHolder => "its only holder",
            Self::SoleActiveHolder => "its only active holder",
            Self::ProcessSamples => "split by the driver's per-process samples",
            Self::HostCpuEstimate => "split by the holders' host CPU time, an estimate",
            Self::Partial => "the driver's samples where it had them; the rest unknown",
            Self::Unknown => "no holder showed activity",
        }
    }

    /// True when the division is exact (one workload had the GPU to itself).
    pub fn is_exact(self) -> bool {
        matches!(
            self,
            Self::SoleHolder | Self::SoleActiveHolder | Self::NoProcesses
        )
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct GpuProcess {
    #[serde(flatten)]
    pub reading: ProcessReading,
    /// Start time in clock ticks after boot: with `pid`, the process's identity.
    pub start_time_ticks: Option<u64>,
    /// The command name.
    pub command: Option<std::sync::Arc<str>>,
    /// The workload this process belongs to; `None` if it could not be attributed.
    pub workload: Option<WorkloadId>,
    /// The process was gone when the agent looked it up (it exited during the round, or NVML
    /// still reports a dead process).
    pub vanished: bool,
    /// The scheduler state letter when it was checked this round (every round on shared GPUs,
    /// in rotation otherwise; see `process_checks`).
    pub state: Option<char>,
    /// In uninterruptible sleep (D) at two checks with no CPU time between: stuck, holding its
    /// GPU memory and computing nothing.
    pub stuck: bool,
    /// Host CPU seconds in the window, measured for processes on GPUs several workloads share
    /// and, without stall tracing, for all of them.
    pub host_cpu_seconds: Option<f64>,
    /// The driver's per-process SM figure over the last span it was asked for (shared GPUs).
    pub driver_sm_percent: Option<u32>,
    /// Its share of the window on this GPU, when the split is per process; `None` otherwise.
    pub busy_fraction: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Workload {
    pub id: WorkloadId,
    pub kind: WorkloadKind,
    /// A human name: the container name, the unit, the cgroup path, or `host` (cut to
    /// [`crate::model::bounded::JSON_MAX_CHARS`] in the JSON).
    #[serde(serialize_with = "crate::model::bounded::json")]
    pub name: String,
    /// The container, shared with the Docker cache: its JSON leaves out the PID and labels.
    #[serde(skip_deserializing)]
    pub container: Option<Arc<ContainerInfo>>,
    /// Docker lists this container as running, but asking about it failed (why): its name and
    /// image are unknown until a retry succeeds, and it is not a container that is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_unverified: Option<String>,
    /// The workload stopped during the window (its cgroup is gone): this is its last, partial
    /// window, reported once, with the CPU and memory last read.
    pub exited: bool,
    /// The workload's cgroup path (relative to the hierarchy root), when known.
    pub cgroup_path: Option<String>,
    pub cpu: Option<CpuUsage>,
    pub memory: Option<MemoryUsage>,
    /// Its cgroup's pressure stall information over the window (`None` in the first round, or
    /// where the kernel or hierarchy has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
    pub gpu: WorkloadGpu,
    /// What the eBPF probes saw of the workload's processes in the window.
    pub stalls: Option<StallWindow>,
    /// What its GPU processes asked of the CUDA driver in the window (uprobes).
    pub cuda: Option<CudaWindow>,
    /// Why the GPU idles, for workloads holding a GPU (see `analysis`).
    #[serde(skip_deserializing)]
    pub verdict: Option<Verdict>,
    /// How far the batch can grow before the tightest of its GPUs runs out of memory.
    #[serde(skip_deserializing)]
    pub oom_headroom: Option<OomHeadroom>,
    /// A container's own configuration (shm, limits, its GPUs) against what it uses.
    #[serde(skip_deserializing)]
    pub config: Option<ContainerConfig>,
    /// One per GPU process when the workload's processes hold more than one GPU (a distributed
    /// job's ranks); empty otherwise.
    #[serde(skip_deserializing, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<Rank>,
    /// The rank the others wait for, when the ranks spread apart (see `analysis`).
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub straggler: Option<Straggler>,
    /// Why a section above is missing, by section.
    #[serde(skip_deserializing)]
    pub errors: BTreeMap<&'static str, String>,
}

impl Workload {
    /// A workload with its identity only: every measured section empty, for the sources and
    /// the analysis to fill in.
    pub fn new(id: WorkloadId, name: String, container: Option<Arc<ContainerInfo>>) -> Self {
        Workload {
            kind: id.kind,
            id,
            name,
            container,
            container_unverified: None,
            exited: false,
            cgroup_path: None,
            cpu: None,
            memory: None,
            pressure: None,
            gpu: WorkloadGpu::default(),
            stalls: None,
            cuda: None,
            verdict: None,
            oom_headroom: None,
            config: None,
            ranks: Vec::new(),
            straggler: None,
            errors: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct CpuUsage {
    pub usage_seconds_total: f64,
    /// CPU cores used on average over the window (`None` in the first round).
    pub cores: Option<f64>,
    /// The CPU quota in cores (`None`: no quota).
    pub limit_cores: Option<f64>,
    /// The CPUs its cpuset lets it run on (`None`: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpuset_cpus: Option<u32>,
    /// Time the quota held the cgroup back, since it was created.
    pub throttled_seconds_total: Option<f64>,
    /// Of the window, the share during which the quota held the cgroup back.
    pub throttled_fraction: Option<f64>,
    /// The quota's periods since the cgroup was created: those it ran in and those it was
    /// throttled in. What a one-shot look needs: a quota that held the job back all along
    /// shows here even in a window its workers happen to wait.
    pub quota_periods: Option<QuotaPeriods>,
}

/// Cumulative pressure stall times of a cgroup (its `*.pressure` files' `total=`), µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PressureTotals {
    pub cpu_some_us: u64,
    pub io_some_us: u64,
    pub io_full_us: u64,
    pub memory_some_us: u64,
    pub memory_full_us: u64,
}

/// Pressure stall information over the window: the share of it during which some of the
/// workload's tasks (`some`), or all of its non-idle ones at once (`full`), waited for a CPU
/// (its quota's throttling included), for I/O, or for memory (reclaim, swap-in, refaults).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pressure {
    pub cpu_some: f64,
    pub io_some: f64,
    pub io_full: f64,
    pub memory_some: f64,
    pub memory_full: f64,
}

impl Pressure {
    /// The shares between two readings `seconds` apart; `None` when the counters went back (a
    /// new cgroup under the same name) or the span is empty.
    pub fn between(before: &PressureTotals, now: &PressureTotals, seconds: f64) -> Option<Self> {
        if seconds <= 0.0 {
            return None;
        }
        let share = |a: u64, b: u64| Some((b.checked_sub(a)? as f64 / (seconds * 1e6)).min(1.0));
        Some(Self {
            cpu_some: share(before.cpu_some_us, now.cpu_some_us)?,
            io_some: share(before.io_some_us, now.io_some_us)?,
            io_full: share(before.io_full_us, now.io_full_us)?,
            memory_some: share(before.memory_some_us, now.memory_some_us)?,
            memory_full: share(before.memory_full_us, now.memory_full_us)?,
        })
    }
}

impl Snapshot {
    /// The view of `gpus` only (`--gpu`, as `nvidia-smi -i`): those GPUs, and the workloads
    /// holding one of them.
    pub fn keep_gpus(&mut self, gpus: &std::collections::BTreeSet<u32>) {
        self.gpus.retain(|g| gpus.contains(&g.device.index));
        self.workloads
            .retain(|w| w.gpu.per_gpu.iter().any(|s| gpus.contains(&s.index)));
    }
}

/// A CPU quota's enforcement periods (100 ms each by default) since the cgroup was created:
/// `cpu.stat`'s `nr_periods` (periods in which it had work) and `nr_throttled`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaPeriods {
    pub periods: u64,
    pub throttled: u64,
}

impl QuotaPeriods {
    /// The share of its periods the quota throttled; `None` before it has run `min` periods.
    pub fn throttled_share(&self, min: u64) -> Option<f64> {
        (self.periods >= min.max(1)).then(|| self.throttled as f64 / self.periods as f64)
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct MemoryUsage {
    /// All memory charged to the cgroup, page cache included.
    pub usage_bytes: u64,
    pub limit_bytes: Option<u64>,
    /// Page cache charged to it (files read or written; shmem included), when `memory.stat`
    /// could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_cache_bytes: Option<u64>,
    /// The workload's own memory: the usage less the page cache, shmem kept (anonymous memory,
    /// `/dev/shm`, the kernel's for it). What grows when a job leaks; the cache grows with
    /// every file read and is given back under pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_bytes: Option<u64>,
}

impl MemoryUsage {
    /// The usage, and the share of it that is the job's own once the page cache is known.
    pub fn new(usage_bytes: u64, limit_bytes: Option<u64>, page_cache: Option<(u64, u64)>) -> Self {
        Self {
            usage_bytes,
            limit_bytes,
            page_cache_bytes: page_cache.map(|(cache, _)| cache),
            own_bytes: page_cache
                .map(|(cache, shmem)| usage_bytes.saturating_sub(cache.saturating_sub(shmem))),
        }
    }

    /// The job's own memory where known, else all of it.
    pub fn own_or_usage_bytes(&self) -> u64 {
        self.own_bytes.unwrap_or(self.usage_bytes)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkloadGpu {
    /// GPU memory of all the workload's processes on all GPUs.
    pub memory_bytes: u64,
    pub processes: usize,
    /// Mean over its GPUs of the share of the window it kept each busy; `None` in the first
    /// round, or when no GPU's share is known.
    pub busy_fraction: Option<f64>,
    pub per_gpu: Vec<WorkloadGpuShare>,
    /// Host CPU time of its GPU processes in the window (each process once), when every one of
    /// them was measured: every round on shared GPUs and without stall tracing, where it tells
    /// the training loop's CPU work from the loader's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_cpu: Option<ProcessCpu>,
}

impl WorkloadGpu {
    /// Its GPU processes, each once however many GPUs it holds.
    pub fn pids(&self) -> std::collections::BTreeSet<u32> {
        self.per_gpu
            .iter()
            .flat_map(|s| s.pids.iter().copied())
            .collect()
    }

    /// The share of the window its GPUs sat idle, every holder's kernels counted as busy (the
    /// mean over its GPUs): the time its own work could have had. On a GPU it holds alone this
    /// is one minus its busy share; on a GPU others keep busy it is small however little the
    /// workload ran (that wait is contention). Its own share stands in where no GPU's own busy
    /// share is known.
    pub fn idle_fraction(&self) -> Option<f64> {
        let device: Vec<f64> = self
            .per_gpu
            .iter()
            .filter_map(|s| s.device_busy_fraction)
            .collect();
        let busy = if device.is_empty() {
            self.busy_fraction?
        } else {
            device.iter().sum::<f64>() / device.len() as f64
        };
        Some((1.0 - busy).max(0.0))
    }
}

impl WorkloadGpu {
    /// [`Self::idle_fraction`] with copies taken out of the busy share where GPM measured the
    /// kernels' part of it (utilisation counts a copy as busy): the time its kernels could have
    /// had.
    pub fn kernel_idle_fraction(&self) -> Option<f64> {
        let idle = self.idle_fraction()?;
        let kernel: Vec<f64> = self
            .per_gpu
            .iter()
            .filter_map(|s| Some(s.device_busy_fraction? * s.kernel_fraction?))
            .collect();
        if kernel.is_empty() {
            return Some(idle);
        }
        let busy = kernel.iter().sum::<f64>() / kernel.len() as f64;
        Some(idle.max(1.0 - busy))
    }
}

/// Host CPU time of a workload's GPU processes over a window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessCpu {
    pub seconds: f64,
    pub processes: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadGpuShare {
    pub index: u32,
    pub uuid: Option<String>,
    pub memory_bytes: u64,
    /// The share of the window the workload kept this GPU busy: the GPU's busy share times the
    /// workload's part of it. `None` in the first round, without a busy source, or when its
    /// part is unknown.
    pub busy_fraction: Option<f64>,
    /// How the GPU's busy time was divided (`sole_holder`: the workload had it to itself).
    pub split: Option<SplitMethod>,
    /// The GPU's own busy share, all holders together.
    pub device_busy_fraction: Option<f64>,
    /// GPM: of the SMs, the share busy while a kernel ran (SM activity over engine activity,
    /// percent), when the workload is this GPU's only active holder.
    pub sm_activity_percent: Option<f64>,
    /// GPM: of the GPU's busy time, the share its engine ran kernels (engine activity over the
    /// utilisation, over the GPM span holding the window), when the workload is its only
    /// active holder: utilisation counts copies as busy, the engine does not (synchronous
    /// pinned copies on an H100 host: 91.5 % utilisation, 0.01 % engine activity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_fraction: Option<f64>,
    /// The GPU's PCIe traffic, both directions (bytes/s), when the workload is its only active
    /// holder.
    pub pcie_bytes_per_second: Option<f64>,
    /// The part of the GPU's energy over the window charged to the workload.
    pub energy: Option<ShareEnergy>,
    pub pids: Vec<u32>,
}

/// A workload's part of a GPU's energy over a window (joules): its busy part of the GPU's
/// time, and the GPU's idle time shared equally by those holding it (memory held keeps it
/// theirs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareEnergy {
    pub busy_joules: f64,
    pub idle_joules: f64,
}

impl WorkloadGpuShare {
    /// A share with its GPU's identity only: memory, processes and busy time still to add.
    pub fn new(index: u32, uuid: Option<String>) -> Self {
        Self {
            index,
            uuid,
            memory_bytes: 0,
            busy_fraction: None,
            split: None,
            device_busy_fraction: None,
            sm_activity_percent: None,
            kernel_fraction: None,
            pcie_bytes_per_second: None,
            energy: None,
            pids: Vec::new(),
        }
    }
}

/// The workload's processes as the eBPF probes saw them over one window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StallWindow {
    /// The unified-hierarchy cgroup id the probes key on.
    pub cgroup_id: u64,
    pub processes: Vec<ProcessStall>,
    /// Read-family syscalls (read, pread64, readv, preadv, preadv2) of all its processes.
    pub reads: IoSummary,
    /// Block requests its processes issued.
    pub disk: IoSummary,
    /// Whether the read and block programs were attached for the whole window: without them
    /// `reads` and `disk` are empty, not zero (adaptive tracing attaches them when needed).
    pub io_traced: bool,
}

impl StallWindow {
    /// The share of a `window` the training loop was at work on the host, mean over the GPU
    /// processes: the main thread on a CPU or waiting for one, and the other threads' work
    /// while it waited on them (autograd's backward pass, a thread pool), at most the window.
    /// `None` without a GPU process.
    pub fn loop_busy(&self, window: f64) -> Option<f64> {
        let shares: Vec<f64> = self
            .processes
            .iter()
            .filter(|p| p.role == ProcessRole::Gpu)
            .map(|p| {
                let m = p.main_thread.unwrap_or_default();
                let main = (m.on_cpu_seconds + m.runq_seconds) / window;
                let others =
                    (p.on_cpu_seconds + p.runq_seconds - m.on_cpu_seconds - m.runq_seconds)
                        .max(0.0)
                        / window;
                (main + others.min(m.sleep_seconds / window)).min(1.0)
            })
            .collect();
        (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64)
    }
}

/// What a process of the workload does for the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessRole {
    /// Holds a GPU context.
    Gpu,
    /// Any other process of the workload: DataLoader workers, decoders, feeders.
    Loader,
}

/// Thread-state time of one process (all its threads) in the window.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ProcessStall {
    pub pid: u32,
    pub role: ProcessRole,
    pub on_cpu_seconds: f64,
    pub runq_seconds: f64,
    /// Uninterruptible sleep (D): I/O.
    pub blocked_seconds: f64,
    pub sleep_seconds: f64,
    pub switches: u64,
    pub blocked_switches: u64,
    /// Its main thread alone, where a training loop runs (its S time is where it waits for the
    /// next batch); `None` when the main thread did not switch in the window.
    pub main_thread: Option<ThreadTimes>,
}

/// One thread's state times in the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadTimes {
    pub on_cpu_seconds: f64,
    pub runq_seconds: f64,
    pub blocked_seconds: f64,
    pub sleep_seconds: f64,
}

/// Count, bytes and latency of a kind of I/O in the window.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct IoSummary {
    pub count: u64,
    pub bytes: u64,
    pub mean_latency_ms: Option<f64>,
    /// From the log2 histogram: the upper edge of the bucket holding the percentile.
    pub p50_latency_ms: Option<f64>,
    pub p99_latency_ms: Option<f64>,
    /// Operations that took 10 ms or more.
    pub slow_count: u64,
}

/// Builders of synthetic snapshots, for the unit tests and benchmarks of the stages that read
/// snapshots. Not part of the agent's interface.
#[doc(hidden)]
pub mod test_support {
    use super::*;

    pub fn gpu(index: u32) -> Gpu {
        Gpu {
            device: DeviceReading {
                index,
                uuid: Some(format!("GPU-{index:08}")),
                name: Some("Test GPU".into()),
                utilization_gpu_percent: Some(50),
                memory_used_bytes: Some(10 << 30),
                memory_total_bytes: Some(80 << 30),
                temperature_celsius: Some(50),
                power_watts: Some(300.0),
                power_limit_watts: Some(700.0),
                ..Default::default()
            },
            busy: None,
            sm_activity: None,
            gpm: None,
            pcie: None,
            energy_joules: None,
            processes: Vec::new(),
        }
    }

    /// The id of Docker container `name`.
    pub fn docker_id(name: &str) -> WorkloadId {
        WorkloadId {
            kind: WorkloadKind::Docker,
            id: name.into(),
        }
    }

    pub fn process(pid: u32, workload: Option<&WorkloadId>, memory: u64) -> GpuProcess {
        GpuProcess {
            reading: ProcessReading {
                pid,
                kind: ProcessKind::Compute,
                used_memory_bytes: Some(memory),
            },
            start_time_ticks: Some(1),
            command: Some("python".into()),
            workload: workload.cloned(),
            vanished: false,
            state: Some('S'),
            stuck: false,
            host_cpu_seconds: None,
            driver_sm_percent: None,
            busy_fraction: None,
        }
    }

    /// A verdict of `kind` with `advice`, its figures zero.
    pub fn verdict(kind: VerdictKind, advice: &str) -> Verdict {
        Verdict {
            kind,
            basis: VerdictBasis::StallTracing,
            gpu_busy_fraction: 0.0,
            gpu_idle_fraction: 0.0,
            input_bound_share: None,
            trainer_wait_fraction: None,
            sm_activity_fraction: None,
            loader: None,
            host: None,
            host_bound_share: None,
            idle_explained_fraction: None,
            cpu_throttled_fraction: None,
            contention: None,
            speedup: None,
            evidence: Vec::new(),
            advice: advice.into(),
        }
    }

    pub fn container(name: &str) -> Workload {
        let id = WorkloadId {
            kind: WorkloadKind::Docker,
            id: format!("{name:0>64}").into(),
        };
        let info = ContainerInfo {
            compose_service: Some("train".into()),
            ..ContainerInfo::named(&id.id, Engine::Docker, name.into(), "trainer:latest".into())
        };
        Workload::new(id, name.into(), Some(Arc::new(info)))
    }

    pub fn snapshot(unix_ms: u64, gpus: Vec<Gpu>, workloads: Vec<Workload>) -> Snapshot {
        Snapshot {
            schema_version: SCHEMA_VERSION,
            taken_at: String::new(),
            taken_at_unix_ms: unix_ms,
            monotonic_ms: unix_ms,
            window_seconds: Some(1.0),
            collection_seconds: 0.001,
            nvml_query_seconds: Some(0.001),
            series_fetch_seconds: None,
            sampling_cpu_seconds: SamplingCpu::default(),
            host: HostInfo {
                hostname: "test".into(),
                kernel: "6.18".into(),
                cgroup_mode: CgroupMode::V2,
                nvml_driver_version: None,
                cpus: Some(16),
                blind_spots: Vec::new(),
            },
            sources: Sources {
                nvml: SourceState::up(),
                docker: SourceState::up(),
                ebpf: SourceState::up(),
                cuda: SourceState::up(),
            },
            gpus,
            workloads,
            internal_events: BTreeMap::new(),
            probes: None,
            cuda_tracing: None,
        }
    }
}
