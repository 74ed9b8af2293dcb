//! `gpu_lost`: a GPU that fell off the bus (NVML: GPU is lost). An alert rule and a doctor
//! check; nothing else on a lost GPU can be read, so every other GPU condition skips it.
use crate::health::check::{gpu_subject, Checks, Status, Window};
use crate::health::rule::{
    gpu_key, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use std::time::Duration;

pub const NAME: &str = "gpu_lost";

rule_config! {
    /// A GPU that fell off the bus.
    Config {}
    for = Duration::ZERO, severity = Severity::Critical
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for g in &round.snap.gpus {
            let outcome = if g.device.lost {
                Outcome::Breached(Finding {
                    value: 1.0,
                    threshold: 1.0,
                    unit: "",
                    summary: format!(
                        "GPU {} is lost: NVML reports it fell off the bus",
                        g.device.index
                    ),
                    action: "Check `dmesg` for Xid 79 and the GPU's power and PCIe seating; the \
                             GPU needs a reset or a reboot, and its jobs a restart."
                        .into(),
                })
            } else {
                Outcome::Clear
            };
            out.push((gpu_key(g), round.gpu_subject(g), outcome));
        }
    }
}

/// Doctor: a lost GPU is a risk (a present one is no row of its own).
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    for g in window.gpus().filter(|g| g.device.lost) {
        out.add(
            NAME,
            gpu_subject(g),
            Status::Risk,
            "lost",
            "present",
            "The GPU fell off the bus: check `dmesg` for Xid 79, power and seating; reset or \
             reboot before training.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::{doctor_rows, evaluate};
    use crate::model::test_support::{gpu, snapshot};

    #[test]
    fn a_lost_gpu_breaches_and_a_present_one_clears() {
        let mut lost = gpu(1);
        lost.device.lost = true;
        let snap = snapshot(0, vec![gpu(0), lost], vec![]);
        let out = evaluate(&mut Config::default(), &snap);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].2, Outcome::Clear);
        let Outcome::Breached(f) = &out[1].2 else {
            panic!("{:?}", out[1]);
        };
        assert_eq!((out[1].0.as_str(), f.value), ("GPU-00000001", 1.0));
        assert!(f.summary.contains("GPU 1 is lost"), "{}", f.summary);
        let rows = doctor_rows(examine, &[snap]);
        assert_eq!(rows, [("GPU 1".to_owned(), Status::Risk)]);
    }
}
