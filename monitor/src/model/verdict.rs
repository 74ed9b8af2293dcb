//! A workload's verdict: why its GPU is idle (or that it is not), with the evidence. Filled in
//! by the analysis after the round.
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// What a workload's GPU time is bound by. Its label (`Display`, `FromStr`, the JSON and CSV
/// value, the `verdict` label of the metrics) is spelled once, in [`VerdictKind::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VerdictKind {
    InputBoundIo,
    InputBoundCpu,
    /// Told from memory pressure without stall tracing: the job waits on reclaim.
    InputBoundMemory,
    /// The host side of the step, in the GPU processes themselves: copies between host and GPU,
    HostTransfers,
    /// kernel launches (many tiny kernels, issued as fast as the host thread can),
    HostLaunches,
    /// the trainer's own CPU work (Python, data conversion, autotuning, logging),
    HostCpu,
    /// or a synchronisation that waits while the GPU has nothing to run.
    HostSync,
    /// Other workloads kept its GPU busy: its kernels wait their turn.
    Contention,
    GpuBound,
    LowSmActivity,
    Idle,
    Unknown,
}

impl VerdictKind {
    pub const ALL: [Self; 12] = [
        Self::InputBoundIo,
        Self::InputBoundCpu,
        Self::InputBoundMemory,
        Self::HostTransfers,
        Self::HostLaunches,
        Self::HostCpu,
        Self::HostSync,
        Self::Contention,
        Self::GpuBound,
        Self::LowSmActivity,
        Self::Idle,
        Self::Unknown,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::InputBoundIo => "input-bound: I/O",
            Self::InputBoundCpu => "input-bound: CPU",
            Self::InputBoundMemory => "input-bound: memory",
            Self::HostTransfers => "host-bound: transfers",
            Self::HostLaunches => "host-bound: launches",
            Self::HostCpu => "host-bound: CPU",
            Self::HostSync => "host-bound: sync",
            Self::Contention => "contention",
            Self::GpuBound => "GPU-bound",
            Self::LowSmActivity => "low SM activity",
            Self::Idle => "idle",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A verdict label that names no verdict (in a recording, say).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a verdict (one of: {labels})", labels = VerdictKind::ALL.map(VerdictKind::label).join(", "))]
pub struct UnknownVerdict(pub String);

impl FromStr for VerdictKind {
    type Err = UnknownVerdict;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.label() == s)
            .ok_or_else(|| UnknownVerdict(s.to_owned()))
    }
}

impl Serialize for VerdictKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
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
    /// Its busy time over the window, in CPUs (blocked time counted): how much it runs at all.
    pub busy_cores: f64,
    /// Of the loader's busy time: on a CPU, waiting for one, blocked on I/O.
    pub on_cpu_share: f64,
    pub runq_share: f64,
    pub blocked_share: f64,
}

/// The host side of the training step in one window: what the training loop, every thread of
/// its GPU processes, did while the GPU waited. A PyTorch process is not one thread: autograd
/// runs the backward pass on a device thread of its own, and thread pools, native tokenizers
/// and image decoders do a trainer's CPU work while its main thread waits on them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HostSide {
    /// Whether the CUDA driver calls were traced for the whole window. Without them the cause is
    /// told from PCIe traffic, SM activity and thread states, and the shares below that need
    /// them are `None`.
    pub cuda_traced: bool,
    /// The training loop's share of the window at work on the host (mean over the GPU
    /// processes): its main thread on a CPU or waiting for one, and its other threads' work
    /// while the main thread waited on them, at most the window.
    pub trainer_busy_fraction: f64,
    /// Of that, the main thread alone.
    pub main_thread_busy_fraction: f64,
    /// The GPU processes' other threads on a CPU or waiting for one, in CPUs (mean over the
    /// processes): autograd's device threads, pools, tokenizers, decoders.
    pub other_threads_cores: f64,
    /// The share of the window its GPUs ran kernels: the busy share with copies taken out (GPM's
    /// engine activity, or the copies traced beside heavy PCIe traffic). NVML's utilisation
    /// counts a copy as busy: synchronous pinned copies read 91.5 % on an H100 host while the
    /// engine ran nothing.
    pub kernel_busy_fraction: f64,
    /// The busy share of its GPUs, all their holders together (mean over its GPUs): what an
    /// untraced loop may have spent spinning in synchronisations.
    pub device_busy_fraction: f64,
    /// Its share of the window in copies between host and GPU: in the calls, waiting for them,
    /// and the loop's own time issuing them.
    pub copy_share: Option<f64>,
    /// Its share of the window in synchronisations (stream, context, event), and the part of
    /// it the GPU had nothing to run: the sync share less the GPU's busy share.
    pub sync_share: Option<f64>,
    pub sync_idle_share: Option<f64>,
    /// Kernel launches per second, all the GPU processes, and the share of them made by
    /// threads other than the main one (autograd's backward pass).
    pub launches_per_second: Option<f64>,
    pub other_threads_launch_share: Option<f64>,
    /// The training loop's own busy time (below) per kernel it launched, µs: a loop that does
    /// nothing but issue kernels spends a few µs each (eager PyTorch: 7.5 on an H100 host).
    pub host_us_per_launch: Option<f64>,
    /// GPU time per kernel launched, µs (the kernels' busy time over the launches).
    pub gpu_us_per_launch: Option<f64>,
    /// The training loop's own work on the host: its work less the time in copies and
    /// synchronisations (a thread spinning in a synchronise is on a CPU; PyTorch spins by
    /// default). Issuing kernels is part of it. Without the CUDA calls traced, its work beyond
    /// the GPU's busy time: the part that surely is not a spin.
    pub own_cpu_share: f64,
    /// PCIe traffic of its GPUs, both directions, bytes per second, when measured.
    pub pcie_bytes_per_second: Option<f64>,
}

/// What the loader and host side of a verdict were judged from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictBasis {
    /// The stall probes (and the CUDA calls where traced).
    StallTracing,
    /// Without them, the cgroup's pressure stall information: a coarser verdict.
    Pressure,
    /// Neither: only the GPU side is measured.
    GpuOnly,
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// What its loader and host side were judged from.
    pub basis: VerdictBasis,
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
    /// What the training loop did on the host; `None` without stall tracing.
    pub host: Option<HostSide>,
    /// For a host-bound verdict, the share of the window its cause took in the training loop
    /// (copying, synchronising while the GPU idled, or its own CPU work: issuing kernels for
    /// launches).
    pub host_bound_share: Option<f64>,
    /// How much of the GPU's idle time the measured causes explain together (0 to 1); `None`
    /// where they were not measured (without stall tracing, or a GPU-bound window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_explained_fraction: Option<f64>,
    pub cpu_throttled_fraction: Option<f64>,
    /// Other workloads' use of the GPUs it holds, when another holder kept one busy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contention: Option<Contention>,
    /// What removing the bottleneck it names would buy in step rate (see `analysis::speedup`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup: Option<Speedup>,
    /// The measurements behind the verdict, in words.
    pub evidence: Vec<String>,
    /// What to do about it.
    pub advice: String,
}

/// The gain in step rate removing a verdict's bottleneck would buy: the likely figure and the
/// range around it (see `analysis::speedup` for the two cases and their assumptions).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Speedup {
    pub low: f64,
    pub likely: f64,
    pub high: f64,
}

/// Who else kept the workload's GPUs busy in the window. Every figure is a share of the window
/// (mean over the GPUs it shares); the parts are shares of the GPUs' one measured busy time, so
/// its own part and the others' add up to the devices'.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Contention {
    /// The shared GPUs' busy share, all holders together.
    pub device_busy_fraction: f64,
    /// Its own part.
    pub own_fraction: f64,
    /// The other holders' parts together: the devices' less its own.
    pub others_fraction: f64,
    /// Each other holder that may have kept a shared GPU busy, busiest first.
    pub others: Vec<OtherHolder>,
    /// How the busy time was divided (the least exact method among the shared GPUs).
    pub split: super::SplitMethod,
    /// The host's least busy GPU that it does not hold, when one is known.
    pub idlest_gpu: Option<IdleGpu>,
}

/// Another holder of a shared GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OtherHolder {
    /// Its workload's name, or `pid N` for a process attributed to none.
    pub name: String,
    pub gpu: u32,
    /// Its part of the window; `None` when the split could not tell it.
    pub busy_fraction: Option<f64>,
}

/// A GPU the workload could move to.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct IdleGpu {
    pub index: u32,
    pub busy_fraction: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_parses_back_and_serialises_as_itself() {
        for kind in VerdictKind::ALL {
            assert_eq!(kind.label().parse::<VerdictKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.label());
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.label())
            );
        }
        assert_eq!(VerdictKind::GpuBound.to_string(), "GPU-bound");
        assert_eq!(
            "gpu bound".parse::<VerdictKind>(),
            Err(UnknownVerdict("gpu bound".into()))
        );
    }
}
