//! Splitting a GPU's busy time between the workloads that hold it.
//!
//! A GPU held by one workload needs no split: the workload's busy share is the GPU's. When
//! several hold it, the evidence is weaker, and the method is reported with the result:
//!
//! - **host CPU time** of the GPU processes, when every process that did anything shows it: a
//!   CUDA process's host thread runs while its work is queued or awaited (PyTorch's default
//!   synchronisation spins), so its CPU time tracks its time on the GPU. An estimate, said so.
//!   On the H200, two containers at 70 % and 30 % duty (really 45 % and 13 % of the GPU) spent
//!   3.53 s and 1.54 s on a CPU in a 5-s window: 47 % and 21 % of the GPU by this estimate.
//! - **the driver's split** (`GetProcessUtilization` over the span), when some active process
//!   shows no CPU time but every active one has a driver share: each 200-ms sample period goes
//!   wholly to one process. Its figures for those two containers were 23 and 46: the 30 % job
//!   got twice the 70 % one's share, and in the next 10-s span 0.50 and 0.19. So it comes
//!   second.
//! - **partial**: the driver's figures for the processes it credited, unknown for the active
//!   processes it did not, when neither covers every active process.
//!
//! The driver is asked only when its figures could change the split ([`driver_could_matter`]):
//! when every holder ran on a CPU, the host CPU estimate stands whatever it would say.
//!
//! "Active" means a driver share above 0 or at least 1 % of the window on a CPU. A holder that
//! did neither gets 0: it holds memory and ran nothing visible. One that may have run is never
//! given 0: its share is unknown.

use crate::model::{GpuProcess, SplitMethod, WorkloadId};

/// One process holding the GPU, with the evidence of its use.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub workload: Option<WorkloadId>,
    /// Host CPU seconds in the window; `None` when not measured (the process is gone).
    pub cpu_seconds: Option<f64>,
    /// The driver's SM share over the span, percent; `None`: the driver credited it nothing.
    pub driver_percent: Option<u32>,
}

impl From<&GpuProcess> for Holder {
    fn from(p: &GpuProcess) -> Self {
        Holder {
            workload: p.workload.clone(),
            cpu_seconds: p.host_cpu_seconds,
            driver_percent: p.driver_sm_percent,
        }
    }
}

/// CPU time below this share of the window is no evidence of activity.
const ACTIVE_CPU_SHARE: f64 = 0.01;

/// Whether the driver's figures could change how these holders' busy time is split. Not when
/// every holder ran on a CPU for the window's active share: the split then rests on the host
/// CPU time alone, whatever the driver says, and asking it costs ~2 ms a GPU.
pub fn driver_could_matter(holders: &[Holder], window_seconds: f64) -> bool {
    !holders.iter().all(|h| cpu_active(h, window_seconds))
}

fn cpu_active(h: &Holder, window_seconds: f64) -> bool {
    h.cpu_seconds
        .is_some_and(|c| c >= ACTIVE_CPU_SHARE * window_seconds)
}

/// Each holder's share of the GPU's busy time (0..=1, summing to at most 1), `None` where
/// unknown.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub method: SplitMethod,
    pub shares: Vec<Option<f64>>,
}

pub fn split(holders: &[Holder], window_seconds: f64) -> Split {
    let n = holders.len();
    let first = holders.first().map(|h| &h.workload);
    if n == 0 {
        return Split {
            method: SplitMethod::NoProcesses,
            shares: Vec::new(),
        };
    }
    if first.is_some_and(|w| w.is_some() && holders.iter().all(|h| &h.workload == w)) {
        return even(holders, SplitMethod::SoleHolder, |_| true);
    }
    let cpu_active = |h: &Holder| cpu_active(h, window_seconds);
    let sampled = |h: &Holder| h.driver_percent.is_some_and(|p| p > 0);
    let active: Vec<bool> = holders
        .iter()
        .map(|h| cpu_active(h) || sampled(h))
        .collect();
    let active_holders: Vec<&Holder> = holders
        .iter()
        .zip(&active)
        .filter_map(|(h, a)| a.then_some(h))
        .collect();
    let Some(lead) = active_holders.first() else {
        return Split {
            method: SplitMethod::Unknown,
            shares: vec![None; n],
        };
    };
    if lead.workload.is_some() && active_holders.iter().all(|h| h.workload == lead.workload) {
        let w = lead.workload.clone();
        return even(holders, SplitMethod::SoleActiveHolder, |h| h.workload == w);
    }
    if active_holders.iter().all(|h| cpu_active(h)) {
        return weighted(holders, &active, SplitMethod::HostCpuEstimate, |h| {
            h.cpu_seconds.unwrap_or(0.0)
        });
    }
    if active_holders.iter().all(|h| sampled(h)) {
        return weighted(holders, &active, SplitMethod::ProcessSamples, |h| {
            f64::from(h.driver_percent.unwrap_or(0))
        });
    }
    // The driver's figures where it credited periods, unknown for the active rest.
    let total: f64 = holders
        .iter()
        .filter(|h| sampled(h))
        .map(|h| f64::from(h.driver_percent.unwrap_or(0)))
        .sum();
    let shares = holders
        .iter()
        .zip(&active)
        .map(|(h, a)| match (a, sampled(h)) {
            (false, _) => Some(0.0),
            (true, true) => Some(f64::from(h.driver_percent.unwrap_or(0)) / total),
            (true, false) => None,
        })
        .collect();
    Split {
        method: SplitMethod::Partial,
        shares,
    }
}

/// The whole busy time to the holders `is_ours` picks, evenly: one workload, whose processes
/// the caller sums, so the per-process division does not matter.
fn even(holders: &[Holder], method: SplitMethod, is_ours: impl Fn(&Holder) -> bool) -> Split {
    let ours = holders.iter().filter(|h| is_ours(h)).count().max(1) as f64;
    Split {
        method,
        shares: holders
            .iter()
            .map(|h| Some(if is_ours(h) { 1.0 / ours } else { 0.0 }))
            .collect(),
    }
}

fn weighted(
    holders: &[Holder],
    active: &[bool],
    method: SplitMethod,
    weight: impl Fn(&Holder) -> f64,
) -> Split {
    let total: f64 = holders
        .iter()
        .zip(active)
        .filter(|(_, a)| **a)
        .map(|(h, _)| weight(h))
        .sum();
    Split {
        method,
        shares: holders
            .iter()
            .zip(active)
            .map(|(h, a)| {
                Some(if *a && total > 0.0 {
                    weight(h) / total
                } else {
                    0.0
                })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkloadKind;

    fn w(name: &str) -> Option<WorkloadId> {
        Some(WorkloadId {
            kind: WorkloadKind::Docker,
            id: name.into(),
        })
    }

    fn h(workload: &str, cpu: Option<f64>, driver: Option<u32>) -> Holder {
        Holder {
            workload: w(workload),
            cpu_seconds: cpu,
            driver_percent: driver,
        }
    }

    #[test]
    fn one_workload_takes_it_all_without_evidence() {
        let s = split(&[h("a", None, None), h("a", Some(0.5), None)], 1.0);
        assert_eq!(s.method, SplitMethod::SoleHolder);
        assert_eq!(s.shares, vec![Some(0.5), Some(0.5)]);
        let s = split(&[], 1.0);
        assert_eq!(s.method, SplitMethod::NoProcesses);
    }

    #[test]
    fn an_idle_second_holder_does_not_make_a_split() {
        let s = split(&[h("a", Some(0.4), None), h("b", Some(0.0), None)], 1.0);
        assert_eq!(s.method, SplitMethod::SoleActiveHolder);
        assert_eq!(s.shares, vec![Some(1.0), Some(0.0)]);
    }

    #[test]
    fn a_holder_is_active_from_one_percent_of_the_window_on_a_cpu() {
        // A holder that only polls (an idle notebook kernel, a monitoring thread) shows a
        // little CPU time: under 1 % of the window it did not run on the GPU.
        let s = split(&[h("a", Some(0.8), None), h("b", Some(0.019), None)], 2.0);
        assert_eq!(s.method, SplitMethod::SoleActiveHolder);
        assert_eq!(s.shares, vec![Some(1.0), Some(0.0)]);
        let s = split(&[h("a", Some(0.8), None), h("b", Some(0.02), None)], 2.0);
        assert_eq!(s.method, SplitMethod::HostCpuEstimate);
        assert!((s.shares[1].unwrap() - 0.02 / 0.82).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn host_cpu_time_when_every_active_process_shows_it() {
        // H200, two containers at 70 % and 30 % duty in a 5-s window: the driver credited the
        // second twice the first's (23 and 46); their CPU time, 3.53 s and 1.54 s, is nearer
        // their own 45 % and 13 %.
        let s = split(
            &[h("a", Some(3.53), Some(23)), h("b", Some(1.54), Some(46))],
            5.0,
        );
        assert_eq!(s.method, SplitMethod::HostCpuEstimate);
        assert!((s.shares[0].unwrap() - 3.53 / 5.07).abs() < 1e-9);
        assert!((s.shares[0].unwrap() + s.shares[1].unwrap() - 1.0).abs() < 1e-9);
        // One the driver missed altogether is still counted by its CPU time.
        let s = split(
            &[h("a", Some(0.70), Some(69)), h("b", Some(0.31), None)],
            1.0,
        );
        assert_eq!(s.method, SplitMethod::HostCpuEstimate);
        assert!(s.shares[1].unwrap() > 0.3);
    }

    #[test]
    fn the_drivers_split_when_an_active_process_shows_no_cpu_time() {
        // Work queued without a host thread to show for it (CUDA graphs, blocking sync): the
        // driver's figures, as long as it credited every active process.
        let s = split(
            &[h("a", Some(0.0), Some(44)), h("b", Some(0.9), Some(54))],
            1.0,
        );
        assert_eq!(s.method, SplitMethod::ProcessSamples);
        assert!((s.shares[0].unwrap() - 44.0 / 98.0).abs() < 1e-9);
    }

    #[test]
    fn never_zero_for_a_process_that_may_have_run() {
        // The driver credits a process that shows no CPU time; another runs on the CPU but has
        // no periods: no method covers both, so the second is unknown, not 0.
        let s = split(
            &[
                h("a", Some(0.0), Some(60)),
                h("b", Some(0.2), None),
                h("c", Some(0.0), None),
            ],
            1.0,
        );
        assert_eq!(s.method, SplitMethod::Partial);
        assert_eq!(s.shares, vec![Some(1.0), None, Some(0.0)]);
        // Nobody active, yet the GPU may be busy: unknown for all.
        let s = split(&[h("a", Some(0.0), None), h("b", None, None)], 1.0);
        assert_eq!(s.method, SplitMethod::Unknown);
        assert_eq!(s.shares, vec![None, None]);
    }

    #[test]
    fn the_driver_could_matter_only_while_a_holder_is_not_busy_on_a_cpu() {
        // Window 2 s: active from 0.02 s on a CPU, as in `split`.
        let busy = [h("a", Some(0.8), None), h("b", Some(0.02), None)];
        assert!(!driver_could_matter(&busy, 2.0));
        let idle = [h("a", Some(0.8), None), h("b", Some(0.019), None)];
        assert!(driver_could_matter(&idle, 2.0));
        let gone = [h("a", Some(0.8), None), h("b", None, None)];
        assert!(driver_could_matter(&gone, 2.0), "a process not measured");
    }

    #[test]
    fn while_the_driver_cannot_matter_its_figures_change_nothing() {
        // What lets the sampler skip the driver's ~2-ms call: for holders all busy on a CPU,
        // the split is the same whatever the driver would have said.
        let cpu = [
            (Some(0.8), "a"),
            (Some(0.02), "b"),
            (Some(0.3), "a"),
            (Some(1.9), "c"),
        ];
        let drivers = [None, Some(0), Some(7), Some(100)];
        for n in 2..=cpu.len() {
            let holders = |d: &dyn Fn(usize) -> Option<u32>| -> Vec<Holder> {
                cpu[..n]
                    .iter()
                    .enumerate()
                    .map(|(i, (c, w))| h(w, *c, d(i)))
                    .collect()
            };
            let without = holders(&|_| None);
            assert!(!driver_could_matter(&without, 2.0));
            let want = split(&without, 2.0);
            for shift in 0..drivers.len() {
                let with = holders(&|i| drivers[(i + shift) % drivers.len()]);
                assert_eq!(split(&with, 2.0), want, "{with:?}");
            }
        }
    }
}
