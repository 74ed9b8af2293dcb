//! Health: what is unhealthy on the host, judged from snapshots (the analysis stage; nothing here
//! reads a source).
//!
//! - [`rules`]: the alert rules of the config file; each turns a snapshot into per-subject
//!   outcomes (breached, clear, unknown).
//! - [`allocated_idle`]: the rule for GPUs given to a container and not used.
//! - [`alerts`]: the lifecycle over rounds — pending → firing → resolved, de-duplicated and
//!   rate-limited.
//! - [`trend`]: least-squares slopes for leak detection.
//! - [`doctor`]: the one-shot checklist of `gpuwatch doctor`; [`config_checks`] its checks of
//!   each container's own configuration.
//! - [`headroom`]: how far a container's batch can grow before its GPU runs out of memory.
pub mod alerts;
pub mod allocated_idle;
pub mod config_checks;
pub mod doctor;
pub mod rules;
pub mod trend;
