//! `start_temperature`: a GPU already hot before the job starts (the monitoring article's
//! pre-launch check). Doctor only: an alert has no "before".
use crate::health::check::{gpu_subject, level, Checks, Window};

pub const NAME: &str = "start_temperature";

/// Doctor: the first reading of the window.
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let c = window.config;
    for g in window.readable_gpus() {
        let Some(t) = window
            .series(g.device.index)
            .find_map(|x| x.device.temperature_celsius)
        else {
            continue;
        };
        out.add(
            NAME,
            gpu_subject(g),
            level(
                t,
                c.start_temperature_ok_celsius,
                c.start_temperature_risk_celsius,
            ),
            format!("{t} °C"),
            format!(
                "ok ≤ {} °C, risk > {} °C",
                c.start_temperature_ok_celsius, c.start_temperature_risk_celsius
            ),
            "Hot before the job starts: check the server's fans and the rack's airflow; hold the \
             launch.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::check::Status;
    use crate::health::conditions::testing::doctor_rows;
    use crate::model::test_support::{gpu, snapshot};

    #[test]
    fn the_first_reading_counts() {
        let snaps: Vec<_> = [None, Some(50), Some(30)]
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let mut g = gpu(0);
                g.device.temperature_celsius = t;
                snapshot(i as u64 * 1000, vec![g], vec![])
            })
            .collect();
        assert_eq!(
            doctor_rows(examine, &snaps),
            [("GPU 0".to_owned(), Status::Warning)]
        );
        assert_eq!(
            doctor_rows(examine, &snaps[2..]),
            [("GPU 0".to_owned(), Status::Ok)]
        );
    }
}
