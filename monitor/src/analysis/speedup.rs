//! What removing the bottleneck a verdict names would buy: the gain in step rate, as a range
//! whose two ends state their assumptions.
//!
//! - **low** = 1 / (1 − (s − e)), with s the share of the window the cause costs the training
//!   loop (its wait for batches, the host-side cause's share, the other jobs' part of a shared
//!   GPU) and e = [`SHARE_ERROR`], the shares' error measured on the GPU hosts: the step rate if
//!   that time vanished and nothing else changed, with the share read at its lowest;
//! - **high** = 1 / busy: the GPU kept busy all the time, since a job whose GPU work per step
//!   stays the same steps in proportion to its GPU's busy share.
//!
//! The low end is capped at the high one. Near s = 1 the low end is sensitive (a point of
//! error in s at 0.95 moves 1 / (1 − s) by a fifth), which is why it allows for the error.
//! Measured against loader_job.py (tests/gpu/; the same model and batch with the samples in
//! memory as the fix; over a phase's rows with both ends, the harmonic mean of each; the H200's
//! range replays its recorded shares through this formula):
//!
//! | host | phase | 1 / (1 − s) | this range | real |
//! |---|---|---|---|---|
//! | H100 | CPU-bound loader | 15.9× | 9.7–17.9× | 16.0× |
//! | H200 | CPU-bound loader | 20.1× | 11.1–21.6× | 16.9× |
//! | H200 | I/O-bound loader | 26.9× | 13.0–42.8× | 42.4× |
//!
//! On the H200 the fixed job itself still waited 6.7 % of its steps for batches and the share
//! read 0.7 points high, so 1 / (1 − s) alone promised more than the fix gave.
use crate::model::{Speedup, Verdict, VerdictKind};

/// The shares' error on the GPU hosts (docs/accuracy.md: loader and quota shares within
/// 4 points of the jobs' own).
pub const SHARE_ERROR: f64 = 0.04;

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
    let low = 1.0 / (1.0 - (share - SHARE_ERROR).max(0.0));
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
             vanished and nothing else changed, allowing for the share's error; {:.1}× with the \
             GPU busy all the time).",
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
        assert!((s.low - 1.0 / (0.56 + SHARE_ERROR)).abs() < 1e-9, "{s:?}");
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
        assert!((s.low - 1.0 / (0.063 + SHARE_ERROR)).abs() < 1e-9, "{s:?}");
        assert!((s.high.unwrap() - 1.0 / 0.056).abs() < 1e-9, "{s:?}");
        assert!(describe(&s).contains("9.7–17.9×"), "{}", describe(&s));
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
        assert!((s.low - 1.0 / (0.1 + SHARE_ERROR)).abs() < 1e-9);
        assert!(describe(&s).contains("at least 7.1×"));
        let s = speedup(&verdict_of(
            VerdictKind::InputBoundIo,
            0.01,
            Some(0.9),
            None,
        ))
        .unwrap();
        assert_eq!(s.high, Some(100.0));
    }

    #[test]
    fn a_share_within_its_error_promises_no_gain_at_the_low_end() {
        for share in [SHARE_ERROR - 0.001, SHARE_ERROR] {
            let s = speedup(&verdict_of(VerdictKind::HostSync, 0.5, None, Some(share))).unwrap();
            assert_eq!(s.low, 1.0, "{share}");
        }
        let s = speedup(&verdict_of(
            VerdictKind::HostSync,
            0.5,
            None,
            Some(SHARE_ERROR + 0.1),
        ))
        .unwrap();
        assert!((s.low - 1.0 / 0.9).abs() < 1e-9, "{s:?}");
    }
}
