//! gpuwatch: per-container GPU attribution, data-loader stall tracing and health for Docker GPU
//! hosts.
//!
//! Data flows one way: [`sources`] (NVML, Docker, eBPF, `/proc` and cgroup files) →
//! [`attribution`] (PID → cgroup → workload) → [`model::Snapshot`] (built by
//! [`sampler::Sampler`]) → [`analysis`] and [`health`] (verdicts, alerts, checks) → [`output`]
//! and [`notify`]. [`config`] is the YAML file that sets all of it.
/// The release, as `--version` and `gpuwatch_build_info` name it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod analysis;
pub mod caps;
pub mod config;
pub mod events;
pub mod field_error;
pub mod health;
pub mod heartbeat;
pub mod model;
pub mod notify;
pub mod output;
pub mod recording;
pub mod runtime;
pub mod sampler;
pub mod serve;
pub mod sources;
pub mod top;
pub mod units;
