//! A workload's verdict: why its GPU is idle (or that it is not), with the evidence. Filled in
//! by the analysis after the round.
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// What a workload's GPU time is bound by. Its label (`Display`, `FromStr`, the JSON and CSV
/// value, the `verdict` label of the metrics) is spelled once, in [`VerdictKind::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VerdictKind {
    InputBoundIo,
    InputBoundCpu,
    GpuBound,
    LowSmActivity,
    Idle,
    Unknown,
}

impl VerdictKind {
    pub const ALL: [Self; 6] = [
        Self::InputBoundIo,
        Self::InputBoundCpu,
        Self::GpuBound,
        Self::LowSmActivity,
        Self::Idle,
        Self::Unknown,
    ];

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

impl fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A verdict label that names no verdict (in a recording, say).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a verdict (one of: input-bound: I/O, input-bound: CPU, GPU-bound, low SM activity, idle, unknown)")]
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
