//! `gpu_memory_high`: a GPU's memory nearly full, so an out-of-memory error is close (the
//! monitoring article's "memory > 95 %"). The alert rule looks at each snapshot; the doctor
//! check at the window's peak, a risk only while it is still growing.
use crate::field_error::FieldError;
use crate::health::check::{gpu_subject, level, Checks, Status, Window};
use crate::health::doctor_config::Levels;
use crate::health::rule::{
    gpu_key, percent, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView, MIB,
};
use crate::model::DeviceReading;
use std::time::Duration;

pub const NAME: &str = "gpu_memory_high";

/// Doctor's levels before a launch, lower than the rule's `above_percent` (95) that alerts on a
/// running job: a new job needs room.
pub const DOCTOR: Levels<f64> = Levels {
    ok: 85.0,
    risk: 92.0,
};

rule_config! {
    /// A GPU's memory use above a share of its total.
    Config { above_percent: f64 = 95.0, }
    for = Duration::from_secs(10), severity = Severity::Critical
}

impl Config {
    pub fn validate(&self) -> Result<(), FieldError> {
        percent("above_percent", self.above_percent)
    }
}

/// The share of the GPU's memory in use, in percent.
fn used_percent(d: &DeviceReading) -> Option<f64> {
    match (d.memory_used_bytes, d.memory_total_bytes) {
        (Some(u), Some(t)) if t > 0 => Some(u as f64 * 100.0 / t as f64),
        _ => None,
    }
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for g in round.readable_gpus() {
            let d = &g.device;
            let outcome = match used_percent(d) {
                Some(v) if v > self.above_percent => Outcome::Breached(Finding {
                    value: v,
                    threshold: self.above_percent,
                    unit: "%",
                    summary: format!(
                        "GPU {} memory {v:.1}% used ({:.0} of {:.0} MiB), above {}%",
                        d.index,
                        d.memory_used_bytes.unwrap_or(0) as f64 / MIB,
                        d.memory_total_bytes.unwrap_or(0) as f64 / MIB,
                        self.above_percent
                    ),
                    action: "An out-of-memory error is close: lower the batch size or imgsz, \
                             enable AMP, or stop what else holds memory on this GPU."
                        .into(),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            out.push((gpu_key(g), round.gpu_subject(g), outcome));
        }
    }
}

/// Doctor: the window's peak share; above the risk level a risk only while it grows (a job
/// that reserved its memory and holds it steady is at its high-water mark).
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let c = window.config;
    for g in window.readable_gpus() {
        let shares: Vec<f64> = window
            .series(g.device.index)
            .filter_map(|x| used_percent(&x.device))
            .collect();
        let (Some(peak), Some(first), Some(last)) = (
            shares.iter().copied().reduce(f64::max),
            shares.first(),
            shares.last(),
        ) else {
            continue;
        };
        let growing = last > first;
        let status = match level(peak, c.gpu_memory_ok_percent, c.gpu_memory_risk_percent) {
            Status::Risk if !growing => Status::Warning,
            s => s,
        };
        out.add(
            NAME,
            gpu_subject(g),
            status,
            format!("{peak:.1}%{}", if growing { ", growing" } else { "" }),
            format!(
                "ok ≤ {}%, risk > {}% and growing",
                c.gpu_memory_ok_percent, c.gpu_memory_risk_percent
            ),
            "Close to out of memory: check the dataset cache, pin_memory and OpenCV threads; \
             lower the batch or enable AMP.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::{doctor_rows, evaluate};
    use crate::model::test_support::{gpu, snapshot};

    fn with_memory(used: Option<u64>, total: Option<u64>) -> crate::model::Gpu {
        let mut g = gpu(0);
        g.device.memory_used_bytes = used;
        g.device.memory_total_bytes = total;
        g
    }

    #[test]
    fn above_the_share_breaches_at_or_below_clears_unknown_without_a_total() {
        let mut rule = Config::default();
        let outcome = |g| {
            evaluate(&mut rule.clone(), &snapshot(0, vec![g], vec![]))[0]
                .2
                .clone()
        };
        let Outcome::Breached(f) = outcome(with_memory(Some(78 << 30), Some(80 << 30))) else {
            panic!("97.5 % is above 95 %");
        };
        assert_eq!((f.value, f.threshold, f.unit), (97.5, 95.0, "%"));
        assert!(f.summary.contains("79872 of 81920 MiB"), "{}", f.summary);
        assert_eq!(
            outcome(with_memory(Some(76 << 30), Some(80 << 30))),
            Outcome::Clear
        );
        assert_eq!(outcome(with_memory(Some(1), None)), Outcome::Unknown);
        assert_eq!(outcome(with_memory(Some(1), Some(0))), Outcome::Unknown);
        // A lost GPU is the gpu_lost rule's: nothing is said about its memory.
        let mut lost = with_memory(Some(80 << 30), Some(80 << 30));
        lost.device.lost = true;
        assert!(evaluate(&mut rule, &snapshot(0, vec![lost], vec![])).is_empty());
        assert!(Config {
            above_percent: 101.0,
            ..Config::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn doctor_takes_the_peak_and_a_risk_needs_growth() {
        let run = |used: &[u64]| {
            let snaps: Vec<_> = used
                .iter()
                .enumerate()
                .map(|(i, u)| {
                    snapshot(
                        i as u64 * 1000,
                        vec![with_memory(Some(u << 30), Some(80 << 30))],
                        vec![],
                    )
                })
                .collect();
            doctor_rows(examine, &snaps)[0].1
        };
        assert_eq!(run(&[10, 20, 10]), Status::Ok);
        assert_eq!(run(&[60, 70, 70]), Status::Warning, "87.5 % peak");
        assert_eq!(run(&[75, 78]), Status::Risk, "97.5 % and growing");
        assert_eq!(run(&[78, 78]), Status::Warning, "97.5 %, flat");
    }
}
