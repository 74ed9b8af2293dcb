//! Which rank of a distributed job the others wait for. In a data-parallel step every rank
//! waits in the gradient all-reduce for the slowest; while it waits, its GPU runs the
//! collective's kernel, which keeps the GPU "busy" on few SMs. So where GPM gives every rank's
//! SM activity, the straggler is the rank with the most SMs busy; else the busiest GPU. Named
//! only when the ranks spread apart by more than `straggler_spread_points`.
use super::VerdictConfig;
use crate::model::{Rank, Straggler, StragglerBasis, Workload};

pub fn straggler(w: &Workload, config: &VerdictConfig) -> Option<Straggler> {
    // Each rank on a GPU of its own, with its figures.
    let alone: Vec<&Rank> = w
        .ranks
        .iter()
        .filter(|r| w.ranks.iter().filter(|o| o.gpu == r.gpu).count() == 1)
        .collect();
    if alone.len() < 2 {
        return None;
    }
    let by_sm: Option<Vec<(&Rank, f64)>> = alone
        .iter()
        .map(|r| Some((*r, r.sm_activity_percent?)))
        .collect();
    let (basis, figures) = match by_sm {
        Some(f) => (StragglerBasis::SmActivity, f),
        None => (
            StragglerBasis::Busy,
            alone
                .iter()
                .map(|r| Some((*r, r.busy_fraction? * 100.0)))
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    let top = figures
        .iter()
        .copied()
        .reduce(|a, b| if b.1 > a.1 { b } else { a })?;
    let low = figures.iter().map(|f| f.1).fold(f64::INFINITY, f64::min);
    let spread = top.1 - low;
    (spread > config.straggler_spread_points).then_some(Straggler {
        pid: top.0.pid,
        gpu: top.0.gpu,
        by: basis,
        spread_points: spread,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::container;

    fn rank(pid: u32, gpu: u32, busy: Option<f64>, sm: Option<f64>) -> Rank {
        Rank {
            pid,
            gpu,
            memory_bytes: 1 << 30,
            busy_fraction: busy,
            sm_activity_percent: sm,
            env: None,
            env_error: None,
        }
    }

    fn judged(ranks: Vec<Rank>) -> Option<Straggler> {
        let mut w = container("ddp");
        w.ranks = ranks;
        straggler(&w, &VerdictConfig::default())
    }

    #[test]
    fn the_rank_with_the_most_sms_busy_is_the_one_the_others_wait_for() {
        // Both GPUs "busy" (the waiting rank runs the all-reduce), SM activity apart.
        let s = judged(vec![
            rank(10, 0, Some(0.99), Some(30.0)),
            rank(11, 1, Some(0.99), Some(92.0)),
        ])
        .expect("62 points apart");
        assert_eq!((s.pid, s.gpu, s.by), (11, 1, StragglerBasis::SmActivity));
        assert!((s.spread_points - 62.0).abs() < 1e-9);
        // Without GPM on every GPU: the busy shares.
        let s = judged(vec![
            rank(10, 0, Some(0.95), Some(90.0)),
            rank(11, 1, Some(0.40), None),
        ])
        .expect("55 points apart");
        assert_eq!((s.gpu, s.by), (0, StragglerBasis::Busy));
        // Together within 5 points, a share unknown, or ranks sharing a GPU: nobody named.
        assert_eq!(
            judged(vec![
                rank(10, 0, Some(0.9), None),
                rank(11, 1, Some(0.87), None)
            ]),
            None
        );
        assert_eq!(
            judged(vec![rank(10, 0, Some(0.9), None), rank(11, 1, None, None)]),
            None
        );
        assert_eq!(
            judged(vec![
                rank(10, 0, Some(0.9), None),
                rank(11, 0, Some(0.1), None)
            ]),
            None
        );
    }
}
