//! The verdict's promises, held over many generated windows: whatever the measurements, the
//! kind and the advice never deny the evidence beside them.
//!
//! Each window is drawn at random (a fixed seed, so a failure replays): the GPU's busy share
//! and the kernels' part of it, a GPU process's main thread and other threads, loader
//! processes, CUDA calls traced or not, a quota and its throttling, a cpuset, the host's CPUs.
use super::*;
use crate::model::{
    CpuUsage, CudaCalls, CudaProcessCalls, CudaWindow, IoSummary, ProcessRole, ProcessStall,
    StallWindow, ThreadTimes, Transfer, WorkloadGpuShare, WorkloadId, WorkloadKind,
};

/// xorshift64*: enough randomness for generated windows, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in [0, max), or exactly 0 now and then (an edge people hit).
    fn share(&mut self, max: f64) -> f64 {
        if self.chance(0.1) {
            0.0
        } else {
            self.unit() * max
        }
    }
}

/// Thread times that add up to the window: on a CPU, in the run queue, blocked, asleep.
fn times(r: &mut Rng) -> ThreadTimes {
    let cpu = r.share(1.0);
    let runq = r.share(1.0 - cpu);
    let blocked = r.share(1.0 - cpu - runq);
    ThreadTimes {
        on_cpu_seconds: cpu,
        runq_seconds: runq,
        blocked_seconds: blocked,
        sleep_seconds: (1.0 - cpu - runq - blocked).max(0.0),
    }
}

fn calls(r: &mut Rng, budget: f64) -> CudaCalls {
    let copy = r.share(budget);
    let sync = r.share(budget - copy);
    CudaCalls {
        launches: (r.share(1.0) * 100_000.0) as u64,
        h2d: Transfer {
            count: (r.share(1.0) * 500.0) as u64 + 1,
            bytes: 1 << 24,
            call_seconds: copy * r.unit(),
            wait_seconds: copy * r.unit() * 0.5,
            between_seconds: copy * r.unit() * 0.1,
        },
        syncs: 10,
        sync_seconds: sync,
        ..Default::default()
    }
}

/// A generated window of one workload holding one GPU.
fn window(r: &mut Rng) -> Workload {
    let mut w = Workload::new(
        WorkloadId {
            kind: WorkloadKind::Cgroup,
            id: "/job".into(),
        },
        if r.chance(0.2) {
            "yolo-train"
        } else {
            "trainer"
        }
        .into(),
        None,
    );
    let busy = r.share(1.0);
    let mut share = WorkloadGpuShare::new(0, None);
    share.busy_fraction = Some(busy);
    share.device_busy_fraction = Some(busy);
    share.kernel_fraction = r.chance(0.5).then(|| r.unit());
    share.sm_activity_percent = r.chance(0.5).then(|| r.unit() * 100.0);
    share.pcie_bytes_per_second = r.chance(0.5).then(|| r.unit() * 3e10);
    w.gpu.busy_fraction = Some(busy);
    w.gpu.processes = 1;
    w.gpu.memory_bytes = 1 << 30;
    w.gpu.per_gpu = vec![share];
    let main = times(r);
    let others = r.share(8.0);
    let mut processes = vec![ProcessStall {
        pid: 1,
        role: ProcessRole::Gpu,
        on_cpu_seconds: main.on_cpu_seconds + others,
        runq_seconds: main.runq_seconds,
        blocked_seconds: main.blocked_seconds,
        sleep_seconds: main.sleep_seconds + r.share(10.0),
        switches: 10,
        blocked_switches: 0,
        main_thread: Some(main),
    }];
    for pid in 2..2 + (r.unit() * 4.0) as u32 {
        let t = times(r);
        processes.push(ProcessStall {
            pid,
            role: ProcessRole::Loader,
            on_cpu_seconds: t.on_cpu_seconds,
            runq_seconds: t.runq_seconds,
            blocked_seconds: t.blocked_seconds,
            sleep_seconds: t.sleep_seconds,
            switches: 10,
            blocked_switches: 0,
            main_thread: None,
        });
    }
    w.stalls = Some(StallWindow {
        cgroup_id: 1,
        processes,
        reads: IoSummary::default(),
        disk: IoSummary::default(),
        io_traced: true,
    });
    if r.chance(0.7) {
        let main_calls = calls(r, main.on_cpu_seconds + main.runq_seconds);
        let mut all = main_calls;
        all.launches += (r.share(1.0) * 50_000.0) as u64;
        w.cuda = Some(CudaWindow {
            traced: true,
            total: all,
            processes: vec![CudaProcessCalls {
                pid: 1,
                calls: all,
                main_thread: main_calls,
            }],
        });
    }
    let quota = r.chance(0.4).then(|| 0.5 + r.unit() * 4.0);
    let throttled = quota.map(|_| r.share(0.8));
    if let Some(q) = quota {
        // The container's tasks cannot be on CPUs more than its quota: the rest of their
        // runnable time is throttled, in the run queue.
        fit_to_quota(w.stalls.as_mut().expect("stalls"), q);
    }
    w.cpu = Some(CpuUsage {
        usage_seconds_total: 10.0,
        cores: Some(r.share(8.0)),
        limit_cores: quota,
        cpuset_cpus: r.chance(0.3).then(|| 1 + (r.unit() * 7.0) as u32),
        throttled_seconds_total: throttled,
        throttled_fraction: throttled,
        quota_periods: None,
    });
    w
}

/// Scales every process's (and main thread's) time on a CPU so that together they fit `quota`
/// CPUs, moving the rest to the run queue.
fn fit_to_quota(stalls: &mut StallWindow, quota: f64) {
    let on_cpu: f64 = stalls.processes.iter().map(|p| p.on_cpu_seconds).sum();
    if on_cpu <= quota {
        return;
    }
    let k = quota / on_cpu;
    for p in &mut stalls.processes {
        let cut = p.on_cpu_seconds * (1.0 - k);
        p.on_cpu_seconds -= cut;
        p.runq_seconds += cut;
        if let Some(m) = &mut p.main_thread {
            let cut = m.on_cpu_seconds * (1.0 - k);
            m.on_cpu_seconds -= cut;
            m.runq_seconds += cut;
        }
    }
}

/// The CPU counts an advice says the container may use ("of the 2 CPUs the container may
/// use", "its cpuset's 2 CPUs", "its quota of 1.5 CPUs", "the host's 16 CPUs").
fn named_cpus(advice: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for marker in ["of the ", "'s ", "quota of "] {
        for (i, _) in advice.match_indices(marker) {
            let rest = &advice[i + marker.len()..];
            let Some((n, after)) = rest.split_once(' ') else {
                continue;
            };
            if after.starts_with("CPU") {
                if let Ok(n) = n.parse() {
                    out.push(n);
                }
            }
        }
    }
    out
}

/// Every promise, for one window's verdict; the broken one, in words.
fn broken(w: &Workload, v: &Verdict, host_cpus: u32, c: &VerdictConfig) -> Option<String> {
    let throttled = v.cpu_throttled_fraction.unwrap_or(0.0);
    let cpu_kind = matches!(
        v.kind,
        VerdictKind::InputBoundCpu | VerdictKind::HostCpu | VerdictKind::HostLaunches
    );
    if cpu_kind && throttled >= c.throttled_min && !v.advice.contains("CPU quota") {
        return Some("a throttled CPU-bound job's advice does not name the quota".into());
    }
    if cpu_kind && throttled >= c.throttled_min && v.advice.contains("outside") {
        return Some("a throttled job is sent to look outside".into());
    }
    if let Some(h) = &v.host {
        if v.kind == VerdictKind::GpuBound && h.kernel_busy_fraction < 1.0 - c.gpu_bound_idle_max {
            return Some("GPU-bound while its kernels idled past the threshold".into());
        }
        if v.kind == VerdictKind::Idle
            && h.main_thread_busy_fraction + h.other_threads_cores > c.loader_idle
        {
            return Some("idle while the training loop's threads were at work".into());
        }
    }
    if v.kind == VerdictKind::Idle && throttled >= c.throttled_min {
        return Some("idle while the quota held it back".into());
    }
    if v.kind == VerdictKind::Unknown {
        if let Some(x) = v.idle_explained_fraction {
            if x >= c.explained_min {
                return Some(format!("unknown though the causes explain {x:.2}"));
            }
            if !v
                .advice
                .contains(&format!("explain only {}", words::pct(x)))
            {
                return Some("unknown without saying how much was explained".into());
            }
        }
    }
    if v.kind == VerdictKind::InputBoundCpu && v.advice.contains("raise num_workers") {
        let l = v.loader.as_ref().expect("a loader");
        if l.runq_share >= 1.0 / 3.0 || throttled >= c.throttled_min {
            return Some("more workers advised to a loader short of CPUs".into());
        }
    }
    let usable = Cpus::of(w, Some(host_cpus)).usable().unwrap_or(f64::MAX);
    if named_cpus(&v.advice).iter().any(|n| *n > usable + 0.05) {
        return Some(format!(
            "advice names more CPUs than the container's {usable}"
        ));
    }
    if v.advice.contains("imgsz") && !w.name.contains("yolo") {
        return Some("a YOLO flag advised to a job that is not YOLO".into());
    }
    for (what, x) in [
        ("host-bound share", v.host_bound_share),
        ("input-bound share", v.input_bound_share),
        ("explained", v.idle_explained_fraction),
    ] {
        if x.is_some_and(|x| !(0.0..=1.0 + 1e-9).contains(&x)) {
            return Some(format!("{what} {x:?} out of [0, 1]"));
        }
    }
    None
}

#[test]
fn no_verdict_denies_its_own_evidence_over_generated_windows() {
    let config = VerdictConfig::default();
    let ebpf = SourceState::up();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seen = std::collections::BTreeMap::new();
    for case in 0..20_000 {
        let w = window(&mut r);
        let host_cpus = 2 + (r.unit() * 30.0) as u32;
        let facts = HostFacts {
            ebpf: &ebpf,
            cpus: Some(host_cpus),
        };
        let v = assess(&w, Some(1.0), facts, None, &config).expect("a GPU workload");
        *seen.entry(v.kind).or_insert(0) += 1;
        if let Some(why) = broken(&w, &v, host_cpus, &config) {
            panic!("case {case}: {why}\n{v:#?}\n{w:#?}");
        }
    }
    // The generator reaches every kind a traced window can get.
    for kind in [
        VerdictKind::InputBoundIo,
        VerdictKind::InputBoundCpu,
        VerdictKind::HostTransfers,
        VerdictKind::HostLaunches,
        VerdictKind::HostCpu,
        VerdictKind::HostSync,
        VerdictKind::GpuBound,
        VerdictKind::LowSmActivity,
        VerdictKind::Idle,
        VerdictKind::Unknown,
    ] {
        assert!(seen.contains_key(&kind), "{kind} never drawn: {seen:?}");
    }
}
