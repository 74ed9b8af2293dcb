//! What the workload's GPUs did in the window, as the verdict reads it: their busy share, the
//! part of it that ran kernels, how much of the SMs the kernels kept busy, their PCIe traffic.
//!
//! NVML's utilisation counts a copy as busy. On an H100 host (tests/gpu/busy_and_sync.py),
//! synchronous copies from pinned memory read 91.5 % utilisation, pageable ones 43.4 %, while
//! GPM's graphics-engine activity read 0.01 % for both and 95 % for bf16 matmuls. So a step
//! that spends most of its time copying looks GPU-bound to utilisation alone. The kernels' share
//! is the busy share times GPM's engine share of it where the workload holds the GPU alone;
//! without GPM, the copies the probes timed are taken out of it when they fill
//! `copy_share_min` of the window beside PCIe traffic of at least
//! `pcie_busy_bytes_per_second` (a copy that only waits for kernels before it moves little).
use super::VerdictConfig;
use crate::model::Workload;

/// The mean over the workload's GPUs of `f`, `None` where no GPU has it.
fn mean_over_gpus(
    w: &Workload,
    f: impl Fn(&crate::model::WorkloadGpuShare) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = w.gpu.per_gpu.iter().filter_map(f).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// SM activity while the workload's kernels ran, over the GPUs it held alone (mean).
pub fn sm_activity(w: &Workload) -> Option<f64> {
    mean_over_gpus(w, |g| g.sm_activity_percent.map(|p| p / 100.0))
}

/// The PCIe traffic (both directions, bytes/s) of the GPUs the workload holds alone, `None`
/// where none was measured.
pub fn pcie(w: &Workload) -> Option<f64> {
    let v: Vec<f64> = w
        .gpu
        .per_gpu
        .iter()
        .filter_map(|g| g.pcie_bytes_per_second)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum())
}

/// The GPU's busy share, all holders together, over the workload's GPUs (its own where the
/// device's is unknown).
pub fn device_busy(w: &Workload, own: f64) -> f64 {
    mean_over_gpus(w, |g| g.device_busy_fraction).map_or(own, |d| d.max(own))
}

/// How the kernels' busy share was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelBusy {
    /// GPM's engine activity.
    Gpm,
    /// Utilisation less the copies the probes timed (heavy PCIe traffic beside them).
    LessCopies,
    /// Utilisation as it is: no sign that copies hold it.
    Utilisation,
}

/// The share of the window the workload's kernels kept its GPUs busy, and how it was found.
/// `copy` is the share of the window its training loop spent in copies, where traced.
pub fn kernel_busy(
    w: &Workload,
    busy: f64,
    copy: Option<f64>,
    config: &VerdictConfig,
) -> (f64, KernelBusy) {
    if let Some(k) = mean_over_gpus(w, |g| g.kernel_fraction) {
        return ((busy * k).min(busy), KernelBusy::Gpm);
    }
    let heavy_pcie = pcie(w).is_some_and(|b| b >= config.pcie_busy_bytes_per_second);
    match copy {
        Some(c) if heavy_pcie && c >= config.copy_share_min => {
            ((busy - c).max(0.0), KernelBusy::LessCopies)
        }
        _ => (busy, KernelBusy::Utilisation),
    }
}
