//! What removing the bottleneck a verdict names would buy: the gain in step rate, as a range
//! whose two ends state their assumptions.
//!
//! - **low** = 1 / (1 − s), with s the share of the window the cause costs the training loop
//!   (its wait for batches, the host-side cause's share, the other jobs' part of a shared GPU):
//!   the step rate if that time vanished and nothing else changed;
//! - **high** = 1 / busy: the GPU kept busy all the time, since a job whose GPU work per step
//!   stays the same steps in proportion to its GPU's busy share.
//!
//! The cause's share is at most the GPU's idle share, so low ≤ high. Near s = 1 the low end is
//! sensitive (a point of error in s at 0.96 moves it by a third) and the high end is the
//! better guide; each is given. Measured on an H100 host (tests/gpu/loader_job.py, the same
//! model and batch with the samples in memory as the fix): a CPU-bound loader, 15.9–17.9×
//! estimated, 16.0× real; an I/O-bound loader, 27.6–44.5×, 40.3× real.
use crate::model::{Speedup, Verdict, VerdictKind};

/// GPU busy share under which no high end is given: the GPU barely ran, and 1 / busy says
/// nothing a user can plan with.
const BUSY_MIN: f64 = 0.01;

/// The range for a verdict, `None` where its kind names no bottleneck to remove (GPU-bound,
/// low SM activity, idle, unknown) or its cause's share was not measured (told from pressure).
pub fn speedup(v: &Verdict) -> Option<Speedup> {
    let share = match v.kind {
        VerdictKind::InputBoundIo | VerdictKind::InputBoundCpu | VerdictKind::InputBoundMemory => {
            v.input_bound_share
        }
        VerdictKind::HostTransfers
        | VerdictKind::HostLaunches
        | VerdictKind::HostCpu
        | VerdictKind::HostSync => v.host_bound_share,
        VerdictKind::Contention => v.contention.as_ref().map(|c| c.others_fraction),
        VerdictKind::GpuBound
        | VerdictKind::LowSmActivity
        | VerdictKind::Idle
        | VerdictKind::Unknown => None,
    }?;
    if !(0.0..1.0).contains(&share) || !v.gpu_busy_fraction.is_finite() {
        return None;
    }
    let high = (v.gpu_busy_fraction >= BUSY_MIN).then(|| 1.0 / v.gpu_busy_fraction);
    let low = 1.0 / (1.0 - share);
    Some(Speedup {
        low: high.map_or(low, |h| low.min(h)),
        high,
    })
}

/// The range in words, for the advice.
pub fn describe(s: &Speedup) -> String {
    match s.high {
        Some(high) => format!(
            "Removing it would make the steps {:.1}–{:.1}× as fast ({:.1}× if the time it costs \
             vanished and nothing else changed, {:.1}× with the GPU busy all the time).",
            s.low, high, s.low, high
        ),
        None => format!(
            "Removing it would make the steps at least {:.1}× as fast (the GPU barely ran, so \
             likely far more).",
            s.low
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{test_support::verdict, Contention, SplitMethod};

    fn verdict_of(kind: VerdictKind, busy: f64, input: Option<f64>, host: Option<f64>) -> Verdict {
        let mut v = verdict(kind, "");
        v.gpu_busy_fraction = busy;
        v.gpu_idle_fraction = 1.0 - busy;
        v.input_bound_share = input;
        v.host_bound_share = host;
        v
    }

    #[test]
    fn contention_costs_the_other_jobs_part() {
        let mut v = verdict_of(VerdictKind::Contention, 0.06, None, None);
        v.contention = Some(Contention {
            device_busy_fraction: 0.5,
            own_fraction: 0.06,
            others_fraction: 0.44,
            others: Vec::new(),
            split: SplitMethod::HostCpuEstimate,
            idlest_gpu: None,
        });
        let s = speedup(&v).unwrap();
        assert!((s.low - 1.0 / 0.56).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn an_input_bound_job_gets_both_ends_measured_on_the_gpu_host() {
        // H100, the CPU-bound loader phase: trainer wait share 0.937, GPU busy 0.056.
        let s = speedup(&verdict_of(
            VerdictKind::InputBoundCpu,
            0.056,
            Some(0.937),
            None,
        ))
        .unwrap();
        assert!((s.low - 1.0 / 0.063).abs() < 1e-9, "{s:?}");
        assert!((s.high.unwrap() - 1.0 / 0.056).abs() < 1e-9, "{s:?}");
        assert!(describe(&s).contains("15.9–17.9×"), "{}", describe(&s));
    }

    #[test]
    fn kinds_without_a_bottleneck_or_a_share_get_none() {
        for kind in [
            VerdictKind::GpuBound,
            VerdictKind::LowSmActivity,
            VerdictKind::Idle,
            VerdictKind::Unknown,
        ] {
            assert_eq!(speedup(&verdict_of(kind, 0.5, Some(0.4), Some(0.4))), None);
        }
        // Told from pressure: no share of the loop's time.
        assert_eq!(
            speedup(&verdict_of(VerdictKind::InputBoundIo, 0.1, None, None)),
            None
        );
    }

    #[test]
    fn the_low_end_never_passes_the_high_and_a_gpu_that_barely_ran_has_no_high_end() {
        // A host-side share larger than the idle share (the loop's work overlapped the GPU's).
        let s = speedup(&verdict_of(VerdictKind::HostCpu, 0.6, None, Some(0.5))).unwrap();
        assert_eq!((s.low, s.high), (1.0 / 0.6, Some(1.0 / 0.6)));
        let s = speedup(&verdict_of(
            VerdictKind::InputBoundIo,
            0.009,
            Some(0.9),
            None,
        ))
        .unwrap();
        assert_eq!(s.high, None);
        assert!((s.low - 10.0).abs() < 1e-9);
        assert!(describe(&s).contains("at least 10.0×"));
        let s = speedup(&verdict_of(
            VerdictKind::InputBoundIo,
            0.01,
            Some(0.9),
            None,
        ))
        .unwrap();
        assert_eq!(s.high, Some(100.0));
    }
}
