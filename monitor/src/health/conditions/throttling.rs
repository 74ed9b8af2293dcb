//! `throttling`: the GPU slows its clocks — thermal or hardware slowdown (cooling or power
//! trouble: a risk), or the software power cap alone (the job is power-bound: a warning).
//! Doctor.
use crate::health::check::{gpu_subject, Checks, Status, Window};

pub const NAME: &str = "throttling";

/// The clocks-event reasons that slow a job down (not idle clocks, not application clocks).
const SLOWDOWNS: [&str; 5] = [
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
];

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    for g in window.readable_gpus() {
        let severe: Vec<&str> = g
            .device
            .clocks_event_reasons
            .iter()
            .copied()
            .filter(|r| SLOWDOWNS.contains(r))
            .collect();
        let status = if severe.iter().any(|r| *r != "sw_power_cap") {
            Status::Risk
        } else if severe.is_empty() {
            Status::Ok
        } else {
            Status::Warning
        };
        out.add(
            NAME,
            gpu_subject(g),
            status,
            if severe.is_empty() {
                "none".to_owned()
            } else {
                severe.join(", ")
            },
            "no thermal or hardware slowdown",
            "The GPU slows its clocks: thermal or hardware slowdown means cooling or power \
             trouble; a power cap alone means the job is power-bound.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_checks;
    use crate::model::test_support::{gpu, snapshot};

    #[test]
    fn a_power_cap_warns_and_a_thermal_slowdown_is_a_risk() {
        let check = |reasons: Vec<&'static str>| {
            let mut g = gpu(0);
            g.device.clocks_event_reasons = reasons;
            let c = doctor_checks(examine, &[snapshot(0, vec![g], vec![])]).0;
            (c[0].status, c[0].value.clone())
        };
        assert_eq!(check(vec!["gpu_idle"]), (Status::Ok, "none".into()));
        assert_eq!(
            check(vec!["sw_power_cap"]),
            (Status::Warning, "sw_power_cap".into())
        );
        assert_eq!(
            check(vec!["sw_power_cap", "hw_thermal_slowdown"]),
            (Status::Risk, "sw_power_cap, hw_thermal_slowdown".into())
        );
    }
}
