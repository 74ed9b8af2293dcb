//! A container's own configuration as it bears on a training job, measured in the window:
//! `/dev/shm`, the CPU limit against the loader's demand, the memory limit against usage and
//! page cache, the memlock limit against what its GPU processes lock, and the GPUs it was given
//! against those it uses.
use super::gpu_claim::GpuClaim;
use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize)]
pub struct ContainerConfig {
    pub shm: Option<ShmUse>,
    pub cpu: CpuLimit,
    pub memory: MemoryLimit,
    pub memlock: Option<Memlock>,
    /// `None` when no GPU is declared for the container.
    pub gpus: Option<GpuAllocation>,
    /// Why a part above could not be read, by part.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub errors: std::collections::BTreeMap<&'static str, String>,
}

/// The container's `/dev/shm` (a tmpfs; the host's with `--ipc=host`).
#[derive(Clone, Debug, Serialize)]
pub struct ShmUse {
    pub size_bytes: u64,
    pub used_bytes: u64,
    /// Docker's `IpcMode` (`private`, `shareable`, `host`, `container:<id>`).
    pub ipc_mode: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuLimit {
    /// The cgroup's CPU quota in cores (`None`: unlimited, or the controller is off).
    pub limit_cores: Option<f64>,
    pub used_cores: Option<f64>,
    pub throttled_fraction: Option<f64>,
    /// Loader (non-GPU) processes busy (on a CPU or waiting for one) at least half the window;
    /// `None` without stall tracing.
    pub busy_loader_processes: Option<usize>,
    /// What the container's processes wanted: their on-CPU plus run-queue time over the window.
    pub demand_cores: Option<f64>,
    /// Child processes of its GPU processes (DataLoader workers), alive whether or not they ran
    /// in the window; read under a quota only, `None` otherwise.
    pub loader_workers: Option<usize>,
    /// The quota's periods since the container started, and those it throttled.
    pub quota_periods: Option<super::QuotaPeriods>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MemoryLimit {
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    /// Page cache charged to the container (read only when it has a limit).
    pub page_cache_bytes: Option<u64>,
    /// Bytes its processes read from disk in the window (block requests); `None` without
    /// stall tracing.
    pub disk_read_bytes: Option<u64>,
}

/// `RLIMIT_MEMLOCK` of the container's main process, and what its GPU processes lock or pin.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Memlock {
    /// `None`: unlimited.
    pub soft_bytes: Option<u64>,
    pub hard_bytes: Option<u64>,
    /// `VmLck` + `VmPin` summed over the container's GPU processes.
    pub locked_bytes: u64,
}

/// The GPUs declared for the container, resolved against this host's GPUs.
#[derive(Clone, Debug, Serialize)]
pub struct GpuAllocation {
    /// Every declaration, applied or not, with the GPUs it names.
    pub claims: Vec<ResolvedClaim>,
    /// The GPUs the applied claims give it, with whether its processes use each.
    pub gpus: Vec<AllocatedGpu>,
    /// Devices the applied claims declare that name no GPU of this host (a UUID not listed, an
    /// index past the count, a MIG instance: gpuwatch does not enumerate MIG instances).
    pub unresolved: Vec<String>,
}

impl GpuAllocation {
    /// The applied declarations as written (`--gpus all`, `--device /dev/nvidia1`).
    pub fn applied_declarations(&self) -> Vec<&str> {
        self.claims
            .iter()
            .filter(|c| c.claim.applied)
            .map(|c| c.claim.declared.as_str())
            .collect()
    }
}

/// One declaration and the GPUs of this host it names.
#[derive(Clone, Debug, Serialize)]
pub struct ResolvedClaim {
    #[serde(flatten)]
    pub claim: GpuClaim,
    /// NVML indices of the GPUs it names.
    pub gpus: Vec<u32>,
    /// What it names that is no GPU of this host, and why.
    pub unresolved: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AllocatedGpu {
    pub index: u32,
    pub uuid: Option<String>,
    /// A process of the container holds memory or a context on it this round.
    pub in_use: bool,
    pub memory_bytes: u64,
}
