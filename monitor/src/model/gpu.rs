//! What the GPU source reads: one GPU's state in a round, its processes, and GPM's averages.
//! The source fills these; the snapshot's JSON schema is theirs (docs/snapshot-schema.md).
use serde::Serialize;
use std::collections::BTreeMap;

/// One GPU's state in one round. Fields are `None` when the GPU does not support the query or the
/// query failed (the failure is in `errors`, keyed by field).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceReading {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    /// The minor number of its `/dev/nvidiaN` node (what `--device /dev/nvidiaN` gives).
    pub minor_number: Option<u32>,
    /// True when NVML reported the GPU lost (fallen off the bus).
    pub lost: bool,
    pub utilization_gpu_percent: Option<u32>,
    pub utilization_memory_percent: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_celsius: Option<u32>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    /// Active clocks-event (throttle) reasons, e.g. `sw_power_cap`, `hw_thermal_slowdown`.
    pub clocks_event_reasons: Vec<&'static str>,
    /// Volatile uncorrected ECC errors since the driver loaded (`None`: no ECC, or not read
    /// yet). Read every 30 rounds.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Persistence mode; read every 30 rounds.
    pub persistence_mode: Option<bool>,
    /// Xid errors the driver reported since the previous reading (see the GPU source's `xid` module).
    pub xid_events: Vec<u64>,
    #[serde(skip)]
    pub processes: Vec<ProcessReading>,
    pub errors: BTreeMap<&'static str, String>,
}

/// How a process uses a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    Compute,
    Graphics,
    ComputeAndGraphics,
}

/// One process on one GPU in one round, as NVML lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessReading {
    pub pid: u32,
    pub kind: ProcessKind,
    /// GPU memory used by the process; `None` when NVML cannot tell (e.g. under some vGPUs).
    pub used_memory_bytes: Option<u64>,
}

/// Whether a GPU offers GPM, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "detail")]
pub enum GpmState {
    Available,
    /// The GPU has no GPM (older than Hopper, or a vGPU).
    NotSupported,
    /// GPM could not be opened.
    Failed(String),
}

/// GPM's averages over one span, in percent.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SmActivity {
    /// The span the averages cover: from the previous GPM sample to this one.
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    /// Time the graphics/compute engine was active (what utilisation counts, exactly).
    pub engine_percent: Option<f64>,
    /// Of the SMs, the share busy on average: low while the engine is active means tiny
    /// kernels, launch-bound steps or batches too small to fill the GPU.
    pub sm_percent: Option<f64>,
    pub sm_occupancy_percent: Option<f64>,
    pub tensor_percent: Option<f64>,
    pub dram_bandwidth_percent: Option<f64>,
}

/// PCIe traffic of a GPU, averaged over a span: the evidence for copies between host and GPU.
/// "Receive" is from the GPU's side: host-to-device copies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PcieTraffic {
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    /// Host to device, bytes per second.
    pub rx_bytes_per_second: f64,
    /// Device to host, bytes per second.
    pub tx_bytes_per_second: f64,
    pub source: PcieSource,
}

/// Where a GPU's PCIe figures came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PcieSource {
    /// GPM's PCIe metrics over the span between two GPM samples (Hopper and newer).
    Gpm,
    /// `nvmlDeviceGetPcieThroughput`: the driver's own ~20 ms sample, once per series fetch.
    ThroughputCounter,
}

/// What an Xid means, for the ones an operator meets most (NVIDIA's Xid catalogue).
pub fn xid_meaning(xid: u64) -> &'static str {
    match xid {
        13 => "graphics engine exception (often an application fault)",
        31 => "GPU memory page fault (often an application fault)",
        43 => "GPU stopped processing (an application was killed)",
        45 => "preemptive cleanup after an application error",
        48 => "double-bit ECC error",
        61 | 62 => "internal microcontroller error",
        63 | 64 => "ECC page retirement or row remapping event",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP firmware error",
        _ => "driver error report",
    }
}
