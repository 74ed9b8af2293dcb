//! Data sources. Each is independent and degrades alone: no NVML still lists containers, no
//! Docker still attributes by cgroup, no eBPF still reports GPU-side data.
pub mod containerd;
pub mod cuda_probe;
pub mod docker;
pub mod gpu;
pub mod host;
pub mod map_batch;
pub mod stall_probe;
