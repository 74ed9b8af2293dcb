//! Running totals for accounting, kept by `serve` across rounds and exported as `_total`
//! counters, so `increase()` over any range gives GPU-hours: per GPU its busy seconds and its
//! energy; per
//! workload the GPU-seconds it kept its GPUs busy, the GPU-seconds it held them idle (by the
//! verdict of the window: what the waste was for), the joules of its GPUs' energy charged to it
//! (busy, and idle by verdict), and its loader's seconds on a CPU, waiting for one and blocked.
//!
//! A window counts once its busy share is known; each adds `share × window seconds`. A
//! workload's totals go when it leaves the snapshot (its series end with it, as the gauges'
//! do), so the totals stay as many as the running workloads.
use crate::model::{ProcessRole, Snapshot, VerdictKind, WorkloadId};
use std::collections::BTreeMap;

/// One workload's totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadTotals {
    /// GPU-seconds its GPUs were busy with its work (summed over its GPUs).
    pub gpu_busy_seconds: f64,
    /// GPU-seconds it held a GPU without keeping it busy, by the window's verdict.
    pub gpu_idle_seconds: BTreeMap<VerdictKind, f64>,
    /// Its loader processes' seconds on a CPU, waiting for one, and blocked (D state).
    pub loader_on_cpu_seconds: f64,
    pub loader_runq_seconds: f64,
    pub loader_blocked_seconds: f64,
    /// Joules of its GPUs' energy charged to its busy part, and to the idle time it held them,
    /// by the window's verdict (`analysis::energy`).
    pub energy_busy_joules: f64,
    pub energy_idle_joules: BTreeMap<VerdictKind, f64>,
}

/// The totals since the agent started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accounting {
    pub gpu_busy_seconds: BTreeMap<u32, f64>,
    /// Joules per GPU (its power reading times each window).
    pub gpu_energy_joules: BTreeMap<u32, f64>,
    pub workloads: BTreeMap<WorkloadId, WorkloadTotals>,
}

impl Accounting {
    /// Adds one round's window.
    pub fn add(&mut self, s: &Snapshot) {
        let Some(window) = s.window_seconds.filter(|w| *w > 0.0 && w.is_finite()) else {
            return;
        };
        for g in &s.gpus {
            if let Some(e) = g.energy_joules {
                *self.gpu_energy_joules.entry(g.device.index).or_default() += e;
            }
            if let Some(b) = g.busy {
                *self.gpu_busy_seconds.entry(g.device.index).or_default() +=
                    b.fraction.clamp(0.0, 1.0) * window;
            }
        }
        self.workloads
            .retain(|id, _| s.workloads.iter().any(|w| &w.id == id));
        for w in &s.workloads {
            let t = self.workloads.entry(w.id.clone()).or_default();
            let parts: Vec<f64> = w
                .gpu
                .per_gpu
                .iter()
                .filter_map(|g| g.busy_fraction)
                .map(|b| b.clamp(0.0, 1.0))
                .collect();
            // Only a window whose every GPU part is known: a partial one would count the
            // unknown GPUs as idle.
            if !parts.is_empty() && parts.len() == w.gpu.per_gpu.len() {
                let busy: f64 = parts.iter().sum();
                t.gpu_busy_seconds += busy * window;
                let idle = (parts.len() as f64 - busy) * window;
                let kind = w.verdict.as_ref().map_or(VerdictKind::Unknown, |v| v.kind);
                *t.gpu_idle_seconds.entry(kind).or_default() += idle;
            }
            let kind = w.verdict.as_ref().map_or(VerdictKind::Unknown, |v| v.kind);
            for e in w.gpu.per_gpu.iter().filter_map(|g| g.energy) {
                t.energy_busy_joules += e.busy_joules;
                *t.energy_idle_joules.entry(kind).or_default() += e.idle_joules;
            }
            for p in w.stalls.iter().flat_map(|st| &st.processes) {
                if p.role == ProcessRole::Loader {
                    t.loader_on_cpu_seconds += p.on_cpu_seconds;
                    t.loader_runq_seconds += p.runq_seconds;
                    t.loader_blocked_seconds += p.blocked_seconds;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
    use crate::model::{BusySource, GpuBusy, SplitMethod, WorkloadGpuShare};

    fn round(at_ms: u64, busy: Option<f64>, kind: VerdictKind) -> Snapshot {
        let mut w = container("train");
        let mut share = WorkloadGpuShare::new(0, None);
        share.busy_fraction = busy;
        w.gpu.per_gpu.push(share);
        w.gpu.processes = 1;
        w.verdict = Some(crate::health::conditions::testing::verdict(kind, ""));
        let mut g = gpu(0);
        g.busy = busy.map(|fraction| GpuBusy {
            fraction,
            coverage: Some(1.0),
            source: BusySource::UtilizationSamples,
            split: SplitMethod::SoleHolder,
        });
        let mut s = snapshot(at_ms, vec![g], vec![w]);
        s.window_seconds = Some(2.0);
        s
    }

    #[test]
    fn busy_and_idle_gpu_seconds_add_up_by_verdict() {
        let mut a = Accounting::default();
        a.add(&round(0, Some(0.25), VerdictKind::InputBoundIo));
        a.add(&round(2000, Some(0.75), VerdictKind::GpuBound));
        a.add(&round(4000, None, VerdictKind::Unknown));
        assert_eq!(a.gpu_busy_seconds[&0], 2.0);
        let t = a.workloads.values().next().unwrap();
        assert_eq!(t.gpu_busy_seconds, 2.0);
        assert_eq!(t.gpu_idle_seconds[&VerdictKind::InputBoundIo], 1.5);
        assert_eq!(t.gpu_idle_seconds[&VerdictKind::GpuBound], 0.5);
        assert!(
            !t.gpu_idle_seconds.contains_key(&VerdictKind::Unknown),
            "an unknown part is no idle time"
        );
        // Gone from the snapshot: its totals go.
        let mut empty = snapshot(6000, vec![], vec![]);
        empty.window_seconds = Some(2.0);
        a.add(&empty);
        assert!(a.workloads.is_empty());
    }

    #[test]
    fn loader_seconds_add_up_over_rounds() {
        use crate::model::{IoSummary, ProcessRole, ProcessStall, StallWindow};
        let with_loader = |at: u64, on_cpu: f64, runq: f64, blocked: f64| {
            let mut s = round(at, Some(0.2), VerdictKind::InputBoundCpu);
            s.workloads[0].stalls = Some(StallWindow {
                cgroup_id: 1,
                processes: vec![ProcessStall {
                    pid: 2,
                    role: ProcessRole::Loader,
                    on_cpu_seconds: on_cpu,
                    runq_seconds: runq,
                    blocked_seconds: blocked,
                    sleep_seconds: 0.0,
                    switches: 1,
                    blocked_switches: 0,
                    main_thread: None,
                }],
                reads: IoSummary::default(),
                disk: IoSummary::default(),
                io_traced: true,
            });
            s
        };
        let mut a = Accounting::default();
        a.add(&with_loader(0, 1.5, 0.25, 0.125));
        a.add(&with_loader(2000, 1.0, 0.5, 0.25));
        let t = a.workloads.values().next().unwrap();
        assert_eq!(
            (
                t.loader_on_cpu_seconds,
                t.loader_runq_seconds,
                t.loader_blocked_seconds
            ),
            (2.5, 0.75, 0.375),
            "counters of a total, not of the last window"
        );
    }

    #[test]
    fn energy_adds_up_per_gpu_and_per_container_by_verdict() {
        let mut a = Accounting::default();
        for (at, kind, busy_j, idle_j) in [
            (0, VerdictKind::InputBoundIo, 50.0, 150.0),
            (2000, VerdictKind::GpuBound, 180.0, 20.0),
            (4000, VerdictKind::InputBoundIo, 40.0, 160.0),
        ] {
            let mut s = round(at, Some(0.5), kind);
            s.gpus[0].energy_joules = Some(200.0);
            s.workloads[0].gpu.per_gpu[0].energy = Some(crate::model::ShareEnergy {
                busy_joules: busy_j,
                idle_joules: idle_j,
            });
            a.add(&s);
        }
        assert_eq!(a.gpu_energy_joules[&0], 600.0);
        let t = a.workloads.values().next().unwrap();
        assert_eq!(t.energy_busy_joules, 270.0);
        assert_eq!(t.energy_idle_joules[&VerdictKind::InputBoundIo], 310.0);
        assert_eq!(t.energy_idle_joules[&VerdictKind::GpuBound], 20.0);
    }
}
