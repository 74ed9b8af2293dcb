//! `nvml_latency`: the slowest round of NVML queries in the window — a driver that answers
//! slowly (no persistence daemon, a driver in trouble). Doctor.
use crate::health::check::{level, Checks, Window};
use crate::health::doctor_config::Levels;
use std::time::Duration;

pub const NAME: &str = "nvml_latency";

/// Doctor's levels for the slowest round of NVML queries in its window.
pub const DOCTOR: Levels<Duration> = Levels {
    ok: Duration::from_millis(100),
    risk: Duration::from_millis(500),
};

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    if !window.last().sources.nvml.up {
        return;
    }
    let c = window.config;
    let worst = window
        .snaps
        .iter()
        .filter_map(|s| s.nvml_query_seconds)
        .fold(0.0f64, f64::max);
    out.add(
        NAME,
        "host",
        level(
            worst,
            c.nvml_latency_ok.as_secs_f64(),
            c.nvml_latency_risk.as_secs_f64(),
        ),
        format!("{:.0} ms", worst * 1000.0),
        format!(
            "ok < {} ms, risk > {} ms",
            c.nvml_latency_ok.as_millis(),
            c.nvml_latency_risk.as_millis()
        ),
        "The driver answers slowly: run nvidia-persistenced (or `nvidia-smi -pm 1`); if it stays \
         slow, reinstall the driver.",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::check::Status;
    use crate::health::conditions::testing::doctor_rows;
    use crate::model::test_support::snapshot;
    use crate::model::SourceState;

    #[test]
    fn the_slowest_round_counts() {
        let snaps = |secs: &[f64]| -> Vec<_> {
            secs.iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut s = snapshot(i as u64 * 1000, vec![], vec![]);
                    s.nvml_query_seconds = Some(*t);
                    s
                })
                .collect()
        };
        assert_eq!(
            doctor_rows(examine, &snaps(&[0.002, 0.05]))[0].1,
            Status::Ok
        );
        assert_eq!(
            doctor_rows(examine, &snaps(&[0.002, 0.2]))[0].1,
            Status::Warning
        );
        assert_eq!(
            doctor_rows(examine, &snaps(&[0.7, 0.002]))[0].1,
            Status::Risk
        );
        let mut down = snaps(&[0.7]);
        down[0].sources.nvml = SourceState::down("no driver");
        assert!(doctor_rows(examine, &down).is_empty());
    }
}
