//! Helpers the conditions' unit tests share.
use crate::health::check::{Checks, Examine, Status, Window};
use crate::health::doctor_config::DoctorConfig;
use crate::health::rule::{Outcomes, Rule, SnapshotView};
use crate::model::{Snapshot, Verdict, VerdictKind};

/// One round of `rule` on `snap`.
pub fn evaluate(rule: &mut dyn Rule, snap: &Snapshot) -> Outcomes {
    let mut out = Outcomes::new();
    rule.evaluate(&SnapshotView::new(snap), &mut out);
    out
}

/// `examine` over `snaps` with the default thresholds: (subject, status) per row.
pub fn doctor_rows(examine: Examine, snaps: &[Snapshot]) -> Vec<(String, Status)> {
    doctor_checks(examine, snaps)
        .0
        .into_iter()
        .map(|c| (c.subject, c.status))
        .collect()
}

/// `examine` over `snaps` with the default thresholds.
pub fn doctor_checks(examine: Examine, snaps: &[Snapshot]) -> Checks {
    let config = DoctorConfig::default();
    let mut out = Checks::default();
    examine(&Window::new(snaps, &config).expect("a snapshot"), &mut out);
    out
}

/// A verdict of `kind` with `advice`, its figures zero.
pub fn verdict(kind: VerdictKind, advice: &str) -> Verdict {
    crate::model::test_support::verdict(kind, advice)
}
