//! `host_namespaces`: the agent runs in a PID or cgroup namespace of its own, so part of the
//! host is hidden from it (a private PID namespace hides every other process: a risk). Doctor.
use crate::health::check::{Checks, Status, Window};
use crate::model::BlindSpot;

pub const NAME: &str = "host_namespaces";

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    for spot in &window.last().host.blind_spots {
        out.add(
            NAME,
            "host",
            match spot {
                BlindSpot::PrivatePidNamespace => Status::Risk,
                BlindSpot::PrivateCgroupNamespace => Status::Warning,
            },
            spot.consequence(),
            "the host's PID and cgroup namespaces",
            spot.fix(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_checks;
    use crate::model::test_support::snapshot;

    #[test]
    fn each_blind_spot_is_named_with_its_fix() {
        let mut s = snapshot(0, vec![], vec![]);
        assert!(doctor_checks(examine, &[s.clone()]).0.is_empty());
        s.host.blind_spots = vec![
            BlindSpot::PrivatePidNamespace,
            BlindSpot::PrivateCgroupNamespace,
        ];
        let checks = doctor_checks(examine, &[s]).0;
        assert_eq!(
            checks.iter().map(|c| c.status).collect::<Vec<_>>(),
            [Status::Risk, Status::Warning]
        );
        assert!(checks[0].action.contains("--pid=host"), "{:?}", checks[0]);
    }
}
