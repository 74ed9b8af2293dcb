//! The snapshot: one immutable picture of the host per sampling round. Every output (table, JSON,
//! later CSV, Prometheus, reports) reads snapshots; none queries a source itself.
//!
//! The JSON form is documented in `docs/snapshot-schema.md`; bump [`SCHEMA_VERSION`] on any
//! incompatible change.
use crate::cgroup::{CgroupMode, WorkloadId, WorkloadKind};
use crate::sources::docker::GpuDeviceRequest;
use crate::sources::gpu::{DeviceReading, ProcessReading};
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub schema_version: u32,
    /// RFC 3339, UTC.
    pub taken_at: String,
    pub taken_at_unix_ms: u64,
    /// Seconds since the previous round: the span that rates and samples cover. `None` for the
    /// first round.
    pub window_seconds: Option<f64>,
    /// Wall time this round took to collect.
    pub collection_seconds: f64,
    pub host: HostInfo,
    pub sources: Sources,
    pub gpus: Vec<Gpu>,
    pub workloads: Vec<Workload>,
    /// Counts of the agent's own failures since it started, by name.
    pub internal_events: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel: String,
    pub cgroup_mode: CgroupMode,
    pub nvml_driver_version: Option<String>,
}

/// Whether each source is delivering, and why not.
#[derive(Clone, Debug, Serialize)]
pub struct Sources {
    pub nvml: SourceState,
    pub docker: SourceState,
    pub ebpf: SourceState,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SourceState {
    pub up: bool,
    /// The reason a source is down (or disabled).
    pub detail: Option<String>,
}

impl SourceState {
    pub fn up() -> Self {
        Self {
            up: true,
            detail: None,
        }
    }

    pub fn down(detail: impl Into<String>) -> Self {
        Self {
            up: false,
            detail: Some(detail.into()),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Gpu {
    #[serde(flatten)]
    pub device: DeviceReading,
    pub processes: Vec<GpuProcess>,
}

#[derive(Clone, Debug, Serialize)]
pub struct GpuProcess {
    #[serde(flatten)]
    pub reading: ProcessReading,
    /// Start time in clock ticks after boot: with `pid`, the process's identity.
    pub start_time_ticks: Option<u64>,
    /// The command name.
    pub command: Option<String>,
    /// The workload this process belongs to; `None` if it could not be attributed.
    pub workload: Option<WorkloadId>,
    /// The process was gone when the agent looked it up (it exited during the round, or NVML
    /// still reports a dead process).
    pub vanished: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    pub id: WorkloadId,
    pub kind: WorkloadKind,
    /// A human name: the container name, the unit, the cgroup path, or `host`.
    pub name: String,
    pub container: Option<ContainerMeta>,
    /// The workload's cgroup path (relative to the hierarchy root), when known.
    pub cgroup_path: Option<String>,
    pub cpu: Option<CpuUsage>,
    pub memory: Option<MemoryUsage>,
    pub gpu: WorkloadGpu,
    pub sched: Option<SchedActivity>,
    /// Why a section above is missing, by section.
    pub errors: BTreeMap<&'static str, String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ContainerMeta {
    pub id: String,
    pub name: String,
    pub image: String,
    pub compose_project: Option<String>,
    pub compose_service: Option<String>,
    pub started_at: Option<String>,
    pub gpu_device_requests: Vec<GpuDeviceRequest>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct CpuUsage {
    pub usage_seconds_total: f64,
    /// CPU cores used on average over the window (`None` in the first round).
    pub cores: Option<f64>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemoryUsage {
    pub usage_bytes: u64,
    pub limit_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct WorkloadGpu {
    /// GPU memory of all the workload's processes on all GPUs.
    pub memory_bytes: u64,
    pub processes: usize,
    pub per_gpu: Vec<WorkloadGpuShare>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkloadGpuShare {
    pub index: u32,
    pub uuid: Option<String>,
    pub memory_bytes: u64,
    /// Sum of the workload's processes' mean SM utilisation on this GPU over the window;
    /// `None` when none of them had samples (no activity).
    pub sm_util_percent: Option<f64>,
    pub pids: Vec<u32>,
}

/// Scheduler activity of the workload's cgroup, from the eBPF probe.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SchedActivity {
    pub cgroup_id: u64,
    pub switches_total: u64,
    pub blocked_switches_total: u64,
    /// Switches in the window (`None` in the first round the cgroup is seen).
    pub switches: Option<u64>,
    pub blocked_switches: Option<u64>,
}
