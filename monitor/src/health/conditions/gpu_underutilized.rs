//! `gpu_underutilized`: a container's GPU busy share below a threshold (the monitoring
//! article's "utilisation < 30 % for 60 s"), with its verdict's advice. An alert rule.
use crate::field_error::FieldError;
use crate::health::rule::{
    percent, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use std::time::Duration;

pub const NAME: &str = "gpu_underutilized";

rule_config! {
    /// A container's GPU busy share below `below_percent`.
    Config { below_percent: f64 = 30.0, }
    for = Duration::from_secs(60), severity = Severity::Warning
}

impl Config {
    pub fn validate(&self) -> Result<(), FieldError> {
        percent("below_percent", self.below_percent)
    }
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        for w in round.gpu_holders() {
            let outcome = match w.gpu.busy_fraction {
                Some(b) if b * 100.0 < self.below_percent => Outcome::Breached(Finding {
                    value: b * 100.0,
                    threshold: self.below_percent,
                    unit: "%",
                    summary: format!(
                        "{}: GPU busy {:.0}%, below {}%{}",
                        w.name,
                        b * 100.0,
                        self.below_percent,
                        w.verdict
                            .as_ref()
                            .map(|v| format!(" (verdict: {})", v.kind))
                            .unwrap_or_default()
                    ),
                    action: w.verdict.as_ref().map_or_else(
                        || {
                            "The GPU waits: check the data loader (more workers, cached \
                             dataset, faster storage)."
                                .to_owned()
                        },
                        |v| v.advice.clone(),
                    ),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            out.push((w.id.to_string(), SnapshotView::workload_subject(w), outcome));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::{evaluate, verdict};
    use crate::model::test_support::{container, snapshot};
    use crate::model::{VerdictKind, Workload};

    fn busy(b: Option<f64>) -> Workload {
        let mut w = container("train");
        w.gpu.processes = 1;
        w.gpu.busy_fraction = b;
        w
    }

    #[test]
    fn below_the_share_breaches_with_the_verdicts_advice() {
        let outcome = |w: Workload| {
            let out = evaluate(&mut Config::default(), &snapshot(0, vec![], vec![w]));
            assert!(out.len() <= 1);
            out.into_iter().next().map(|(key, subject, o)| {
                assert_eq!(subject.container.unwrap().name, "train");
                assert!(key.starts_with("docker:"), "{key}");
                o
            })
        };
        let Some(Outcome::Breached(f)) = outcome(busy(Some(0.12))) else {
            panic!("12 % is below 30 %");
        };
        assert_eq!((f.value, f.threshold), (12.0, 30.0));
        assert_eq!(f.summary, "train: GPU busy 12%, below 30%");
        assert!(f.action.contains("data loader"), "{}", f.action);
        let mut judged = busy(Some(0.12));
        judged.verdict = Some(verdict(VerdictKind::InputBoundIo, "cache the dataset"));
        let Some(Outcome::Breached(f)) = outcome(judged) else {
            panic!("still 12 %");
        };
        assert_eq!(
            f.summary,
            "train: GPU busy 12%, below 30% (verdict: input-bound: I/O)"
        );
        assert_eq!(f.action, "cache the dataset");
        assert_eq!(outcome(busy(Some(0.3))), Some(Outcome::Clear));
        assert_eq!(outcome(busy(None)), Some(Outcome::Unknown));
        // Not on a GPU, or exited: not this rule's subject.
        let mut idle = busy(Some(0.0));
        idle.gpu.processes = 0;
        assert_eq!(outcome(idle), None);
        let mut gone = busy(Some(0.0));
        gone.exited = true;
        assert_eq!(outcome(gone), None);
    }
}
