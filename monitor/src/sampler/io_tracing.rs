//! When the read and block programs are wanted (adaptive tracing). The scheduler programs, the
//! cgroup counters and NVML always run; the syscall tracepoints, which slow every system call on
//! the host while attached, go on when a published round shows a workload whose GPU idles
//! while its processes work (the case a verdict needs the read evidence for), and off again
//! once no workload has needed them for `linger`.
use super::demand::{Demand, TracingMode};
use crate::model::Snapshot;
use crate::units::duration;
use serde::Deserialize;
use std::time::{Duration, Instant};

/// The config file's `sources.read_tracing` section.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IoTracingConfig {
    pub mode: TracingMode,
    /// How long the programs stay attached after the last round that needed them.
    #[serde(with = "duration")]
    pub linger: Duration,
    /// A GPU idle at least this share of a round, while its workload's processes together ran,
    /// waited for a CPU or waited on I/O at least `active_share` of it, needs the evidence.
    pub idle_share: f64,
    pub active_share: f64,
}

impl Default for IoTracingConfig {
    fn default() -> Self {
        Self {
            mode: TracingMode::Adaptive,
            linger: Duration::from_secs(300),
            idle_share: 0.25,
            active_share: 0.1,
        }
    }
}

impl IoTracingConfig {
    /// For a one-shot window (`snapshot`, `doctor`): no earlier round can ask for the evidence,
    /// so adaptive tracing traces from the start (for seconds, at a cost nobody pays for long).
    pub fn for_one_shot(self) -> Self {
        Self {
            mode: self.mode.for_one_shot(),
            ..self
        }
    }

    pub fn validate(&self) -> Result<(), crate::field_error::FieldError> {
        crate::field_error::check_shares(&[
            ("idle_share", self.idle_share),
            ("active_share", self.active_share),
        ])
    }
}

/// When the read programs are wanted.
#[derive(Debug)]
pub struct IoDemand {
    config: IoTracingConfig,
    demand: Demand,
}

impl IoDemand {
    pub fn new(config: IoTracingConfig) -> Self {
        Self {
            config,
            demand: Demand::new(config.mode, config.linger),
        }
    }

    pub fn mode(&self) -> TracingMode {
        self.demand.mode()
    }

    /// Why the programs are wanted now, if they are.
    pub fn reason(&self) -> Option<&str> {
        self.demand.reason.as_deref()
    }

    /// Looks at a published round for a workload that needs the read evidence.
    pub fn observe(&mut self, snap: &Snapshot, now: Instant) {
        self.demand.note(needs_evidence(snap, &self.config), now);
    }

    /// Whether the programs should be attached now.
    pub fn wanted(&mut self, now: Instant) -> bool {
        self.demand.wanted(now)
    }
}

/// The first workload whose GPU idles while its processes work, in words.
fn needs_evidence(snap: &Snapshot, c: &IoTracingConfig) -> Option<String> {
    let window = snap.window_seconds.filter(|w| *w > 0.0)?;
    snap.workloads.iter().filter(|w| !w.exited).find_map(|w| {
        // The GPU's own idle time: a wait behind other holders' kernels is contention, which
        // the read evidence cannot explain.
        let idle = w.gpu.idle_fraction()?;
        // Summed over its processes: a loader may fork short-lived readers.
        let worked: f64 = w
            .stalls
            .as_ref()?
            .processes
            .iter()
            .map(|p| p.on_cpu_seconds + p.runq_seconds + p.blocked_seconds)
            .sum();
        let active = worked / window >= c.active_share;
        (w.gpu.processes > 0 && idle >= c.idle_share && active).then(|| {
            format!(
                "{}: GPU idle {:.0}% while its processes work",
                w.name,
                idle * 100.0
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, snapshot};
    use crate::model::{ProcessRole, ProcessStall, StallWindow};

    fn round(busy: f64, loader_on_cpu: f64) -> Snapshot {
        let mut w = container("trainer");
        w.gpu.processes = 1;
        w.gpu.busy_fraction = Some(busy);
        w.stalls = Some(StallWindow {
            cgroup_id: 1,
            processes: vec![ProcessStall {
                pid: 7,
                role: ProcessRole::Loader,
                on_cpu_seconds: loader_on_cpu,
                runq_seconds: 0.0,
                blocked_seconds: 0.0,
                sleep_seconds: 1.0 - loader_on_cpu,
                switches: 3,
                blocked_switches: 0,
                main_thread: None,
            }],
            reads: Default::default(),
            disk: Default::default(),
            io_traced: true,
        });
        let mut s = snapshot(0, Vec::new(), vec![w]);
        s.window_seconds = Some(1.0);
        s
    }

    #[test]
    fn wanted_while_a_gpu_idles_under_work_and_for_the_linger_after() {
        let config = IoTracingConfig {
            linger: Duration::from_secs(5),
            ..Default::default()
        };
        let mut d = IoDemand::new(config);
        let t0 = Instant::now();
        d.observe(&round(0.95, 0.5), t0);
        assert!(!d.wanted(t0), "a busy GPU needs no read evidence");
        d.observe(&round(0.2, 0.0), t0);
        assert!(
            !d.wanted(t0),
            "an idle GPU whose job sleeps: nothing to explain"
        );
        d.observe(&round(0.2, 0.6), t0);
        assert!(d.wanted(t0));
        assert!(d.reason().unwrap().contains("trainer: GPU idle 80%"));
        d.observe(&round(0.95, 0.5), t0 + Duration::from_secs(3));
        assert!(d.wanted(t0 + Duration::from_secs(5)), "within the linger");
        assert!(!d.wanted(t0 + Duration::from_secs(6)), "the linger is over");
        assert!(d.reason().is_none());
    }

    /// `round` with the workload's own share `own` of a GPU that all its holders kept busy
    /// `device` of the window.
    fn shared_round(own: f64, device: f64) -> Snapshot {
        let mut s = round(own, 0.6);
        let mut share = crate::model::WorkloadGpuShare::new(0, None);
        share.busy_fraction = Some(own);
        share.device_busy_fraction = Some(device);
        s.workloads[0].gpu.per_gpu = vec![share];
        s
    }

    #[test]
    fn a_gpu_kept_busy_by_other_holders_is_not_idle() {
        let t = Instant::now();
        let wanted = |s: &Snapshot| {
            let mut d = IoDemand::new(IoTracingConfig::default());
            d.observe(s, t);
            d.wanted(t)
        };
        // Its own share is 12 %, but the GPU was busy 95 % of the window: contention.
        assert!(!wanted(&shared_round(0.12, 0.95)));
        // At the threshold: idle 25 % of the window (idle_share 0.25) wants the evidence.
        assert!(wanted(&shared_round(0.12, 0.75)));
        assert!(!wanted(&shared_round(0.12, 0.76)));
        // The GPU idle 60 % of the window while its processes worked: the reads may say why.
        assert!(wanted(&shared_round(0.12, 0.4)));
    }

    #[test]
    fn always_and_off_ignore_the_rounds() {
        let t = Instant::now();
        let mut always = IoDemand::new(IoTracingConfig {
            mode: TracingMode::Always,
            ..Default::default()
        });
        assert!(always.wanted(t));
        let mut off = IoDemand::new(IoTracingConfig {
            mode: TracingMode::Off,
            ..Default::default()
        });
        off.observe(&round(0.1, 0.9), t);
        assert!(!off.wanted(t));
    }
}
