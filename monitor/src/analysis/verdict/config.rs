//! The verdict's thresholds: the config file's `verdict:` section.
use serde::Deserialize;

/// Thresholds of the verdict (the config file's `verdict:` section). Defaults suit a 1 s window.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerdictConfig {
    /// GPU idle share below which the workload is GPU-bound.
    pub gpu_bound_idle_max: f64,
    /// GPU busy share below which a workload whose loader is not busy either is idle.
    pub idle_busy_max: f64,
    /// Loader busy share at or below which the loader counts as doing nothing.
    pub loader_idle: f64,
    /// Loader busy share from which the loader is the bottleneck.
    pub loader_saturated: f64,
    /// Without the CUDA calls traced, the share of the GPU's idle time the training loop must
    /// spend at work beyond the GPU's busy time for its own CPU work to be the cause (its spin
    /// in synchronisations cannot be told apart then).
    pub step_busy_min: f64,
    /// Share of the loader's busy time in D state from which the loader is I/O-bound.
    pub io_share_min: f64,
    /// The loader's busy time (on a CPU, waiting for one or blocked, all its processes) over
    /// the window, in CPUs, below which it barely runs: however saturated each of its
    /// processes is for its short life, it is no bottleneck (a process that used 0.01 of a
    /// CPU was told `input-bound: CPU`).
    pub loader_active_min: f64,
    /// Share of the window under CPU-quota throttling from which the quota is the cause.
    pub throttled_min: f64,
    /// SM activity while kernels run (GPM) below which a busy GPU is doing little: tiny
    /// kernels, a launch-bound step, a batch too small. A large bf16 matmul on an H200 keeps
    /// 96 % of the SMs busy while it runs; a single-thread kernel 0.8 %.
    pub sm_active_min: f64,
    /// Spread (points) between a distributed job's ranks above which one of them is named as
    /// the straggler the others wait for (the nvidia-smi article: the GPUs of a DDP job should
    /// move together within 5 %).
    pub straggler_spread_points: f64,
    /// Share of the window the training loop spends in copies between host and GPU (CUDA
    /// calls traced) from which they can be a cause; without GPM, copies of at least this share
    /// beside heavy PCIe traffic are taken out of the GPU's busy share.
    pub copy_share_min: f64,
    /// Share of the window the training loop waits in synchronisations while the GPU has
    /// nothing to run from which that can be the cause.
    pub sync_idle_min: f64,
    /// Share of the window from which the training loop's copies or its own work can be the
    /// cause: less is noise.
    pub cause_min: f64,
    /// Share of the GPU's idle time the measured causes must explain together for a verdict to
    /// name one: below it, the verdict is `unknown` and says what was measured.
    pub explained_min: f64,
    /// The training loop's own busy time per kernel launch (µs) up to which its CPU work is
    /// issuing kernels (launch-bound) rather than work of its own, when the GPU runs each
    /// kernel in less: eager PyTorch spent 7.5 µs a launch on an H100 host, a step with 25 ms
    /// of Python per 10 kernels 2,500.
    pub launch_host_max_us: f64,
    /// PCIe traffic (both directions, bytes/s) from which copies are the cause when the CUDA
    /// calls are not traced: a pageable-copy step moved 5.1 GB/s on the H100 host, a
    /// launch-bound loop 0.2.
    pub pcie_busy_bytes_per_second: f64,
    /// Without stall tracing, the share of the window the container's tasks waited for a CPU
    /// (`cpu.pressure` some, or the quota's throttled share if larger) from which that is the
    /// cause. In 4-s windows of the end-to-end containers: a loader spinning under a 0.5-CPU
    /// quota 0.57, a GPU-bound trainer 0.06.
    pub pressure_cpu_min: f64,
    /// ... waited for I/O (`io.pressure` some): a loader reading through a 1 MB/s blkio limit
    /// 0.56, the CPU-bound and GPU-bound containers ≤ 0.003.
    pub pressure_io_min: f64,
    /// ... waited for memory (`memory.pressure` some): a loop re-reading a 200 MB file under
    /// `--memory 48m` (a squeezed page cache, refilled cheaply) 0.07.
    pub pressure_memory_min: f64,
    /// Without stall tracing and with no pressure over its threshold, the CPUs the container's
    /// processes other than its GPU processes used from which a GPU idling beside them is
    /// input-bound: CPU. On an H100 host, a DataLoader with 4 workers on free cores 2.05 with
    /// the GPU idle 94 %; the same job GPU-bound 0.09.
    pub pressure_loader_cores_min: f64,
    /// Share of the window other workloads kept its GPU busy from which, when it is also more
    /// than its own share, their work is what its kernels wait for (contention).
    pub contention_share_min: f64,
}

impl Default for VerdictConfig {
    fn default() -> Self {
        Self {
            gpu_bound_idle_max: 0.25,
            idle_busy_max: 0.05,
            loader_idle: 0.3,
            loader_saturated: 0.6,
            loader_active_min: 0.05,
            step_busy_min: 0.5,
            io_share_min: 0.5,
            throttled_min: 0.1,
            sm_active_min: 0.3,
            straggler_spread_points: 5.0,
            copy_share_min: 0.2,
            sync_idle_min: 0.05,
            explained_min: 0.5,
            cause_min: 0.05,
            launch_host_max_us: 50.0,
            pcie_busy_bytes_per_second: 1e9,
            contention_share_min: 0.2,
            pressure_cpu_min: 0.3,
            pressure_io_min: 0.3,
            pressure_memory_min: 0.1,
            pressure_loader_cores_min: 0.5,
        }
    }
}

impl VerdictConfig {
    pub fn validate(&self) -> Result<(), crate::field_error::FieldError> {
        crate::field_error::check_shares(&[
            ("gpu_bound_idle_max", self.gpu_bound_idle_max),
            ("idle_busy_max", self.idle_busy_max),
            ("loader_idle", self.loader_idle),
            ("loader_saturated", self.loader_saturated),
            ("loader_active_min", self.loader_active_min),
            ("step_busy_min", self.step_busy_min),
            ("io_share_min", self.io_share_min),
            ("throttled_min", self.throttled_min),
            ("sm_active_min", self.sm_active_min),
            ("copy_share_min", self.copy_share_min),
            ("sync_idle_min", self.sync_idle_min),
            ("explained_min", self.explained_min),
            ("cause_min", self.cause_min),
            ("contention_share_min", self.contention_share_min),
            ("pressure_cpu_min", self.pressure_cpu_min),
            ("pressure_io_min", self.pressure_io_min),
            ("pressure_memory_min", self.pressure_memory_min),
        ])?;
        for (field, v) in [
            ("straggler_spread_points", self.straggler_spread_points),
            ("launch_host_max_us", self.launch_host_max_us),
            ("pressure_loader_cores_min", self.pressure_loader_cores_min),
            (
                "pcie_busy_bytes_per_second",
                self.pcie_busy_bytes_per_second,
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(crate::field_error::FieldError::new(
                    field,
                    format!("{v} is not a positive number"),
                ));
            }
        }
        Ok(())
    }
}
