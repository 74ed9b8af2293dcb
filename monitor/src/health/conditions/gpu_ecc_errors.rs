//! `gpu_ecc_errors`: volatile uncorrected ECC errors on a GPU — results computed there may be
//! corrupt. An alert rule and a doctor check (absent where ECC is not supported).
use crate::health::check::{gpu_subject, Checks, Status, Window};
use crate::health::rule::{
    gpu_key, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use std::time::Duration;

pub const NAME: &str = "gpu_ecc_errors";

rule_config! {
    /// Volatile uncorrected ECC errors on a GPU.
    Config {}
    for = Duration::ZERO, severity = Severity::Critical
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for g in round.readable_gpus() {
            let d = &g.device;
            let outcome = match d.ecc_uncorrected_volatile {
                Some(n) if n > 0 => Outcome::Breached(Finding {
                    value: n as f64,
                    threshold: 0.0,
                    unit: "errors",
                    summary: format!(
                        "GPU {} has {n} uncorrected ECC errors since the driver loaded",
                        d.index
                    ),
                    action: "Results computed on this GPU may be corrupt: drain it, check \
                             `nvidia-smi -q -d ECC` and retired pages, and reset the GPU."
                        .into(),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            out.push((gpu_key(g), round.gpu_subject(g), outcome));
        }
    }
}

/// Doctor: any uncorrected error is a risk.
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    for g in window.readable_gpus() {
        let Some(n) = g.device.ecc_uncorrected_volatile else {
            continue;
        };
        out.add(
            NAME,
            gpu_subject(g),
            if n > 0 { Status::Risk } else { Status::Ok },
            format!("{n} uncorrected"),
            "0",
            "Uncorrected memory errors: drain the GPU, check `nvidia-smi -q -d \
             ECC,PAGE_RETIREMENT`, and reset it.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::{doctor_rows, evaluate};
    use crate::model::test_support::{gpu, snapshot};

    fn with_errors(n: Option<u64>) -> crate::model::Snapshot {
        let mut g = gpu(0);
        g.device.ecc_uncorrected_volatile = n;
        snapshot(0, vec![g], vec![])
    }

    #[test]
    fn any_uncorrected_error_breaches() {
        let outcome = |n| {
            evaluate(&mut Config::default(), &with_errors(n))[0]
                .2
                .clone()
        };
        let Outcome::Breached(f) = outcome(Some(2)) else {
            panic!("2 errors");
        };
        assert_eq!((f.value, f.unit), (2.0, "errors"));
        assert_eq!(outcome(Some(0)), Outcome::Clear);
        assert_eq!(outcome(None), Outcome::Unknown, "ECC not supported");
        assert_eq!(
            doctor_rows(examine, &[with_errors(Some(2))])[0].1,
            Status::Risk
        );
        assert_eq!(
            doctor_rows(examine, &[with_errors(Some(0))])[0].1,
            Status::Ok
        );
        assert!(doctor_rows(examine, &[with_errors(None)]).is_empty());
    }
}
