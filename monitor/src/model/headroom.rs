//! OOM headroom: how far a workload's batch can grow before its tightest GPU is full. Filled in
//! by the analysis after the round.
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OomHeadroom {
    /// The GPU with the least room: the one that runs out first.
    pub gpu_index: u32,
    /// The workload's memory on that GPU.
    pub used_bytes: u64,
    /// What the workload could use there: the GPU's total minus every other holder.
    pub available_bytes: u64,
    /// How many times the batch can grow before that GPU is full; `None` when the workload
    /// holds no more than the baseline (no batch-proportional part to scale).
    pub batch_scale: Option<f64>,
}
