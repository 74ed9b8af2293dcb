//! The last minutes of a few figures, kept by `serve` across rounds for the web page's small
//! charts: each GPU's busy share and each workload's busy share of its GPUs. At most
//! [`POINTS`] points a series, so what a round copies stays small however long the agent runs;
//! a workload's series ends when it leaves the snapshot, as its totals do.
use crate::model::{Snapshot, WorkloadId};
use std::collections::{BTreeMap, VecDeque};

/// Points kept per series: 10 minutes at the default 5-s interval.
pub const POINTS: usize = 120;

/// One figure over the last rounds: (unix ms, value in 0..=1, `None` where it was unknown).
pub type Series = VecDeque<(u64, Option<f64>)>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recent {
    /// Per GPU index: its busy share in each round.
    pub gpu_busy: BTreeMap<u32, Series>,
    /// Per workload: the busy share of its GPUs (summed over them, as the verdict's).
    pub workload_busy: BTreeMap<WorkloadId, Series>,
}

impl Recent {
    /// Adds one round.
    pub fn add(&mut self, s: &Snapshot) {
        let t = s.taken_at_unix_ms;
        self.gpu_busy
            .retain(|i, _| s.gpus.iter().any(|g| g.device.index == *i));
        for g in &s.gpus {
            let busy = g.busy.map(|b| b.fraction).or_else(|| {
                g.device
                    .utilization_gpu_percent
                    .map(|p| f64::from(p) / 100.0)
            });
            push(self.gpu_busy.entry(g.device.index).or_default(), t, busy);
        }
        self.workload_busy
            .retain(|id, _| s.workloads.iter().any(|w| &w.id == id));
        for w in s.workloads.iter().filter(|w| !w.gpu.per_gpu.is_empty()) {
            let parts: Option<f64> = w.gpu.per_gpu.iter().map(|g| g.busy_fraction).sum();
            push(
                self.workload_busy.entry(w.id.clone()).or_default(),
                t,
                parts,
            );
        }
    }
}

fn push(series: &mut Series, t: u64, v: Option<f64>) {
    if series.len() == POINTS {
        series.pop_front();
    }
    series.push_back((t, v.filter(|v| v.is_finite()).map(|v| v.clamp(0.0, 1.0))));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
    use crate::model::WorkloadGpuShare;

    fn round(t: u64, gpu_util: u32, part: Option<f64>, with_job: bool) -> Snapshot {
        let mut g = gpu(0);
        g.device.utilization_gpu_percent = Some(gpu_util);
        let mut workloads = Vec::new();
        if with_job {
            let mut w = container("job");
            let mut share = WorkloadGpuShare::new(0, None);
            share.busy_fraction = part;
            w.gpu.per_gpu = vec![share];
            workloads.push(w);
        }
        snapshot(t, vec![g], workloads)
    }

    #[test]
    fn keeps_the_last_points_and_drops_what_left() {
        let mut r = Recent::default();
        for t in 0..(POINTS as u64 + 5) {
            r.add(&round(t, 40, Some(0.25), true));
        }
        let g = &r.gpu_busy[&0];
        assert_eq!(g.len(), POINTS);
        assert_eq!(g.front(), Some(&(5, Some(0.4))));
        let w = r.workload_busy.values().next().unwrap();
        assert_eq!(w.back(), Some(&(POINTS as u64 + 4, Some(0.25))));
        // An unknown part stays unknown, not 0.
        r.add(&round(1000, 40, None, true));
        assert_eq!(
            r.workload_busy.values().next().unwrap().back(),
            Some(&(1000, None))
        );
        // The job leaves: its series goes.
        r.add(&round(1001, 40, None, false));
        assert!(r.workload_busy.is_empty());
        assert_eq!(r.gpu_busy[&0].len(), POINTS);
    }
}
