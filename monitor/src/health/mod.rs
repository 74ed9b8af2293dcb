//! Health: what is unhealthy on the host, judged from snapshots (nothing here reads a source).
//!
//! - [`conditions`]: the catalogue, one file per condition, each with its alert rule, its
//!   doctor check, or both;
//! - [`rule`] and [`rules`]: what an alert rule is, and the registry of the config file's
//!   `alerts.rules:` that evaluates each snapshot;
//! - [`alerts`]: the lifecycle over rounds — pending → firing → resolved, de-duplicated and
//!   rate-limited;
//! - [`check`] and [`doctor`]: what a doctor check is, and the checklist of `gpuwatch doctor`
//!   over a window;
//! - [`trend`]: least-squares slopes for leak detection.
pub mod alerts;
pub mod check;
pub mod conditions;
pub mod doctor;
pub mod doctor_config;
pub mod rule;
pub mod rules;
pub mod trend;
