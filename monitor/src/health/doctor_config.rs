//! The config file's `doctor:` section: the checks' ok and risk levels and the window. Its
//! defaults are each condition's own, written beside the condition's alert rule (`DOCTOR` in
//! `conditions/`), and set in [`super::doctor`], which registers the checks; the checks read
//! their levels here through [`super::check::Window`].
use crate::field_error::FieldError;
use crate::units::{duration, ByteSize};
use serde::Deserialize;
use std::time::Duration;

/// An ok level and a risk level: `ok` up to the first, `warning` up to the second, `risk` above.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Levels<T> {
    pub ok: T,
    pub risk: T,
}

/// The config file's `doctor:` section: the monitoring articles' thresholds, adjustable.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DoctorConfig {
    /// How long `doctor` samples.
    #[serde(with = "duration")]
    pub window: Duration,
    pub start_temperature_ok_celsius: u32,
    pub start_temperature_risk_celsius: u32,
    pub peak_temperature_ok_celsius: u32,
    pub peak_temperature_risk_celsius: u32,
    pub gpu_memory_ok_percent: f64,
    pub gpu_memory_risk_percent: f64,
    pub container_memory_ok: ByteSize,
    pub container_memory_risk: ByteSize,
    #[serde(with = "duration")]
    pub nvml_latency_ok: Duration,
    #[serde(with = "duration")]
    pub nvml_latency_risk: Duration,
}

impl DoctorConfig {
    pub fn validate(&self) -> Result<(), FieldError> {
        let order = |name: &str, ok: f64, risk: f64| {
            if ok <= risk {
                Ok(())
            } else {
                Err(FieldError::new(
                    format!("{name}_ok"),
                    format!("the ok level ({ok}) is above the risk level ({risk})"),
                ))
            }
        };
        order(
            "start_temperature",
            f64::from(self.start_temperature_ok_celsius),
            f64::from(self.start_temperature_risk_celsius),
        )?;
        order(
            "peak_temperature",
            f64::from(self.peak_temperature_ok_celsius),
            f64::from(self.peak_temperature_risk_celsius),
        )?;
        order(
            "gpu_memory",
            self.gpu_memory_ok_percent,
            self.gpu_memory_risk_percent,
        )?;
        order(
            "container_memory",
            self.container_memory_ok.0 as f64,
            self.container_memory_risk.0 as f64,
        )?;
        order(
            "nvml_latency",
            self.nvml_latency_ok.as_secs_f64(),
            self.nvml_latency_risk.as_secs_f64(),
        )?;
        if self.window < Duration::from_secs(1) {
            return Err(FieldError::new("window", "must be at least 1s"));
        }
        Ok(())
    }
}
