//! `gpu_temperature_high`: a GPU running hot (the monitoring article's "> 83 °C for more than
//! 3 minutes"). The alert rule looks at each snapshot; the doctor check at the window's peak.
use crate::health::check::{gpu_subject, level, Checks, Window};
use crate::health::doctor_config::Levels;
use crate::health::rule::{
    gpu_key, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use std::time::Duration;

pub const NAME: &str = "gpu_temperature_high";

/// Doctor's levels for the hottest reading in its window; the alert fires above the rule's
/// `above_celsius` (83) held for 3 minutes.
pub const DOCTOR: Levels<u32> = Levels { ok: 80, risk: 83 };

rule_config! {
    /// A GPU hotter than a threshold.
    Config { above_celsius: u32 = 83, }
    for = Duration::from_secs(180), severity = Severity::Critical
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for g in round.readable_gpus() {
            let d = &g.device;
            let outcome = match d.temperature_celsius {
                Some(c) if c > self.above_celsius => Outcome::Breached(Finding {
                    value: f64::from(c),
                    threshold: f64::from(self.above_celsius),
                    unit: "°C",
                    summary: format!("GPU {} at {c} °C, above {} °C", d.index, self.above_celsius),
                    action: "Check the fans and the rack's airflow; meanwhile lower the batch \
                             size, enable AMP, or use gradient accumulation to cut the heat."
                        .into(),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            out.push((gpu_key(g), round.gpu_subject(g), outcome));
        }
    }
}

/// Doctor: the hottest reading of the window.
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let c = window.config;
    for g in window.readable_gpus() {
        let Some(peak) = window
            .series(g.device.index)
            .filter_map(|x| x.device.temperature_celsius)
            .max()
        else {
            continue;
        };
        out.add(
            NAME,
            gpu_subject(g),
            level(
                peak,
                c.peak_temperature_ok_celsius,
                c.peak_temperature_risk_celsius,
            ),
            format!("{peak} °C"),
            format!(
                "ok ≤ {} °C, risk > {} °C",
                c.peak_temperature_ok_celsius, c.peak_temperature_risk_celsius
            ),
            "Lower the batch size, enable AMP (amp=True), or add DataLoader workers to spread \
             the load; check cooling.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::check::Status;
    use crate::health::conditions::testing::{doctor_rows, evaluate};
    use crate::model::test_support::{gpu, snapshot};

    fn at(celsius: Option<u32>) -> crate::model::Gpu {
        let mut g = gpu(0);
        g.device.temperature_celsius = celsius;
        g
    }

    #[test]
    fn hotter_than_the_threshold_breaches() {
        let outcome = |c| {
            evaluate(&mut Config::default(), &snapshot(0, vec![at(c)], vec![]))[0]
                .2
                .clone()
        };
        let Outcome::Breached(f) = outcome(Some(90)) else {
            panic!("90 °C is above 83 °C");
        };
        assert_eq!((f.value, f.threshold), (90.0, 83.0));
        assert_eq!(f.summary, "GPU 0 at 90 °C, above 83 °C");
        assert_eq!(
            outcome(Some(83)),
            Outcome::Clear,
            "at the threshold is not above it"
        );
        assert_eq!(outcome(None), Outcome::Unknown);
    }

    #[test]
    fn doctor_reads_the_peak() {
        let rows = |temps: &[u32]| {
            let snaps: Vec<_> = temps
                .iter()
                .enumerate()
                .map(|(i, t)| snapshot(i as u64 * 1000, vec![at(Some(*t))], vec![]))
                .collect();
            doctor_rows(examine, &snaps)
        };
        assert_eq!(rows(&[40, 80, 60])[0].1, Status::Ok);
        assert_eq!(rows(&[40, 82])[0].1, Status::Warning);
        assert_eq!(rows(&[84, 40])[0].1, Status::Risk);
    }
}
