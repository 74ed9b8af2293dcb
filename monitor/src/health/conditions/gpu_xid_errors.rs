//! `gpu_xid_errors`: the driver's Xid error reports. The alert rule stays firing for `hold`
//! after the last one (an Xid is an event, not a level); the doctor check reports those that
//! came during the check (earlier ones are in `dmesg`).
use crate::health::check::{gpu_subject, Checks, Status, Window};
use crate::health::rule::{
    gpu_key, rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView,
};
use crate::model::xid_meaning;
use std::collections::HashMap;
use std::time::Duration;

pub const NAME: &str = "gpu_xid_errors";

rule_config! {
    /// Xid errors reported by the driver. The alert stays firing for `hold` after the last one;
    /// codes in `ignore` (e.g. 13, 31, 43: faults of an application's own kernels) are skipped.
    Config {
        #[serde(with = "crate::units::duration")]
        hold: Duration = Duration::from_secs(600),
        ignore: Vec<u64> = Vec::new(),
    }
    for = Duration::ZERO, severity = Severity::Critical
}

/// The rule, with the last Xid per GPU and when it came (monotonic ms).
pub struct XidRule {
    config: Config,
    last_xid: HashMap<String, (u64, u64)>,
}

impl XidRule {
    pub fn new(config: &Config) -> Self {
        Self {
            config: config.clone(),
            last_xid: HashMap::new(),
        }
    }
}

/// Xids a job's own GPU code causes (illegal address, killed kernel).
fn application_fault(xid: u64) -> bool {
    matches!(xid, 13 | 31 | 43 | 45)
}

impl Rule for XidRule {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        let now = round.snap.monotonic_ms;
        for g in round.readable_gpus() {
            let key = gpu_key(g);
            let ignored = |x: &&u64| self.config.ignore.contains(x);
            if let Some(&xid) = g.device.xid_events.iter().rev().find(|x| !ignored(x)) {
                self.last_xid.insert(key.clone(), (xid, now));
            }
            let hold = self.config.hold.as_millis() as u64;
            let outcome = match self.last_xid.get(&key) {
                Some(&(xid, at)) if now.saturating_sub(at) < hold => Outcome::Breached(Finding {
                    value: xid as f64,
                    threshold: 0.0,
                    unit: "Xid",
                    summary: format!(
                        "GPU {} reported Xid {xid}: {}",
                        g.device.index,
                        xid_meaning(xid)
                    ),
                    action: if application_fault(xid) {
                        "A job's own GPU code faulted (illegal address, killed kernel): read \
                         that container's log; if it recurs across jobs, test the GPU."
                            .into()
                    } else {
                        "Look up the Xid in NVIDIA's catalogue, check `dmesg` and `nvidia-smi \
                         -q`; drain the GPU and reset it if it repeats."
                            .into()
                    },
                }),
                _ => Outcome::Clear,
            };
            out.push((key, round.gpu_subject(g), outcome));
        }
    }
}

/// Doctor: any Xid during the check is a risk.
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    for g in window.readable_gpus() {
        let xids: Vec<String> = window
            .series(g.device.index)
            .flat_map(|x| x.device.xid_events.iter())
            .map(|x| format!("Xid {x} ({})", xid_meaning(*x)))
            .collect();
        out.add(
            NAME,
            gpu_subject(g),
            if xids.is_empty() {
                Status::Ok
            } else {
                Status::Risk
            },
            if xids.is_empty() {
                "none during the check".to_owned()
            } else {
                xids.join(", ")
            },
            "none",
            "The driver reports errors on this GPU: check `dmesg` for the Xid history and drain \
             the GPU if they are not one job's own faults (13, 31, 43).",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::{doctor_rows, evaluate};
    use crate::model::test_support::{gpu, snapshot};

    fn reporting(ms: u64, xids: Vec<u64>) -> crate::model::Snapshot {
        let mut g = gpu(0);
        g.device.xid_events = xids;
        snapshot(ms, vec![g], vec![])
    }

    #[test]
    fn an_xid_holds_for_its_hold_and_ignored_codes_never_fire() {
        let config = Config {
            hold: Duration::from_secs(10),
            ignore: vec![43],
            ..Config::default()
        };
        let mut rule = XidRule::new(&config);
        let mut at = |ms, xids| evaluate(&mut rule, &reporting(ms, xids))[0].2.clone();
        assert_eq!(at(0, vec![]), Outcome::Clear);
        let Outcome::Breached(f) = at(1_000, vec![79]) else {
            panic!("Xid 79");
        };
        assert_eq!(f.value, 79.0);
        assert!(f.summary.contains("fallen off the bus"), "{}", f.summary);
        assert!(f.action.contains("NVIDIA's catalogue"), "{}", f.action);
        // No new report: still held 9 s later, over at 10 s.
        assert!(matches!(at(10_000, vec![]), Outcome::Breached(_)));
        assert_eq!(at(11_000, vec![]), Outcome::Clear);
        // 43 is ignored; 13 is an application's fault, said so.
        assert_eq!(at(12_000, vec![43]), Outcome::Clear);
        let Outcome::Breached(f) = at(13_000, vec![13, 43]) else {
            panic!("Xid 13 beside an ignored 43");
        };
        assert_eq!(f.value, 13.0);
        assert!(f.action.contains("job's own GPU code"), "{}", f.action);
    }

    #[test]
    fn doctor_lists_the_xids_of_the_window() {
        let snaps = [reporting(0, vec![]), reporting(1000, vec![79, 13])];
        let mut out = Checks::default();
        examine(&Window::new(&snaps, &Default::default()).unwrap(), &mut out);
        assert_eq!(out.0[0].status, Status::Risk);
        assert_eq!(
            out.0[0].value,
            "Xid 79 (GPU has fallen off the bus), Xid 13 (graphics engine exception (often an \
             application fault))"
        );
        assert_eq!(doctor_rows(examine, &snaps[..1])[0].1, Status::Ok);
    }
}
