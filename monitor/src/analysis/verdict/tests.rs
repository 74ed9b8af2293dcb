//! The verdict at each of its thresholds, on windows built by hand.
use super::*;

/// The host's facts as a test host has them: 16 CPUs.
fn host(ebpf: &SourceState) -> HostFacts<'_> {
    HostFacts {
        ebpf,
        cpus: Some(16),
    }
}
use crate::model::{
    CpuUsage, CudaCalls, CudaProcessCalls, CudaWindow, IoSummary, Pressure, ProcessStall,
    SplitMethod, StallWindow, ThreadTimes, Transfer, WorkloadGpu, WorkloadGpuShare,
};
use crate::model::{ProcessRole, WorkloadId, WorkloadKind};
use std::collections::BTreeMap;

/// A process whose threads' times add up to these; a GPU process's main thread has them
/// all (a single-threaded trainer) unless a test says otherwise.
fn proc(
    pid: u32,
    role: ProcessRole,
    cpu: f64,
    runq: f64,
    blocked: f64,
    sleep: f64,
) -> ProcessStall {
    ProcessStall {
        pid,
        role,
        on_cpu_seconds: cpu,
        runq_seconds: runq,
        blocked_seconds: blocked,
        sleep_seconds: sleep,
        switches: 10,
        blocked_switches: 0,
        main_thread: (role == ProcessRole::Gpu).then_some(ThreadTimes {
            on_cpu_seconds: cpu,
            runq_seconds: runq,
            blocked_seconds: blocked,
            sleep_seconds: sleep,
        }),
    }
}

/// A GPU process with helper threads: `main` is the training loop's own times.
fn trainer(pid: u32, all: (f64, f64), main: ThreadTimes) -> ProcessStall {
    ProcessStall {
        main_thread: Some(main),
        ..proc(pid, GPU, all.0, 0.0, 0.0, all.1)
    }
}

fn workload(busy: f64, processes: Vec<ProcessStall>, throttled: Option<f64>) -> Workload {
    Workload {
        id: WorkloadId {
            kind: WorkloadKind::Cgroup,
            id: "/job".into(),
        },
        kind: WorkloadKind::Cgroup,
        name: "/job".into(),
        container: None,
        container_unverified: None,
        exited: false,
        cgroup_path: None,
        cpu: Some(CpuUsage {
            usage_seconds_total: 1.0,
            cores: Some(1.0),
            limit_cores: throttled.map(|_| 0.5),
            cpuset_cpus: None,
            throttled_seconds_total: throttled,
            throttled_fraction: throttled,
            quota_periods: None,
        }),
        memory: None,
        pressure: None,
        gpu: WorkloadGpu {
            memory_bytes: 1 << 30,
            processes: 1,
            busy_fraction: Some(busy),
            per_gpu: Vec::new(),
            process_cpu: None,
        },
        stalls: Some(StallWindow {
            cgroup_id: 1,
            processes,
            reads: IoSummary::default(),
            disk: IoSummary::default(),
            io_traced: true,
        }),
        cuda: None,
        verdict: None,
        oom_headroom: None,
        config: None,
        ranks: Vec::new(),
        straggler: None,
        errors: BTreeMap::new(),
    }
}

fn up() -> SourceState {
    SourceState::up()
}

fn assess1(w: &Workload) -> Verdict {
    assess(w, Some(1.0), host(&up()), None, &VerdictConfig::default()).expect("a GPU workload")
}

const GPU: ProcessRole = ProcessRole::Gpu;
const LOADER: ProcessRole = ProcessRole::Loader;

#[test]
fn a_saturated_blocked_loader_is_input_bound_io() {
    let w = workload(
        0.1,
        vec![
            proc(1, GPU, 0.05, 0.0, 0.0, 0.95),
            proc(2, LOADER, 0.02, 0.0, 0.95, 0.03),
        ],
        None,
    );
    let v = assess1(&w);
    assert_eq!(v.kind, VerdictKind::InputBoundIo);
    // The trainer waited 95 % of the window; the GPU idled 90 %: all of the idle.
    let share = v.input_bound_share.unwrap();
    assert!((share - 0.9).abs() < 1e-9, "{share}");
    assert!((v.trainer_wait_fraction.unwrap() - 0.95).abs() < 1e-9);
    assert!(v.advice.contains("storage"));
}

#[test]
fn the_input_bound_share_is_the_trainers_wait_not_the_loaders_saturation() {
    // A CPU-bound loader (2 workers on CPU all window) and a trainer that waits for its
    // batches 80 % of the window, launching and syncing the rest, on a GPU idle 90 %: 80 %
    // of the window is waiting for data. (idle × saturation would say 90 %.)
    let w = workload(
        0.1,
        vec![
            trainer(
                1,
                (0.25, 9.0),
                ThreadTimes {
                    on_cpu_seconds: 0.2,
                    sleep_seconds: 0.8,
                    ..Default::default()
                },
            ),
            proc(2, LOADER, 0.98, 0.02, 0.0, 0.0),
            proc(3, LOADER, 0.97, 0.03, 0.0, 0.0),
        ],
        None,
    );
    let v = assess1(&w);
    assert_eq!(v.kind, VerdictKind::InputBoundCpu);
    assert!((v.input_bound_share.unwrap() - 0.8).abs() < 1e-9, "{v:?}");
    assert!(v.loader.unwrap().busy_fraction > 0.95);
    // Helper threads asleep (9 s over all threads) do not count: only the main thread's.
    assert!(
        v.evidence.iter().any(|e| e.contains("waited 80%")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn a_saturated_cpu_loader_is_input_bound_cpu_and_a_quota_is_named() {
    // On its CPUs: more workers would help.
    let free = vec![
        proc(1, GPU, 0.05, 0.0, 0.0, 0.95),
        proc(2, LOADER, 0.9, 0.05, 0.0, 0.05),
    ];
    let v = assess1(&workload(0.3, free.clone(), None));
    assert_eq!(v.kind, VerdictKind::InputBoundCpu);
    assert!(v.advice.contains("raise num_workers"), "{}", v.advice);
    assert!(v.advice.contains("the host's 16 CPUs"), "{}", v.advice);
    // Held back by the quota (throttled_min 0.1 and a hair under): the quota leads.
    let v = assess1(&workload(0.3, free.clone(), Some(0.1)));
    assert_eq!(v.kind, VerdictKind::InputBoundCpu);
    assert!(
        v.advice.contains("CPU quota (0.5 CPUs) throttled it 10%"),
        "{}",
        v.advice
    );
    let v = assess1(&workload(0.3, free, Some(0.099)));
    assert!(!v.advice.contains("CPU quota ("), "{}", v.advice);
    // Waiting for CPUs a third of its busy time: the host's CPUs are taken, and more workers
    // will not help; a hair under a third, they would.
    let waiting = |runq: f64| {
        vec![
            proc(1, GPU, 0.05, 0.0, 0.0, 0.95),
            proc(2, LOADER, 0.9 - runq, runq, 0.0, 0.1),
        ]
    };
    let v = assess1(&workload(0.3, waiting(0.301), None));
    assert!(v.advice.contains("will not help"), "{}", v.advice);
    assert!(!v.advice.contains("raise num_workers"), "{}", v.advice);
    let v = assess1(&workload(0.3, waiting(0.299), None));
    assert!(v.advice.contains("raise num_workers"), "{}", v.advice);
}

#[test]
fn a_busy_gpu_is_gpu_bound_and_a_busy_step_on_an_idling_gpu_is_host_bound() {
    let v = assess1(&workload(0.9, vec![proc(1, GPU, 0.9, 0.0, 0.0, 0.1)], None));
    assert_eq!(v.kind, VerdictKind::GpuBound);
    assert!(v.input_bound_share.unwrap() < 0.01);
    // GPU 58 % busy, loader idle, the GPU process busy on the host: the step itself, on the
    // host side (this read "GPU-bound" before, with the GPU idle 42 %). Without CUDA calls
    // traced, PCIe or GPM, its own CPU work: at least the 37 % beyond the GPU's busy time,
    // most of the idle 42 %. Its main thread waited 5 % of the window: that, not the idle
    // 42 %, is the input share.
    let v = assess1(&workload(
        0.58,
        vec![
            trainer(
                1,
                (0.95, 3.0),
                ThreadTimes {
                    on_cpu_seconds: 0.95,
                    sleep_seconds: 0.05,
                    ..Default::default()
                },
            ),
            proc(2, LOADER, 0.08, 0.0, 0.0, 2.9),
        ],
        None,
    ));
    assert_eq!(v.kind, VerdictKind::HostCpu);
    assert!(
        v.advice.contains("busy on the CPU with its own work (37%"),
        "{}",
        v.advice
    );
    assert!((v.host_bound_share.unwrap() - 0.37).abs() < 1e-9, "{v:?}");
    // ... and the loader, busy 8 % of the window, is saturated 8/60 of the way.
    let share = v.input_bound_share.unwrap();
    assert!((share - 0.05 * 0.08 / 0.6).abs() < 1e-9, "{share}");
}

#[test]
fn the_trainers_wait_is_a_share_of_its_traced_time() {
    // H200, I/O-bound phase: the main thread's sleep still in progress at the window's end
    // is not charged yet (9.64 s asleep of 9.82 s traced in a 12 s window); its wait share
    // is 0.98, the job's own data-wait 0.975.
    let w = workload(
        0.017,
        vec![
            trainer(
                1,
                (0.28, 50.0),
                ThreadTimes {
                    on_cpu_seconds: 0.18,
                    sleep_seconds: 9.64,
                    ..Default::default()
                },
            ),
            proc(2, LOADER, 0.07, 0.0, 5.9, 0.05),
            proc(3, LOADER, 0.07, 0.0, 5.9, 0.05),
        ],
        None,
    );
    let v = assess(&w, Some(12.0), host(&up()), None, &VerdictConfig::default()).unwrap();
    assert_eq!(v.kind, VerdictKind::InputBoundIo);
    assert!(
        (v.input_bound_share.unwrap() - 9.64 / 9.82).abs() < 1e-9,
        "{v:?}"
    );
}

fn alone_on(mut w: Workload, sm_activity: f64) -> Workload {
    w.gpu.per_gpu.push(WorkloadGpuShare {
        busy_fraction: w.gpu.busy_fraction,
        device_busy_fraction: w.gpu.busy_fraction,
        split: Some(SplitMethod::SoleHolder),
        sm_activity_percent: Some(sm_activity),
        ..WorkloadGpuShare::new(0, None)
    });
    w
}

/// A lone job, CUDA calls untraced: GPU busy 0.4, its loop on a CPU `on_cpu` of the window.
fn untraced_loop(on_cpu: f64) -> Workload {
    host_job(0.4, on_cpu, None)
}

#[test]
fn an_untraced_loops_cpu_work_is_the_cause_when_it_fills_half_the_gpus_idle_time() {
    // The GPU idles 0.6: the loop's busy time beyond the GPU's 0.4 must fill 0.3 of it.
    let v = assess1(&untraced_loop(0.701));
    assert_eq!(v.kind, VerdictKind::HostCpu, "{}", v.advice);
    assert!((v.host_bound_share.unwrap() - 0.301).abs() < 1e-9, "{v:?}");
    assert_eq!(kind_of(&untraced_loop(0.699)), VerdictKind::Unknown);
}

#[test]
fn an_untraced_loop_spinning_behind_other_jobs_kernels_is_not_host_bound() {
    // H100, three jobs on one GPU: one bursting matmuls half the time spun in
    // synchronisations 50 % of the window, its part 27 %, the device busy 49 % (others 22 %,
    // under its own: no contention). This read `host-bound: CPU`; nothing it did on the
    // CPU fell in the GPU's idle time.
    let mut w = host_job(0.27, 0.50, None);
    w.gpu.per_gpu.push(WorkloadGpuShare {
        busy_fraction: Some(0.27),
        device_busy_fraction: Some(0.49),
        split: Some(SplitMethod::HostCpuEstimate),
        ..WorkloadGpuShare::new(0, None)
    });
    let v = assess1(&w);
    assert_eq!(v.kind, VerdictKind::Unknown, "{}", v.advice);
    let h = v.host.unwrap();
    assert!((h.device_busy_fraction - 0.49).abs() < 1e-9);
    assert!(h.own_cpu_share < 0.02, "{h:?}");
}

#[test]
fn a_busy_gpu_whose_sms_idle_gets_its_own_verdict() {
    // H200: a single-thread spinning kernel, utilisation 99.5 %, SM activity 0.8 %.
    let busy = || vec![proc(1, GPU, 0.99, 0.0, 0.0, 0.01)];
    let v = assess1(&alone_on(workload(0.995, busy(), None), 0.8));
    assert_eq!(v.kind, VerdictKind::LowSmActivity);
    assert!(v.advice.contains("batch size"), "{}", v.advice);
    assert!((v.sm_activity_fraction.unwrap() - 0.008).abs() < 1e-9);
    // A large bf16 matmul: 96 % of the SMs while it runs.
    let v = assess1(&alone_on(workload(0.97, busy(), None), 96.0));
    assert_eq!(v.kind, VerdictKind::GpuBound);
}

#[test]
fn an_unknown_share_of_a_shared_gpu_is_an_unknown_verdict_with_the_reason() {
    let mut w = workload(0.5, vec![], None);
    w.gpu.busy_fraction = None;
    w.gpu.per_gpu.push(WorkloadGpuShare {
        split: Some(SplitMethod::Partial),
        device_busy_fraction: Some(0.7),
        ..WorkloadGpuShare::new(0, None)
    });
    let v = assess1(&w);
    assert_eq!(v.kind, VerdictKind::Unknown);
    assert!(v.advice.contains("shares its GPU"), "{}", v.advice);
    assert_eq!(v.input_bound_share, None);
}

#[test]
fn nothing_happening_is_idle_and_an_unexplained_gap_is_unknown() {
    let v = assess1(&workload(
        0.0,
        vec![proc(1, GPU, 0.01, 0.0, 0.0, 0.99)],
        None,
    ));
    assert_eq!(v.kind, VerdictKind::Idle);
    // GPU half idle, loader and GPU process both mostly asleep: waiting on something else.
    let v = assess1(&workload(
        0.5,
        vec![
            proc(1, GPU, 0.2, 0.0, 0.0, 0.8),
            proc(2, LOADER, 0.1, 0.0, 0.0, 0.9),
        ],
        None,
    ));
    assert_eq!(v.kind, VerdictKind::Unknown);
}

#[test]
fn without_ebpf_the_verdict_says_why() {
    let w = workload(0.4, vec![], None);
    let down = SourceState::down("stall tracing unavailable: missing CAP_BPF");
    let v = assess(&w, Some(1.0), host(&down), None, &VerdictConfig::default()).unwrap();
    assert_eq!(v.kind, VerdictKind::Unknown);
    assert!(v.advice.contains("missing CAP_BPF"));
    assert_eq!(v.input_bound_share, None);
}

#[test]
fn short_lived_helpers_waiting_on_pipes_do_not_dilute_the_loader() {
    // one reader blocked all window long; ten helpers that lived 0.1 s each, asleep
    let mut p = vec![
        proc(1, GPU, 0.05, 0.0, 0.0, 0.95),
        proc(2, LOADER, 0.01, 0.0, 0.98, 0.01),
    ];
    for pid in 10..20 {
        p.push(proc(pid, LOADER, 0.002, 0.0, 0.0, 0.1));
    }
    let v = assess1(&workload(0.1, p, None));
    assert!(v.loader.unwrap().busy_fraction > 0.9, "{:?}", v.loader);
    assert_eq!(v.kind, VerdictKind::InputBoundIo);
}

/// A training loop on a GPU `busy` of a 1-s window: its main thread on a CPU `on_cpu` of
/// the window, with these CUDA calls traced (its main thread's, launches all its own).
fn host_job(busy: f64, on_cpu: f64, calls: Option<CudaCalls>) -> Workload {
    let mut w = workload(
        busy,
        vec![trainer(
            1,
            (on_cpu, 1.0 - on_cpu),
            ThreadTimes {
                on_cpu_seconds: on_cpu,
                sleep_seconds: 1.0 - on_cpu,
                ..Default::default()
            },
        )],
        None,
    );
    w.cuda = calls.map(|c| CudaWindow {
        traced: true,
        total: c,
        processes: vec![CudaProcessCalls {
            pid: 1,
            calls: c,
            main_thread: c,
        }],
    });
    w
}

fn copies(seconds: f64) -> CudaCalls {
    CudaCalls {
        h2d: Transfer {
            between_seconds: 0.0,
            count: 10,
            bytes: 10 << 26,
            call_seconds: seconds,
            wait_seconds: 0.0,
        },
        ..Default::default()
    }
}

fn kind_of(w: &Workload) -> VerdictKind {
    assess1(w).kind
}

/// The GPU busy `busy`, its training loop asleep waiting for batches, and one loader
/// process on a CPU `cpu` and blocked `blocked` of a 1-s window.
fn loader_job(busy: f64, cpu: f64, blocked: f64, throttled: Option<f64>) -> Workload {
    let waiting = ThreadTimes {
        on_cpu_seconds: 0.02,
        sleep_seconds: 0.98,
        ..Default::default()
    };
    workload(
        busy,
        vec![
            trainer(1, (0.02, 0.98), waiting),
            proc(2, LOADER, cpu, 0.0, blocked, 1.0 - cpu - blocked),
        ],
        throttled,
    )
}

#[test]
fn the_loader_is_the_bottleneck_from_its_saturation_threshold() {
    // loader_saturated 0.6: busy 0.601 of the window is saturated, 0.599 is not.
    assert_eq!(
        kind_of(&loader_job(0.3, 0.601, 0.0, None)),
        VerdictKind::InputBoundCpu
    );
    assert_eq!(
        kind_of(&loader_job(0.3, 0.599, 0.0, None)),
        VerdictKind::Unknown
    );
}

#[test]
fn a_saturated_loader_is_io_bound_from_half_its_busy_time_blocked() {
    // io_share_min 0.5 of the loader's busy 0.9: blocked 0.451 is I/O, 0.449 CPU.
    assert_eq!(
        kind_of(&loader_job(0.3, 0.449, 0.451, None)),
        VerdictKind::InputBoundIo
    );
    assert_eq!(
        kind_of(&loader_job(0.3, 0.451, 0.449, None)),
        VerdictKind::InputBoundCpu
    );
}

#[test]
fn a_quota_that_holds_the_training_loop_is_named_first() {
    // A loop busy on the CPU (0.9 of the window, GPU busy 0.3) in a container throttled 0.4
    // of it: host-bound, the quota first in the advice, its limit named.
    let none = Some(CudaCalls::default());
    let mut w = host_job(0.3, 0.9, none);
    w.cpu = Some(CpuUsage {
        usage_seconds_total: 1.0,
        cores: Some(0.5),
        limit_cores: Some(0.5),
        cpuset_cpus: None,
        throttled_seconds_total: Some(0.4),
        throttled_fraction: Some(0.4),
        quota_periods: None,
    });
    let v = assess1(&w);
    assert_eq!(v.kind, VerdictKind::HostCpu);
    assert!(
        v.advice
            .starts_with("The container's CPU quota (0.5 CPUs) throttled it 40% of the window"),
        "{}",
        v.advice
    );
    assert!(!v.advice.contains("outside"), "{}", v.advice);
}

#[test]
fn nothing_running_is_idle_below_the_idle_busy_threshold() {
    // idle_busy_max 0.05, the loader and the loop doing nothing.
    assert_eq!(
        kind_of(&loader_job(0.049, 0.0, 0.0, None)),
        VerdictKind::Idle
    );
    assert_eq!(
        kind_of(&loader_job(0.05, 0.0, 0.0, None)),
        VerdictKind::Unknown
    );
}

#[test]
fn the_gpu_bound_threshold_is_the_idle_share() {
    // idle 0.24: GPU-bound whatever the host does; idle 0.26: the host side is looked at.
    let none = Some(CudaCalls::default());
    assert_eq!(kind_of(&host_job(0.76, 0.9, none)), VerdictKind::GpuBound);
    assert_eq!(kind_of(&host_job(0.74, 0.9, none)), VerdictKind::HostCpu);
}

#[test]
fn copies_are_the_cause_from_cause_min_when_they_explain_most_of_the_idle_time() {
    // GPU busy 0.3 (idle 0.7), the loop's own work 0.01: copies of 0.35 explain half of the
    // idle time (explained_min), 0.34 less.
    let job = |copy: f64| host_job(0.3, copy + 0.01, Some(copies(copy)));
    let v = assess1(&job(0.35));
    assert_eq!(v.kind, VerdictKind::HostTransfers);
    assert!((v.host_bound_share.unwrap() - 0.35).abs() < 1e-9);
    // (its own work, 0.01, is under cause_min: noise, not counted)
    assert!((v.idle_explained_fraction.unwrap() - 0.5).abs() < 1e-9);
    assert!(v.advice.contains("pageable"), "{}", v.advice);
    assert_eq!(kind_of(&job(0.349)), VerdictKind::Unknown);
    // cause_min 0.05: copies under it are noise, never named, however idle the GPU.
    assert_eq!(
        kind_of(&host_job(0.96, 0.05, Some(copies(0.049)))),
        VerdictKind::GpuBound
    );
    let v = assess1(&host_job(0.5, 0.05, Some(copies(0.049))));
    assert_eq!(v.kind, VerdictKind::Unknown, "{v:#?}");
    // The largest cause wins: copies 0.21 beside 0.69 of its own work is CPU.
    assert_eq!(
        kind_of(&host_job(0.3, 0.9, Some(copies(0.21)))),
        VerdictKind::HostCpu
    );
    // Pinned copies return at once; the wait after them is what held the loop.
    let mut pinned = copies(0.01);
    pinned.h2d.wait_seconds = 0.5;
    let v = assess1(&host_job(0.3, 0.6, Some(pinned)));
    assert_eq!(v.kind, VerdictKind::HostTransfers);
    assert!(v.advice.contains("do not overlap"), "{}", v.advice);
}

#[test]
fn a_wait_in_synchronise_beyond_the_gpus_busy_share_is_sync() {
    let sync = |seconds| CudaCalls {
        syncs: 100,
        sync_seconds: seconds,
        ..Default::default()
    };
    // GPU busy 0.1: a loop spinning in synchronise 0.9 of the window waited 0.8 while the GPU
    // had nothing to run.
    let v = assess1(&host_job(0.1, 0.9, Some(sync(0.9))));
    assert_eq!(v.kind, VerdictKind::HostSync);
    assert!((v.host_bound_share.unwrap() - 0.8).abs() < 1e-9);
    // sync_idle_min 0.05: on a GPU idle 0.3, own work of 0.1 explains a third of it; a wait
    // of 0.05 beyond the busy share makes half (explained_min), 0.049 is noise and does not.
    let own_and_sync =
        |idle_wait: f64| host_job(0.7, 0.1 + 0.7 + idle_wait, Some(sync(0.7 + idle_wait)));
    let v = assess1(&own_and_sync(0.05));
    assert_eq!(v.kind, VerdictKind::HostCpu, "{v:#?}");
    assert!((v.idle_explained_fraction.unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(kind_of(&own_and_sync(0.049)), VerdictKind::Unknown);
    // Waiting for its own GPU work (sync 0.5, busy 0.5) is not.
    let v = assess1(&host_job(0.5, 1.0, Some(sync(0.5))));
    assert_eq!(v.kind, VerdictKind::HostCpu, "{:?}", v.host);
}

#[test]
fn launches_are_the_cause_when_the_loops_cpu_per_kernel_is_a_few_microseconds() {
    let launches = |n| CudaCalls {
        launches: n,
        ..Default::default()
    };
    // The loop busy 0.6 of the window: 12,000 launches is 50 µs of its CPU each (the
    // threshold), 11,999 just over; the GPU ran each in 25 µs.
    let v = assess1(&host_job(0.3, 0.6, Some(launches(12_000))));
    assert_eq!(v.kind, VerdictKind::HostLaunches);
    assert!(v.advice.contains("CUDA graphs"), "{}", v.advice);
    let h = v.host.unwrap();
    assert!((h.host_us_per_launch.unwrap() - 50.0).abs() < 1e-9);
    assert!((h.gpu_us_per_launch.unwrap() - 25.0).abs() < 1e-9);
    assert_eq!(v.host_bound_share, Some(0.6));
    assert_eq!(
        kind_of(&host_job(0.3, 0.6, Some(launches(11_999)))),
        VerdictKind::HostCpu
    );
    // A kernel the GPU takes longer over than the loop's CPU per launch: not launch-bound.
    assert_eq!(
        kind_of(&host_job(0.3, 0.6, Some(launches(60_000)))),
        VerdictKind::HostLaunches
    );
    assert_eq!(
        kind_of(&host_job(0.7, 0.6, Some(launches(60_000)))),
        VerdictKind::HostCpu,
        "11.7 µs of GPU a kernel against 10 µs of CPU"
    );
}

#[test]
fn the_loops_own_work_is_the_cause_when_it_explains_half_the_idle_time() {
    let none = Some(CudaCalls::default());
    // GPU busy 0.3 (idle 0.7): own work of 0.35 explains half of it (explained_min); 0.349
    // less. Its share is the idle time it fills.
    let v = assess1(&host_job(0.3, 0.35, none));
    assert_eq!(v.kind, VerdictKind::HostCpu);
    assert!((v.host_bound_share.unwrap() - 0.35).abs() < 1e-9);
    assert_eq!(kind_of(&host_job(0.3, 0.349, none)), VerdictKind::Unknown);
    let v = assess1(&host_job(0.3, 0.9, none));
    assert!(
        (v.host_bound_share.unwrap() - 0.7).abs() < 1e-9,
        "at most the idle time"
    );
    // The unknown verdict says what was measured and how much of the idle time it explains.
    let v = assess1(&host_job(0.3, 0.2, none));
    assert!(v.advice.contains("explain only 29%"), "{}", v.advice);
    assert!(
        v.advice.contains("the training loop's own work 20%"),
        "{}",
        v.advice
    );
}

#[test]
fn without_cuda_calls_pcie_and_sm_activity_tell_the_cause() {
    let pcie = |bytes: f64| {
        let mut w = alone_on(host_job(0.3, 0.3, None), 50.0);
        w.gpu.per_gpu[0].pcie_bytes_per_second = Some(bytes);
        w
    };
    let v = assess1(&pcie(1.01e9));
    assert_eq!(v.kind, VerdictKind::HostTransfers);
    assert_eq!(v.host_bound_share, None);
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("CUDA driver calls not traced")),
        "{:?}",
        v.evidence
    );
    assert_eq!(kind_of(&pcie(0.99e9)), VerdictKind::Unknown);
    // Kernels that keep almost no SMs busy, launched by a busy loop: launches.
    assert_eq!(
        kind_of(&alone_on(host_job(0.3, 0.9, None), 29.0)),
        VerdictKind::HostLaunches
    );
    assert_eq!(
        kind_of(&alone_on(host_job(0.3, 0.9, None), 31.0)),
        VerdictKind::HostCpu
    );
}

#[test]
fn idle_needs_an_idle_gpu_loader_and_training_loop() {
    assert_eq!(kind_of(&host_job(0.04, 0.29, None)), VerdictKind::Idle);
    assert_eq!(kind_of(&host_job(0.06, 0.29, None)), VerdictKind::Unknown);
    // A loop busy on the CPU with the GPU idle (cuDNN autotuning under a quota read "idle")
    assert_eq!(kind_of(&host_job(0.0, 0.31, None)), VerdictKind::Unknown);
    assert_eq!(kind_of(&host_job(0.0, 0.97, None)), VerdictKind::HostCpu);
}

#[test]
fn the_loader_line_of_a_job_without_workers_names_only_its_blocked_time() {
    // num_workers=0, its main thread on a CPU 86 % and reading 10 %: no "on CPU 0%".
    let w = workload(0.1, vec![proc(1, GPU, 0.86, 0.0, 0.1, 0.04)], None);
    let v = assess1(&w);
    assert_eq!(v.kind, VerdictKind::HostCpu, "{:?}", v.loader);
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("reading their own data blocked the GPU processes 10%")),
        "{:?}",
        v.evidence
    );
    assert!(
        !v.evidence.iter().any(|e| e.contains("on CPU 0%")),
        "{:?}",
        v.evidence
    );
    assert!(
        v.evidence
            .iter()
            .any(|e| e.contains("on a CPU or waiting for one 86%")),
        "{:?}",
        v.evidence
    );
}

#[test]
fn a_loader_that_barely_runs_is_no_bottleneck_from_the_threshold() {
    // A worker busy all of its short life: saturated by its own share, but it used only
    // `cores` of a CPU in the window.
    let job = |busy: f64, cores: f64| {
        workload(
            busy,
            vec![
                proc(1, GPU, 0.005, 0.0, 0.0, 0.995),
                proc(2, LOADER, cores, 0.0, 0.0, 0.0),
            ],
            None,
        )
    };
    let v = assess1(&job(0.10, 0.01));
    assert_eq!(v.kind, VerdictKind::Unknown, "{v:#?}");
    assert_eq!(v.loader.unwrap().busy_fraction, 1.0);
    assert_eq!(assess1(&job(0.10, 0.049)).kind, VerdictKind::Unknown);
    assert_eq!(assess1(&job(0.10, 0.05)).kind, VerdictKind::InputBoundCpu);
    // On an idle GPU it is idle, not input-bound.
    assert_eq!(assess1(&job(0.01, 0.01)).kind, VerdictKind::Idle);
}

/// What the others did on its GPU: `own` its part, `others` theirs, split by host CPU.
fn shared(own: f64, others: f64) -> Contention {
    Contention {
        device_busy_fraction: own + others,
        own_fraction: own,
        others_fraction: others,
        others: vec![crate::model::OtherHolder {
            name: "eval-b".into(),
            gpu: 0,
            busy_fraction: Some(others),
        }],
        split: SplitMethod::HostCpuEstimate,
        idlest_gpu: Some(crate::model::IdleGpu {
            index: 1,
            busy_fraction: 0.03,
        }),
    }
}

fn judged(w: &Workload, c: Contention, ebpf: &SourceState) -> Verdict {
    assess(w, Some(1.0), host(ebpf), Some(c), &VerdictConfig::default()).unwrap()
}

/// The 10 % container of a three-way share: its loop spins in synchronisation behind the
/// others' kernels (on a CPU 60 % of the window, no loader).
fn spinning(own: f64) -> Workload {
    host_job(own, 0.6, None)
}

#[test]
fn others_busier_than_it_on_its_gpu_is_contention_from_the_threshold() {
    let v = judged(&spinning(0.10), shared(0.10, 0.84), &up());
    assert_eq!(v.kind, VerdictKind::Contention, "{v:#?}");
    assert!(
        v.evidence.iter().any(|e| e
            == "GPU 0 was busy 94% of the window: 84% eval-b, 10% this job's own (split by \
                the holders' host CPU time, an estimate)"),
        "{:?}",
        v.evidence
    );
    assert!(
        v.advice.starts_with(
            "Other workloads (eval-b) kept its GPU busy 84% of the window, more than its own 10%"
        ),
        "{}",
        v.advice
    );
    assert!(v.advice.contains("docker --gpus device=1"), "{}", v.advice);
    // Others must explain, with any other cause, half of its idle time: busy 0.2 of the
    // window while it idles 0.95, with the GPU idle for everyone 0.75, is not the cause.
    assert_eq!(
        judged(&spinning(0.05), shared(0.05, 0.20), &up()).kind,
        VerdictKind::Unknown
    );
    // contention_share_min (0.2): beside the loop's own work (traced, 0.21 of an idle 0.81),
    // others at 0.2 make half of the idle time explained; at 0.19 they do not count.
    let beside = |others| {
        let mut w = host_job(0.19, 0.21, Some(CudaCalls::default()));
        w.gpu.busy_fraction = Some(0.19);
        judged(&w, shared(0.19, others), &up())
    };
    assert_eq!(beside(0.2).kind, VerdictKind::HostCpu);
    assert!((beside(0.2).idle_explained_fraction.unwrap() - 0.41 / 0.81).abs() < 1e-9);
    assert_eq!(beside(0.19).kind, VerdictKind::Unknown);
    // More than its own: equal is not.
    assert_eq!(
        judged(&spinning(0.30), shared(0.30, 0.69), &up()).kind,
        VerdictKind::Contention
    );
    assert_ne!(
        judged(&spinning(0.49), shared(0.49, 0.49), &up()).kind,
        VerdictKind::Contention
    );
    // Busy enough itself, it is GPU-bound whoever else runs.
    assert_eq!(
        judged(&spinning(0.80), shared(0.80, 0.19), &up()).kind,
        VerdictKind::GpuBound
    );
}

#[test]
fn a_saturated_loader_or_an_idle_job_is_not_told_contention() {
    let loader = workload(
        0.1,
        vec![
            proc(1, GPU, 0.05, 0.0, 0.0, 0.95),
            proc(2, LOADER, 0.1, 0.0, 0.85, 0.05),
        ],
        None,
    );
    assert_eq!(
        judged(&loader, shared(0.1, 0.8), &up()).kind,
        VerdictKind::InputBoundIo
    );
    let idle = host_job(0.01, 0.02, None);
    assert_eq!(
        judged(&idle, shared(0.01, 0.9), &up()).kind,
        VerdictKind::Idle
    );
}

#[test]
fn a_traced_host_cause_larger_than_the_others_wins_and_sync_does_not() {
    // Copies take 60 % of the window, the others 30 %: the copies are its own to fix.
    let w = host_job(0.05, 0.7, Some(copies(0.6)));
    assert_eq!(
        judged(&w, shared(0.05, 0.30), &up()).kind,
        VerdictKind::HostTransfers
    );
    // The others take 70 %: more than its copies.
    assert_eq!(
        judged(&w, shared(0.05, 0.70), &up()).kind,
        VerdictKind::Contention
    );
}

#[test]
fn without_ebpf_contention_is_told_for_a_job_that_ran() {
    let down = SourceState::down("no CAP_BPF");
    assert_eq!(
        judged(&spinning(0.10), shared(0.10, 0.80), &down).kind,
        VerdictKind::Contention
    );
    // One that did not run on the GPU may just be idle: unknown, as before.
    assert_eq!(
        judged(&spinning(0.04), shared(0.04, 0.80), &down).kind,
        VerdictKind::Unknown
    );
}

#[test]
fn without_ebpf_the_pressure_tells_a_coarser_verdict_and_says_so() {
    let down = SourceState::down("no CAP_BPF");
    let judge = |busy: f64, cores: f64, pressure: Option<Pressure>| {
        let mut w = workload(busy, Vec::new(), None);
        w.stalls = None;
        w.pressure = pressure;
        if let Some(c) = &mut w.cpu {
            c.cores = Some(cores);
        }
        assess(&w, Some(1.0), host(&down), None, &VerdictConfig::default()).unwrap()
    };
    let p = |cpu: f64, io: f64| Pressure {
        cpu_some: cpu,
        io_some: io,
        io_full: io,
        memory_some: 0.0,
        memory_full: 0.0,
    };
    let v = judge(0.2, 0.3, Some(p(0.04, 0.56)));
    assert_eq!(
        (v.kind, v.basis),
        (VerdictKind::InputBoundIo, VerdictBasis::Pressure)
    );
    assert!(
        v.advice.contains("Told from pressure stall information"),
        "{}",
        v.advice
    );
    assert!(
        v.evidence
            .iter()
            .any(|e| e.starts_with("from the cgroup's pressure stall information (no CAP_BPF)")),
        "{:?}",
        v.evidence
    );
    assert_eq!(
        judge(0.2, 0.5, Some(p(0.57, 0.0))).kind,
        VerdictKind::InputBoundCpu
    );
    // A busy GPU is GPU-bound whatever the pressure.
    assert_eq!(
        judge(0.9, 0.5, Some(p(0.57, 0.0))).kind,
        VerdictKind::GpuBound
    );
    // No pressure to speak of: idle when the container barely ran, else unknown.
    assert_eq!(judge(0.01, 0.01, Some(p(0.0, 0.0))).kind, VerdictKind::Idle);
    assert_eq!(
        judge(0.2, 1.0, Some(p(0.05, 0.05))).kind,
        VerdictKind::Unknown
    );
    // No pressure files: the GPU side only, as before.
    let v = judge(0.2, 1.0, None);
    assert_eq!(
        (v.kind, v.basis),
        (VerdictKind::Unknown, VerdictBasis::GpuOnly)
    );
    assert_eq!(
        assess1(&workload(0.2, Vec::new(), None)).basis,
        VerdictBasis::StallTracing
    );
}

#[test]
fn no_gpu_process_no_verdict() {
    let mut w = workload(0.5, vec![], None);
    w.gpu.processes = 0;
    assert!(assess(&w, Some(1.0), host(&up()), None, &VerdictConfig::default()).is_none());
    let w = workload(0.5, vec![], None);
    assert!(
        assess(&w, None, host(&up()), None, &VerdictConfig::default()).is_none(),
        "first round"
    );
}

#[test]
fn two_gpu_processes_are_two_loops_each_read_on_its_own() {
    // Two identical loops in one container, each on a CPU 0.6 of the window, copying 0.2 and
    // launching 12,000 kernels: the container's shares are each loop's, and its work per
    // kernel is over its own kernels.
    let mut calls = copies(0.2);
    calls.launches = 12_000;
    let mut w = workload(
        0.3,
        (1..=2)
            .map(|pid| {
                trainer(
                    pid,
                    (0.6, 0.4),
                    ThreadTimes {
                        on_cpu_seconds: 0.6,
                        sleep_seconds: 0.4,
                        ..Default::default()
                    },
                )
            })
            .collect(),
        None,
    );
    w.gpu.processes = 2;
    let mut total = calls;
    total.add(&calls);
    w.cuda = Some(CudaWindow {
        traced: true,
        total,
        processes: (1..=2)
            .map(|pid| CudaProcessCalls {
                pid,
                calls,
                main_thread: calls,
            })
            .collect(),
    });
    let one = assess1(&host_job(0.3, 0.6, Some(calls)));
    let two = assess1(&w);
    let (h1, h2) = (one.host.unwrap(), two.host.unwrap());
    assert!((h2.copy_share.unwrap() - 0.2).abs() < 1e-9, "{h2:?}");
    assert!((h2.own_cpu_share - h1.own_cpu_share).abs() < 1e-9, "{h2:?}");
    assert!(
        (h2.host_us_per_launch.unwrap() - h1.host_us_per_launch.unwrap()).abs() < 1e-9,
        "{h1:?} {h2:?}"
    );
    assert!((h2.launches_per_second.unwrap() - 24_000.0).abs() < 1e-9);
    assert_eq!(two.kind, one.kind);
}
