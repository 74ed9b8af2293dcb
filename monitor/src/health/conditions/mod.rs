//! The catalogue: one file per condition, each with its alert rule, its doctor check, or both,
//! sharing the condition's reading and its words. [`super::rules`] registers the rules,
//! [`super::doctor`] the checks.
pub mod container_config;
pub mod container_memory;
pub mod ddp_environment;
pub mod ghost_process;
pub mod gpu_allocated_idle;
pub mod gpu_ecc_errors;
pub mod gpu_imbalance;
pub mod gpu_lost;
pub mod gpu_memory_high;
pub mod gpu_temperature_high;
pub mod gpu_underutilized;
pub mod gpu_xid_errors;
pub mod host_namespaces;
pub mod launch_gpus;
pub mod memory_leak;
pub mod nvml_latency;
pub mod persistence_mode;
pub mod power_cap_low_util;
pub mod sources;
pub mod start_temperature;
pub mod throttling;

#[cfg(test)]
pub(crate) mod testing;
