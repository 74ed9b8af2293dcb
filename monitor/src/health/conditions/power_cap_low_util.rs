//! `power_cap_low_util`: power near the cap while utilisation is low — memory bandwidth, not
//! compute, limits the GPU. An alert rule.
use crate::field_error::FieldError;
use crate::health::rule::{
    gpu_key, percent, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use std::time::Duration;

pub const NAME: &str = "power_cap_low_util";

rule_config! {
    /// Power at `power_ratio` of the cap or more while utilisation is below a share.
    Config { power_ratio: f64 = 0.95, below_utilization_percent: f64 = 80.0, }
    for = Duration::from_secs(120), severity = Severity::Warning
}

impl Config {
    pub fn validate(&self) -> Result<(), FieldError> {
        percent("below_utilization_percent", self.below_utilization_percent)?;
        if !(0.0..=1.5).contains(&self.power_ratio) {
            return Err(FieldError::new(
                "power_ratio",
                "must be a ratio of the power cap, 0–1.5",
            ));
        }
        Ok(())
    }
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for g in round.readable_gpus() {
            let d = &g.device;
            // The window's busy share where the series gave one; else the instantaneous figure.
            let util = g
                .busy
                .map(|b| b.fraction * 100.0)
                .or(d.utilization_gpu_percent.map(f64::from));
            let outcome = match (d.power_watts, d.power_limit_watts, util) {
                (Some(p), Some(cap), Some(u)) if cap > 0.0 => {
                    let ratio = p / cap;
                    if ratio >= self.power_ratio && u < self.below_utilization_percent {
                        Outcome::Breached(Finding {
                            value: ratio,
                            threshold: self.power_ratio,
                            unit: "of cap",
                            summary: format!(
                                "GPU {} draws {p:.0} W of its {cap:.0} W cap at only {u:.0}% \
                                 utilisation",
                                d.index
                            ),
                            action: "Memory bandwidth, not compute, limits this GPU: a smaller \
                                     imgsz or batch helps more than more GPUs."
                                .into(),
                        })
                    } else {
                        Outcome::Clear
                    }
                }
                _ => Outcome::Unknown,
            };
            out.push((gpu_key(g), round.gpu_subject(g), outcome));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::evaluate;
    use crate::model::test_support::{gpu, snapshot};
    use crate::model::{BusySource, GpuBusy, SplitMethod};

    fn drawing(watts: Option<f64>, util: u32, busy: Option<f64>) -> Outcome {
        let mut g = gpu(0);
        g.device.power_watts = watts;
        g.device.power_limit_watts = Some(700.0);
        g.device.utilization_gpu_percent = Some(util);
        g.busy = busy.map(|fraction| GpuBusy {
            fraction,
            coverage: Some(1.0),
            source: BusySource::UtilizationSamples,
            split: SplitMethod::NoProcesses,
        });
        evaluate(&mut Config::default(), &snapshot(0, vec![g], vec![]))[0]
            .2
            .clone()
    }

    #[test]
    fn at_the_cap_with_low_utilisation_breaches() {
        let Outcome::Breached(f) = drawing(Some(690.0), 40, None) else {
            panic!("690 of 700 W at 40 %");
        };
        assert!((f.value - 690.0 / 700.0).abs() < 1e-9);
        assert!(
            f.summary.contains("690 W of its 700 W cap at only 40%"),
            "{}",
            f.summary
        );
        assert_eq!(
            drawing(Some(690.0), 95, None),
            Outcome::Clear,
            "busy: compute-bound"
        );
        assert_eq!(
            drawing(Some(300.0), 40, None),
            Outcome::Clear,
            "far from the cap"
        );
        assert_eq!(drawing(None, 40, None), Outcome::Unknown);
        // The window's busy share outranks the instantaneous reading.
        assert_eq!(drawing(Some(690.0), 40, Some(0.9)), Outcome::Clear);
        assert!(matches!(
            drawing(Some(690.0), 95, Some(0.5)),
            Outcome::Breached(_)
        ));
        let bad = Config {
            power_ratio: 2.0,
            ..Config::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "power_ratio");
    }
}
