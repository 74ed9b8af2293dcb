//! A workload's verdict: why its GPU is idle (or that it is not), with the evidence. Filled in
//! by the analysis after the round.
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum VerdictKind {
    #[serde(rename = "input-bound: I/O")]
    InputBoundIo,
    #[serde(rename = "input-bound: CPU")]
    InputBoundCpu,
    #[serde(rename = "GPU-bound")]
    GpuBound,
    #[serde(rename = "low SM activity")]
    LowSmActivity,
    #[serde(rename = "idle")]
    Idle,
    #[serde(rename = "unknown")]
    Unknown,
}

impl VerdictKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::InputBoundIo => "input-bound: I/O",
            Self::InputBoundCpu => "input-bound: CPU",
            Self::GpuBound => "GPU-bound",
            Self::LowSmActivity => "low SM activity",
            Self::Idle => "idle",
            Self::Unknown => "unknown",
        }
    }
}

/// The loader as seen in one window.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LoaderSummary {
    /// Processes counted as the loader.
    pub processes: usize,
    /// True when there were no loader processes and the GPU processes stand in (num_workers=0).
    pub in_gpu_process: bool,
    /// How saturated the loader is: each loader process's busy share (on CPU, run queue or D
    /// state, of the window or of its life if shorter), weighted by its busy time.
    pub busy_fraction: f64,
    /// Of the loader's busy time: on a CPU, waiting for one, blocked on I/O.
    pub on_cpu_share: f64,
    pub runq_share: f64,
    pub blocked_share: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub gpu_busy_fraction: f64,
    pub gpu_idle_fraction: f64,
    /// The share of the window the trainer waited for batches while the GPU idled; `None`
    /// without stall tracing.
    pub input_bound_share: Option<f64>,
    /// The share of their traced time the GPU processes' main threads waited (interruptible
    /// sleep, or D without loader processes), mean over them: what `input_bound_share` is taken
    /// from.
    pub trainer_wait_fraction: Option<f64>,
    /// GPM: the share of the SMs busy while the workload's kernels ran (on GPUs it held
    /// alone), `None` without GPM.
    pub sm_activity_fraction: Option<f64>,
    pub loader: Option<LoaderSummary>,
    pub cpu_throttled_fraction: Option<f64>,
    /// The measurements behind the verdict, in words.
    pub evidence: Vec<String>,
    /// What to do about it.
    pub advice: String,
}
