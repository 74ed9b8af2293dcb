//! `gpu_imbalance`: the busy shares of one container's GPUs spread apart — the ranks of a
//! distributed job wait on each other (the nvidia-smi article's DDP check). An alert rule.
use crate::field_error::FieldError;
use crate::health::rule::{
    percent, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use std::time::Duration;

pub const NAME: &str = "gpu_imbalance";

rule_config! {
    /// The busy shares of one container's GPUs more than `spread_percent` points apart.
    Config { spread_percent: f64 = 5.0, }
    for = Duration::from_secs(60), severity = Severity::Warning
}

impl Config {
    pub fn validate(&self) -> Result<(), FieldError> {
        percent("spread_percent", self.spread_percent)
    }
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for w in round.gpu_holders().filter(|w| w.gpu.per_gpu.len() >= 2) {
            let busy: Vec<(u32, f64)> = w
                .gpu
                .per_gpu
                .iter()
                .filter_map(|g| Some((g.index, g.busy_fraction? * 100.0)))
                .collect();
            let hi = busy
                .iter()
                .copied()
                .reduce(|a, b| if b.1 > a.1 { b } else { a });
            let lo = busy
                .iter()
                .copied()
                .reduce(|a, b| if b.1 < a.1 { b } else { a });
            let outcome = match (w.gpu.busy_fraction, hi, lo) {
                (Some(_), Some(hi), Some(lo)) if hi.1 - lo.1 > self.spread_percent => {
                    let spread = hi.1 - lo.1;
                    // The rank the others wait for, when the analysis could tell.
                    let waits = w.straggler.as_ref().map_or_else(String::new, |s| {
                        format!("; the others wait for PID {} on GPU {}", s.pid, s.gpu)
                    });
                    Outcome::Breached(Finding {
                        value: spread,
                        threshold: self.spread_percent,
                        unit: "points",
                        summary: format!(
                            "{}: GPU busy spread {spread:.0} points across its GPUs (GPU {} at \
                             {:.0}%, GPU {} at {:.0}%{waits})",
                            w.name, hi.0, hi.1, lo.0, lo.1
                        ),
                        action: "The ranks of a distributed job wait on each other: check the \
                                 data sharding, NCCL settings (NCCL_IB_DISABLE, \
                                 NCCL_SOCKET_TIMEOUT) and whether another job shares the slow \
                                 GPU."
                            .into(),
                    })
                }
                (None, _, _) => Outcome::Unknown,
                _ => Outcome::Clear,
            };
            out.push((w.id.to_string(), SnapshotView::workload_subject(w), outcome));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::evaluate;
    use crate::model::test_support::{container, snapshot};
    use crate::model::{Workload, WorkloadGpuShare};

    fn ranks(busy: &[Option<f64>]) -> Workload {
        let mut w = container("ddp");
        w.gpu.processes = busy.len();
        w.gpu.per_gpu = busy
            .iter()
            .enumerate()
            .map(|(i, b)| WorkloadGpuShare {
                busy_fraction: *b,
                ..WorkloadGpuShare::new(i as u32, None)
            })
            .collect();
        let known: Vec<f64> = busy.iter().flatten().copied().collect();
        w.gpu.busy_fraction =
            (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64);
        w
    }

    fn outcome(w: Workload) -> Option<Outcome> {
        let out = evaluate(&mut Config::default(), &snapshot(0, vec![], vec![w]));
        out.into_iter().next().map(|(_, _, o)| o)
    }

    #[test]
    fn a_spread_above_the_threshold_breaches_naming_both_gpus() {
        let Some(Outcome::Breached(f)) = outcome(ranks(&[Some(0.9), Some(0.2), Some(0.85)])) else {
            panic!("70 points apart");
        };
        assert!((f.value - 70.0).abs() < 1e-9, "{f:?}");
        assert!(
            f.summary.contains("(GPU 0 at 90%, GPU 1 at 20%)"),
            "{}",
            f.summary
        );
        assert_eq!(
            outcome(ranks(&[Some(0.9), Some(0.87)])),
            Some(Outcome::Clear)
        );
        // With the straggler known, the summary names it.
        let mut named = ranks(&[Some(0.9), Some(0.2)]);
        named.straggler = Some(crate::model::Straggler {
            pid: 4242,
            gpu: 0,
            by: crate::model::StragglerBasis::Busy,
            spread_points: 70.0,
        });
        let Some(Outcome::Breached(f)) = outcome(named) else {
            panic!("70 points apart");
        };
        assert!(
            f.summary
                .ends_with("GPU 1 at 20%; the others wait for PID 4242 on GPU 0)"),
            "{}",
            f.summary
        );
        // A GPU whose share is unknown does not count; none known is unknown.
        assert_eq!(outcome(ranks(&[Some(0.9), None])), Some(Outcome::Clear));
        assert_eq!(outcome(ranks(&[None, None])), Some(Outcome::Unknown));
        // One GPU: nothing to compare.
        assert_eq!(outcome(ranks(&[Some(0.1)])), None);
    }
}
