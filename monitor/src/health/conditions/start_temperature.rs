//! `start_temperature`: a GPU already hot before the job starts (the monitoring article's
//! pre-launch check). Doctor only: an alert has no "before". A GPU another job keeps busy is
//! warm from that job's work, not from a cooling fault: it is reported as busy, with whom, and
//! does not hold the launch (on a shared host another team's GPU at 62 °C made
//! `gpuwatch doctor && python train.py` never start): under its own name, `gpu_in_use`, not
//! as a temperature.
use crate::health::check::{gpu_subject, level, Checks, Status, Window};
use crate::health::doctor_config::Levels;
use crate::model::{Gpu, Snapshot};

pub const NAME: &str = "start_temperature";
/// A GPU other jobs keep busy before the launch.
pub const IN_USE: &str = "gpu_in_use";

/// Doctor's levels for a GPU's temperature before a launch (an idle GPU runs near 30–45 °C).
pub const DOCTOR: Levels<u32> = Levels { ok: 45, risk: 55 };

/// A GPU busy at least this share of the window is in use by its holders.
const IN_USE_BUSY: f64 = 0.05;

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
        let busy = window
            .series(g.device.index)
            .filter_map(|x| x.busy.map(|b| b.fraction))
            .fold(None, |m: Option<f64>, b| Some(m.map_or(b, |m| m.max(b))));
        let holders = holders(g, window.last());
        if let (Some(b), false) = (busy.filter(|b| *b >= IN_USE_BUSY), holders.is_empty()) {
            out.add(
                IN_USE,
                gpu_subject(g),
                Status::Warning,
                format!(
                    "busy {:.0}% with {} ({t} °C)",
                    b * 100.0,
                    holders.join(", ")
                ),
                "a GPU no other job keeps busy",
                &format!(
                    "GPU {} is in use by {}: a job launched on it shares it (time-sliced). Launch \
                     on a GPU of its own (doctor --gpu, CUDA_VISIBLE_DEVICES), or wait for it.",
                    g.device.index,
                    holders.join(", ")
                ),
            );
            continue;
        }
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

/// The workloads (or PIDs attributed to none) holding `g`.
fn holders(g: &Gpu, snap: &Snapshot) -> Vec<String> {
    let mut names: Vec<String> = g
        .processes
        .iter()
        .filter(|p| !p.vanished)
        .map(|p| {
            p.workload
                .as_ref()
                .and_then(|id| snap.workloads.iter().find(|w| &w.id == id))
                .map_or_else(|| format!("pid {}", p.reading.pid), |w| w.name.clone())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::check::Status;
    use crate::health::conditions::testing::doctor_rows;
    use crate::model::test_support::{container, gpu, process, snapshot};
    use crate::model::{BusySource, GpuBusy, SplitMethod};

    #[test]
    fn a_gpu_another_job_keeps_busy_is_busy_not_hot() {
        let other = container("share-hi");
        let warm = |busy: f64| {
            let mut g = gpu(0);
            g.device.temperature_celsius = Some(62);
            g.processes.push(process(7, Some(&other.id), 1 << 30));
            g.busy = Some(GpuBusy {
                fraction: busy,
                coverage: Some(1.0),
                source: BusySource::UtilizationSamples,
                split: SplitMethod::SoleHolder,
            });
            vec![snapshot(0, vec![g], vec![other.clone()])]
        };
        let checks = crate::health::conditions::testing::doctor_checks(examine, &warm(0.94));
        assert_eq!(checks.0[0].check, IN_USE);
        assert_eq!(checks.0[0].status, Status::Warning);
        assert_eq!(checks.0[0].value, "busy 94% with share-hi (62 °C)");
        assert!(checks.0[0].action.contains("GPU 0 is in use by share-hi"));
        // Held but idle (IN_USE_BUSY): its temperature is judged as before.
        assert_eq!(
            doctor_rows(examine, &warm(0.04)),
            [("GPU 0".to_owned(), Status::Risk)]
        );
    }

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
