//! What removing the bottleneck a verdict names would buy: the gain in step rate, a likely
//! figure inside a range, from the window's GPU busy share b and the share s of the window the
//! cause costs the training loop (its wait for batches, the host-side cause's share, the other
//! jobs' part of a shared GPU). Two cases:
//!
//! - **The cause explains the GPU's idle time** (s at least [`EXPLAINED_MIN`] of 1 − b): without
//!   it the job is GPU-bound, and a job whose GPU work per step stays the same steps in
//!   proportion to its busy share. A GPU-bound job is busy between
//!   1 − `gpu_bound_idle_max` (the verdict's own threshold, 0.75) and 1, so the gain is
//!   0.75 / b to 1 / b, likely 0.875 / b (the band's middle).
//! - **Other idle time remains**, or the busy share holds the cause itself (pageable copies:
//!   on an H100, NVML's busy share 0.456 beside the job's own kernels' 0.355): only the cause's
//!   time goes, 1 / (1 − s), from 1 / (1 − s + e) to 1 / (1 − s − e), e = [`SHARE_ERROR`]; never
//!   past 1 / b where b counts only kernels.
//!
//! Designed on, and checked against, jobs that time themselves (tests/gpu/loader_job.py: the
//! same model and batch with the samples in memory as the fix; host_job.py: pageable against
//! pinned copies, gain in GPU work per second), as `report` gives it for a run (docs/accuracy.md
//! has the method):
//!
//! | host | job | likely (range) | real |
//! |---|---|---|---|
//! | H100 | I/O-bound loader | 40.5× (34.7–46.3) | 37.7× |
//! | H100 | CPU-bound loader | 15.8× (13.5–18.0) | 15.2× |
//! | H100 | pageable copies | 2.54× (2.30–2.82) | 2.58× |
//! | H200 | I/O-bound loader | 46.6× (39.9–53.2) | 42.4× |
//! | H200 | CPU-bound loader | 18.9× (16.2–21.6) | 16.9× |
//!
//! Near s = 1, 1 / (1 − s) is sensitive (the I/O shares read a point under the jobs' own wait,
//! which put it a third low); b is the better guide there.
use crate::model::{Speedup, Verdict, VerdictKind};

/// The shares' error on the GPU hosts (docs/accuracy.md: loader and quota shares within
/// 4 points of the jobs' own).
pub const SHARE_ERROR: f64 = 0.04;

/// The share of the GPU's idle time the cause must explain for its removal to leave the job
/// GPU-bound: the shares' error, and a step that straddles a window's edge (the H200's I/O-bound
/// loader steps every 0.74 s; a 1-s row left up to 5.4 % of the idle unexplained).
pub const EXPLAINED_MIN: f64 = 0.9;

/// GPU busy share under which no figure is given: the GPU barely ran, and 1 / b says nothing
/// a user can plan with.
const BUSY_MIN: f64 = 0.01;

/// The gain for a verdict, `None` where its kind names no bottleneck to remove (GPU-bound, low
/// SM activity, idle, unknown), its cause's share was not measured (told from pressure) or its
/// GPU barely ran. `gpu_bound_idle_max` is the verdict's GPU-bound threshold.
pub fn speedup(v: &Verdict, gpu_bound_idle_max: f64) -> Option<Speedup> {
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
    estimate(v.kind, v.gpu_busy_fraction, share, gpu_bound_idle_max)
}

/// The gain for a bottleneck of `kind` that costs `share` of the time of a job whose GPU is
/// `busy`: of one window ([`speedup`]), or of a run, from its windows' time-weighted means
/// (`report`: a step longer than a window leaves single windows with all or none of a step's
/// GPU time, so a run's figure is the steadier one).
pub fn estimate(
    kind: VerdictKind,
    busy: f64,
    share: f64,
    gpu_bound_idle_max: f64,
) -> Option<Speedup> {
    if !(0.0..1.0).contains(&share) || !busy.is_finite() || busy < BUSY_MIN {
        return None;
    }
    // Pageable copies keep the GPU "busy": its busy share holds part of the cause.
    let busy_holds_the_cause = kind == VerdictKind::HostTransfers;
    if !busy_holds_the_cause && share >= EXPLAINED_MIN * (1.0 - busy) {
        let floor = 1.0 - gpu_bound_idle_max;
        return Some(Speedup {
            low: floor / busy,
            likely: (1.0 + floor) / 2.0 / busy,
            high: 1.0 / busy,
        });
    }
    // Where b counts only kernels, no end passes 1 / b: the GPU busy all the time.
    let cap = if busy_holds_the_cause {
        f64::INFINITY
    } else {
        1.0 / busy
    };
    let gain = |s: f64| (1.0 / (1.0 - s.clamp(0.0, 1.0 - BUSY_MIN))).min(cap);
    Some(Speedup {
        low: gain(share - SHARE_ERROR),
        likely: gain(share),
        high: gain(share + SHARE_ERROR),
    })
}

/// The gain in words, for the advice.
pub fn describe(s: &Speedup) -> String {
    format!(
        "Removing it would likely make the steps {:.1}× as fast ({:.1}–{:.1}×).",
        s.likely, s.low, s.high
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{test_support::verdict, Contention, SplitMethod};

    const GPU_BOUND_IDLE_MAX: f64 = 0.25;

    fn verdict_of(kind: VerdictKind, busy: f64, input: Option<f64>, host: Option<f64>) -> Verdict {
        let mut v = verdict(kind, "");
        v.gpu_busy_fraction = busy;
        v.gpu_idle_fraction = 1.0 - busy;
        v.input_bound_share = input;
        v.host_bound_share = host;
        v
    }

    fn gain(v: &Verdict) -> Speedup {
        speedup(v, GPU_BOUND_IDLE_MAX).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_cause_that_explains_the_idle_time_leaves_the_job_gpu_bound() {
        // H200, the CPU-bound loader phase's means: busy 0.0463, wait share 0.9503 (16.9× real).
        let s = gain(&verdict_of(
            VerdictKind::InputBoundCpu,
            0.0463,
            Some(0.9503),
            None,
        ));
        assert!(close(s.low, 0.75 / 0.0463), "{s:?}");
        assert!(close(s.likely, 0.875 / 0.0463), "{s:?}");
        assert!(close(s.high, 1.0 / 0.0463), "{s:?}");
        assert!((s.low..=s.high).contains(&16.9));
        assert!(
            describe(&s).contains("18.9× as fast (16.2–21.6×)"),
            "{}",
            describe(&s)
        );
    }

    #[test]
    fn the_cause_must_explain_nine_tenths_of_the_idle_time() {
        // b 0.2, idle 0.8: the cause at 0.721 explains more than 0.9 of it, at 0.719 less.
        let at = gain(&verdict_of(
            VerdictKind::InputBoundIo,
            0.2,
            Some(0.721),
            None,
        ));
        assert!(close(at.likely, 0.875 / 0.2), "{at:?}");
        let s = 0.719;
        let past = gain(&verdict_of(VerdictKind::InputBoundIo, 0.2, Some(s), None));
        assert!(close(past.likely, 1.0 / (1.0 - s)), "{past:?}");
        assert!(close(past.low, 1.0 / (1.0 - s + SHARE_ERROR)), "{past:?}");
        assert!(close(past.high, 1.0 / (1.0 - s - SHARE_ERROR)), "{past:?}");
        // A busy GPU: the high end stops at 1 / b (0.7 + 0.265 + 0.04 is past all the time).
        let busy = gain(&verdict_of(VerdictKind::HostCpu, 0.7, None, Some(0.265)));
        assert!(close(busy.high, 1.0 / 0.7), "{busy:?}");
        assert!(close(busy.likely, 1.0 / 0.735), "{busy:?}");
    }

    #[test]
    fn pageable_copies_count_only_the_cause_whatever_the_busy_share() {
        // H100 pageable job's means: NVML busy 0.456 (its kernels' own 0.355), copy share
        // 0.646; pinned copies gave 2.82× the GPU work per second.
        let s = gain(&verdict_of(
            VerdictKind::HostTransfers,
            0.456,
            None,
            Some(0.646),
        ));
        assert!(close(s.likely, 1.0 / 0.354), "{s:?}");
        assert!(close(s.low, 1.0 / 0.394), "{s:?}");
        assert!(close(s.high, 1.0 / 0.314), "{s:?}");
        assert!((s.low..=s.high).contains(&2.82));
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
        let s = gain(&v);
        assert!(close(s.likely, 1.0 / 0.56), "{s:?}");
    }

    #[test]
    fn kinds_without_a_bottleneck_a_share_or_a_running_gpu_get_none() {
        for kind in [
            VerdictKind::GpuBound,
            VerdictKind::LowSmActivity,
            VerdictKind::Idle,
            VerdictKind::Unknown,
        ] {
            let v = verdict_of(kind, 0.5, Some(0.4), Some(0.4));
            assert_eq!(speedup(&v, GPU_BOUND_IDLE_MAX), None);
        }
        // Told from pressure: no share of the loop's time.
        let v = verdict_of(VerdictKind::InputBoundIo, 0.1, None, None);
        assert_eq!(speedup(&v, GPU_BOUND_IDLE_MAX), None);
        // Under 1 % busy, 1 / b says nothing to plan with; at 1 % it is given.
        let v = verdict_of(VerdictKind::InputBoundIo, 0.009, Some(0.98), None);
        assert_eq!(speedup(&v, GPU_BOUND_IDLE_MAX), None);
        let v = verdict_of(VerdictKind::InputBoundIo, 0.01, Some(0.98), None);
        assert!(close(gain(&v).high, 100.0));
    }

    #[test]
    fn the_gpu_bound_band_follows_the_verdicts_threshold() {
        let v = verdict_of(VerdictKind::InputBoundIo, 0.1, Some(0.9), None);
        let s = speedup(&v, 0.1).unwrap();
        assert!(
            close(s.low, 9.0) && close(s.likely, 9.5) && close(s.high, 10.0),
            "{s:?}"
        );
    }
}
