//! Why a workload's GPU idles: the verdict, from one window of GPU-side and loader-side evidence.
//!
//! GPU side: the share of the window the workload kept its GPUs busy (the device's utilisation
//! series, divided between holders; see `busy_split`), and, from GPM, how much of the SMs its
//! kernels used while they ran. Loader side: the workload's other processes — PyTorch
//! DataLoader workers are child processes without a GPU context — and how much of their time
//! they were busy (on CPU, waiting for a CPU, or blocked in D state on I/O). When there are no
//! such processes (`num_workers=0`), the GPU processes' own D-state time is the loader evidence.
//!
//! The `input_bound_share` is the time the trainer waited for its next batch while the GPU
//! idled. The trainer waits on its main thread (a DataLoader's main process sleeps on its
//! workers' queue; without loader processes it reads itself, in D): that wait, as a share of
//! the main thread's traced time, at most the GPU's idle share. The main thread also sleeps
//! while the GPU computes (autograd's backward runs on other threads; on the H200 a GPU-bound
//! step's main thread slept 31–34 % of the time against 6 % of data wait), so the wait counts as
//! waiting for batches as far as the loader is saturated: in full once its busy share reaches
//! `loader_saturated`, in proportion below. A workload whose GPU idles at least `gpu_bound_idle_max` of
//! the time with a loader busy at least `loader_saturated` is input-bound: I/O when the loader
//! is mostly blocked in D state, CPU when it is mostly on a CPU or in the run queue, or held back
//! by a CPU quota. When the loader is not saturated, the host side of the step is looked at
//! (`host_side`): copies, kernel launches, synchronisation or the training loop's own CPU work,
//! each a verdict of its own. GPU-bound is said only of a GPU idle less than
//! `gpu_bound_idle_max`; one whose kernels keep few of the SMs busy gets its own verdict: the
//! GPU is "busy" doing little. Idle is said only when the GPU, the loader and the training loop
//! all do (almost) nothing.
use super::host_side;
use super::pressure;
use super::speedup;
use crate::model::{Contention, HostSide, LoaderSummary, Verdict, VerdictBasis, VerdictKind};
use crate::model::{ProcessRole, SourceState, Workload};
use serde::Deserialize;

/// Thresholds of the verdict (the config file's `verdict:` section). Defaults suit a 1 s window.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerdictConfig {
    /// GPU idle share below which the workload is GPU-bound.
    pub gpu_bound_idle_max: f64,
    /// GPU busy share below which a workload whose loader is not busy either is idle.
    pub idle_busy_max: f64,
    /// Loader busy share at or below which the loader counts as doing nothing.
    pub loader_idle: f64,
    /// Loader busy share from which the loader is the bottleneck.
    pub loader_saturated: f64,
    /// Host CPU share (on CPU or in the run queue) of the GPU processes from which the training
    /// step itself, not the loader, is what the GPU waits for.
    pub step_busy_min: f64,
    /// Share of the loader's busy time in D state from which the loader is I/O-bound.
    pub io_share_min: f64,
    /// The loader's busy time (on a CPU, waiting for one or blocked, all its processes) over
    /// the window, in CPUs, below which it barely runs: however saturated each of its
    /// processes is for its short life, it is no bottleneck (a process that used 0.01 of a
    /// CPU was told `input-bound: CPU`).
    pub loader_active_min: f64,
    /// Share of the window under CPU-quota throttling from which the quota is the cause.
    pub throttled_min: f64,
    /// SM activity while kernels run (GPM) below which a busy GPU is doing little: tiny
    /// kernels, a launch-bound step, a batch too small. A large bf16 matmul on an H200 keeps
    /// 96 % of the SMs busy while it runs; a single-thread kernel 0.8 %.
    pub sm_active_min: f64,
    /// Spread (points) between a distributed job's ranks above which one of them is named as
    /// the straggler the others wait for (the nvidia-smi article: the GPUs of a DDP job should
    /// move together within 5 %).
    pub straggler_spread_points: f64,
    /// Share of the window the training loop spends in copies between host and GPU (CUDA
    /// calls traced) from which they are the cause.
    pub copy_share_min: f64,
    /// Share of the window the training loop waits in synchronisations while the GPU has
    /// nothing to run from which that is the cause.
    pub sync_idle_min: f64,
    /// The training loop's own busy time per kernel launch (µs) up to which its CPU work is
    /// issuing kernels (launch-bound) rather than work of its own, when the GPU runs each
    /// kernel in less: eager PyTorch spent 7.5 µs a launch on an H100 host, a step with 25 ms
    /// of Python per 10 kernels 2,500.
    pub launch_host_max_us: f64,
    /// PCIe traffic (both directions, bytes/s) from which copies are the cause when the CUDA
    /// calls are not traced: a pageable-copy step moved 5.1 GB/s on the H100 host, a
    /// launch-bound loop 0.2.
    pub pcie_busy_bytes_per_second: f64,
    /// Without stall tracing, the share of the window the container's tasks waited for a CPU
    /// (`cpu.pressure` some, or the quota's throttled share if larger) from which that is the
    /// cause. In 4-s windows of the end-to-end containers: a loader spinning under a 0.5-CPU
    /// quota 0.57, a GPU-bound trainer 0.06.
    pub pressure_cpu_min: f64,
    /// ... waited for I/O (`io.pressure` some): a loader reading through a 1 MB/s blkio limit
    /// 0.56, the CPU-bound and GPU-bound containers ≤ 0.003.
    pub pressure_io_min: f64,
    /// ... waited for memory (`memory.pressure` some): a loop re-reading a 200 MB file under
    /// `--memory 48m` (a squeezed page cache, refilled cheaply) 0.07.
    pub pressure_memory_min: f64,
    /// Without stall tracing and with no pressure over its threshold, the CPUs the container's
    /// processes other than its GPU processes used from which a GPU idling beside them is
    /// input-bound: CPU. On an H100 host, a DataLoader with 4 workers on free cores 2.05 with
    /// the GPU idle 94 %; the same job GPU-bound 0.09.
    pub pressure_loader_cores_min: f64,
    /// Share of the window other workloads kept its GPU busy from which, when it is also more
    /// than its own share, their work is what its kernels wait for (contention).
    pub contention_share_min: f64,
}

impl Default for VerdictConfig {
    fn default() -> Self {
        Self {
            gpu_bound_idle_max: 0.25,
            idle_busy_max: 0.05,
            loader_idle: 0.3,
            loader_saturated: 0.6,
            loader_active_min: 0.05,
            step_busy_min: 0.5,
            io_share_min: 0.5,
            throttled_min: 0.1,
            sm_active_min: 0.3,
            straggler_spread_points: 5.0,
            copy_share_min: 0.2,
            sync_idle_min: 0.3,
            launch_host_max_us: 50.0,
            pcie_busy_bytes_per_second: 1e9,
            contention_share_min: 0.2,
            pressure_cpu_min: 0.3,
            pressure_io_min: 0.3,
            pressure_memory_min: 0.1,
            pressure_loader_cores_min: 0.5,
        }
    }
}

impl VerdictConfig {
    pub fn validate(&self) -> Result<(), crate::field_error::FieldError> {
        crate::field_error::check_shares(&[
            ("gpu_bound_idle_max", self.gpu_bound_idle_max),
            ("idle_busy_max", self.idle_busy_max),
            ("loader_idle", self.loader_idle),
            ("loader_saturated", self.loader_saturated),
            ("loader_active_min", self.loader_active_min),
            ("step_busy_min", self.step_busy_min),
            ("io_share_min", self.io_share_min),
            ("throttled_min", self.throttled_min),
            ("sm_active_min", self.sm_active_min),
            ("copy_share_min", self.copy_share_min),
            ("sync_idle_min", self.sync_idle_min),
            ("contention_share_min", self.contention_share_min),
            ("pressure_cpu_min", self.pressure_cpu_min),
            ("pressure_io_min", self.pressure_io_min),
            ("pressure_memory_min", self.pressure_memory_min),
        ])?;
        for (field, v) in [
            ("straggler_spread_points", self.straggler_spread_points),
            ("launch_host_max_us", self.launch_host_max_us),
            ("pressure_loader_cores_min", self.pressure_loader_cores_min),
            (
                "pcie_busy_bytes_per_second",
                self.pcie_busy_bytes_per_second,
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(crate::field_error::FieldError::new(
                    field,
                    format!("{v} is not a positive number"),
                ));
            }
        }
        Ok(())
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The loader summary of a workload's stall window, `None` without one.
fn loader_summary(w: &Workload, window: f64) -> Option<LoaderSummary> {
    let stalls = w.stalls.as_ref()?;
    let loaders: Vec<_> = stalls
        .processes
        .iter()
        .filter(|p| p.role == ProcessRole::Loader)
        .collect();
    let (procs, in_gpu_process): (Vec<_>, bool) = if loaders.is_empty() {
        (
            stalls
                .processes
                .iter()
                .filter(|p| p.role == ProcessRole::Gpu)
                .collect(),
            true,
        )
    } else {
        (loaders, false)
    };
    let (mut cpu, mut runq, mut blocked, mut weighted, mut n) = (0.0, 0.0, 0.0, 0.0, 0usize);
    for p in &procs {
        // In a GPU process only the blocked time is loader evidence: its CPU time is also
        // spent launching kernels and waiting on them.
        let (c, r, b) = if in_gpu_process {
            (0.0, 0.0, p.blocked_seconds)
        } else {
            (p.on_cpu_seconds, p.runq_seconds, p.blocked_seconds)
        };
        let busy = c + r + b;
        // Helpers that did nothing at all (a shell, a sleeping sidecar) are not the loader.
        if busy < 0.001 * window {
            continue;
        }
        // The process's own busy share: of the window, or of its life if it lived less (its
        // traced time, all threads, is below the window). Weighted by its busy time below, so
        // processes that mostly wait for others (a parent in wait(), a helper on a pipe) do not
        // dilute the workers that do the loading.
        // (A GPU process standing in counts its CPU time as traced, not as loader work: the
        // share is of its whole time, so a loop busy on the CPU does not read as a reader.)
        let traced = p.on_cpu_seconds + p.runq_seconds + p.blocked_seconds + p.sleep_seconds;
        let share = (busy / traced.min(window).max(busy)).min(1.0);
        cpu += c;
        runq += r;
        blocked += b;
        weighted += busy * share;
        n += 1;
    }
    let total = cpu + runq + blocked;
    Some(LoaderSummary {
        processes: n,
        in_gpu_process,
        busy_fraction: if total > 0.0 { weighted / total } else { 0.0 },
        busy_cores: total / window,
        on_cpu_share: if total > 0.0 { cpu / total } else { 0.0 },
        runq_share: if total > 0.0 { runq / total } else { 0.0 },
        blocked_share: if total > 0.0 { blocked / total } else { 0.0 },
    })
}

/// How long the GPU processes' main threads waited, as a share of their traced time (mean over
/// the GPU processes): interruptible sleep with loader processes (waiting on their queue), D
/// time without (reading themselves). Of the traced time, not of the window: an episode is
/// charged when the thread next switches out, so a long sleep still in progress at the end of
/// the window is missing from it (9.8 s traced of a 12 s window on the H200's I/O-bound phase).
/// A main thread that stayed in one state through the window has that state's time from the
/// sampler (its state at the window's end); one still without times never waited. `None`
/// without a stall window or GPU process in it.
fn trainer_wait(w: &Workload, in_gpu_process: bool) -> Option<f64> {
    let stalls = w.stalls.as_ref()?;
    let waits: Vec<f64> = stalls
        .processes
        .iter()
        .filter(|p| p.role == ProcessRole::Gpu)
        .map(|p| {
            p.main_thread.map_or(0.0, |m| {
                let traced =
                    m.on_cpu_seconds + m.runq_seconds + m.blocked_seconds + m.sleep_seconds;
                let wait = if in_gpu_process {
                    m.blocked_seconds
                } else {
                    m.sleep_seconds
                };
                if traced > 0.0 {
                    wait / traced
                } else {
                    0.0
                }
            })
        })
        .collect();
    (!waits.is_empty()).then(|| waits.iter().sum::<f64>() / waits.len() as f64)
}

/// The share of the window the trainer waited for batches: its wait, at most the GPU's idle
/// share, as far as the loader is saturated (see the module docs).
fn input_bound(idle: f64, wait: f64, loader: &LoaderSummary, config: &VerdictConfig) -> f64 {
    let saturation = if loader.in_gpu_process {
        1.0
    } else {
        (loader.busy_fraction / config.loader_saturated.max(f64::EPSILON)).min(1.0)
    };
    wait.min(idle) * saturation
}

/// SM activity while the workload's kernels ran, over the GPUs it held alone (mean).
fn sm_activity(w: &Workload) -> Option<f64> {
    let v: Vec<f64> = w
        .gpu
        .per_gpu
        .iter()
        .filter_map(|g| g.sm_activity_percent)
        .map(|p| p / 100.0)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The GPU-side evidence lines.
fn gpu_evidence(w: &Workload, busy: f64, sm: Option<f64>) -> Vec<String> {
    let mut evidence = vec![format!(
        "GPU busy {} of the window ({} idle)",
        pct(busy),
        pct(1.0 - busy)
    )];
    for g in &w.gpu.per_gpu {
        let (Some(b), Some(d), Some(split)) = (g.busy_fraction, g.device_busy_fraction, g.split)
        else {
            continue;
        };
        let how = if split.is_exact() {
            String::new()
        } else {
            format!(
                "; shared, its part {} from the {}",
                if split == crate::model::SplitMethod::HostCpuEstimate {
                    "estimated"
                } else {
                    "taken"
                },
                match split {
                    crate::model::SplitMethod::HostCpuEstimate => "holders' host CPU time",
                    _ => "driver's per-process figures",
                }
            )
        };
        evidence.push(format!(
            "GPU {}: the workload {}, the device {}{how}",
            g.index,
            pct(b),
            pct(d)
        ));
    }
    if let Some(s) = sm {
        evidence.push(format!(
            "while its kernels ran, {} of the SMs were busy (GPM)",
            pct(s)
        ));
    }
    evidence
}

/// The loader- and I/O-side evidence lines.
fn loader_evidence(
    w: &Workload,
    window: f64,
    loader: Option<&LoaderSummary>,
    wait: Option<f64>,
    throttled: Option<f64>,
) -> Vec<String> {
    let mut evidence = Vec::new();
    if let Some(t) = throttled.filter(|t| *t > 0.0) {
        evidence.push(format!(
            "CPU quota throttled the container {} of the window",
            pct(t)
        ));
    }
    if let Some(l) = loader {
        evidence.push(if l.in_gpu_process {
            // Only the GPU processes' blocked time is loader evidence (their CPU time is the
            // step's own): the training loop's line says what else they did.
            format!(
                "no loader processes (num_workers=0): reading their own data blocked the GPU \
                 processes {} of the window",
                pct(l.busy_fraction)
            )
        } else {
            format!(
                "{} loader process(es) busy {} of the window: on CPU {}, waiting for a CPU {}, \
                 blocked on I/O {} of that",
                l.processes,
                pct(l.busy_fraction),
                pct(l.on_cpu_share),
                pct(l.runq_share),
                pct(l.blocked_share)
            )
        });
    }
    if let Some(t) = wait {
        evidence.push(format!(
            "the training loop (the GPU processes' main threads) waited {} of the window",
            pct(t)
        ));
    }
    if let Some(r) = w.stalls.as_ref().map(|s| s.reads).filter(|r| r.count > 0) {
        evidence.push(format!(
            "{} reads, {:.1} MiB, p50 {} ms, p99 {} ms, {} slower than 10 ms",
            r.count,
            r.bytes as f64 / (1 << 20) as f64,
            fmt_ms(r.p50_latency_ms),
            fmt_ms(r.p99_latency_ms),
            r.slow_count
        ));
    }
    if let Some(d) = w.stalls.as_ref().map(|s| s.disk).filter(|d| d.count > 0) {
        evidence.push(format!(
            "{} disk requests, {:.1} MiB/s, p50 {} ms, p99 {} ms",
            d.count,
            d.bytes as f64 / (1 << 20) as f64 / window,
            fmt_ms(d.p50_latency_ms),
            fmt_ms(d.p99_latency_ms)
        ));
    }
    if let Some(why) = w.errors.get("disk") {
        evidence.push(format!("disk requests {why}"));
    }
    if w.stalls.as_ref().is_some_and(|s| !s.io_traced) {
        evidence.push(
            "reads and disk requests not traced in this window (they are attached while a GPU \
             idles under work); I/O is told from D-state time"
                .to_owned(),
        );
    }
    evidence
}

/// The PCIe traffic (both directions, bytes/s) of the GPUs the workload holds alone, `None`
/// where none was measured.
fn pcie(w: &Workload) -> Option<f64> {
    let v: Vec<f64> = w
        .gpu
        .per_gpu
        .iter()
        .filter_map(|g| g.pcie_bytes_per_second)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum())
}

/// The verdict for one workload, or `None` when it holds no GPU or the window is unknown.
/// The round's facts about the host a verdict reads besides the workload's own.
#[derive(Clone, Copy, Debug)]
pub struct HostFacts<'a> {
    /// The stall probes' state.
    pub ebpf: &'a SourceState,
    /// The host's online CPUs, for the advice.
    pub cpus: Option<u32>,
}

pub fn assess(
    w: &Workload,
    window: Option<f64>,
    host_facts: HostFacts<'_>,
    contention: Option<Contention>,
    config: &VerdictConfig,
) -> Option<Verdict> {
    let ebpf = host_facts.ebpf;
    if w.gpu.processes == 0 {
        return None;
    }
    let window = window.filter(|w| *w > 0.0)?;
    let Some(busy) = w.gpu.busy_fraction else {
        return Some(unknown_busy(w));
    };
    let idle = (1.0 - busy).max(0.0);
    let throttled = w.cpu.and_then(|c| c.throttled_fraction);
    let (loader, host) = if ebpf.up {
        (
            loader_summary(w, window),
            host_side::host_side(w, window, busy, pcie(w)),
        )
    } else {
        (None, None)
    };
    let wait = loader
        .as_ref()
        .and_then(|l| trainer_wait(w, l.in_gpu_process));
    let sm = sm_activity(w);
    let mut evidence = gpu_evidence(w, busy, sm);
    evidence.extend(loader_evidence(w, window, loader.as_ref(), wait, throttled));
    if let Some(h) = &host {
        evidence.extend(host_side::evidence(w, h, window));
    }
    evidence.extend(contention.as_ref().map(contention_evidence));
    if !ebpf.up {
        let why = ebpf
            .detail()
            .unwrap_or_else(|| "stall tracing unavailable".into());
        evidence.extend(w.pressure.map(|p| pressure::evidence(&p, &why)));
    }
    let facts = Facts {
        w,
        busy,
        idle,
        throttled,
        loader,
        host,
        sm,
        ebpf,
        contention: contention.as_ref(),
        cpu_times: pressure::cpu_times(w, window),
        cpus: host_facts.cpus,
        config,
    };
    let judged = facts.classify();
    let basis = match (ebpf.up, w.pressure) {
        (true, _) => VerdictBasis::StallTracing,
        (false, Some(_)) => VerdictBasis::Pressure,
        (false, None) => VerdictBasis::GpuOnly,
    };
    let mut v = Verdict {
        kind: judged.kind,
        basis,
        gpu_busy_fraction: busy,
        gpu_idle_fraction: idle,
        input_bound_share: wait
            .zip(loader.as_ref())
            .map(|(t, l)| input_bound(idle, t, l, config)),
        trainer_wait_fraction: wait,
        sm_activity_fraction: sm,
        loader,
        host,
        host_bound_share: judged.host_share,
        cpu_throttled_fraction: throttled,
        contention,
        speedup: None,
        evidence,
        advice: judged.advice,
    };
    v.speedup = speedup::speedup(&v, config.gpu_bound_idle_max);
    if let Some(s) = &v.speedup {
        v.advice.push(' ');
        v.advice.push_str(&speedup::describe(s));
    }
    Some(v)
}

/// A workload whose GPU busy share is unknown (a shared GPU the driver did not divide).
fn unknown_busy(w: &Workload) -> Verdict {
    let why = w
        .gpu
        .per_gpu
        .iter()
        .find_map(|g| g.split.filter(|s| !s.is_exact()))
        .map_or("no source measured the GPU's busy time", |_| {
            "it shares its GPU, and neither the driver's per-process figures nor host CPU time \
             could say how much of the GPU's busy time is its own"
        });
    Verdict {
        kind: VerdictKind::Unknown,
        basis: VerdictBasis::GpuOnly,
        gpu_busy_fraction: f64::NAN,
        gpu_idle_fraction: f64::NAN,
        input_bound_share: None,
        trainer_wait_fraction: None,
        sm_activity_fraction: None,
        loader: None,
        host: None,
        host_bound_share: None,
        cpu_throttled_fraction: w.cpu.and_then(|c| c.throttled_fraction),
        contention: None,
        speedup: None,
        evidence: vec![format!("GPU busy share unknown: {why}")],
        advice: format!("The GPU busy share of this workload is unknown: {why}."),
    }
}

/// What the classification looks at.
struct Facts<'a> {
    w: &'a Workload,
    busy: f64,
    idle: f64,
    throttled: Option<f64>,
    loader: Option<LoaderSummary>,
    host: Option<HostSide>,
    sm: Option<f64>,
    ebpf: &'a SourceState,
    contention: Option<&'a Contention>,
    /// The GPU processes' CPU time against the rest of the container's (used without stall
    /// tracing).
    cpu_times: Option<pressure::CpuTimes>,
    /// The host's online CPUs.
    cpus: Option<u32>,
    config: &'a VerdictConfig,
}

/// " (this host has N cores)" where the count is known, for the advice.
pub(crate) fn host_cores(cpus: Option<u32>) -> String {
    cpus.map_or_else(String::new, |n| format!(" (this host has {n} cores)"))
}

/// A classification: the kind, the advice, and for a host-side kind its cause's share.
struct Judged {
    kind: VerdictKind,
    advice: String,
    host_share: Option<f64>,
}

impl Judged {
    fn new(kind: VerdictKind, advice: String) -> Self {
        Self {
            kind,
            advice,
            host_share: None,
        }
    }
}

impl Facts<'_> {
    fn classify(&self) -> Judged {
        let (busy, idle, config) = (self.busy, self.idle, self.config);
        if idle < config.gpu_bound_idle_max {
            return match self.sm.filter(|s| *s < config.sm_active_min) {
                Some(s) => Judged::new(
                    VerdictKind::LowSmActivity,
                    format!(
                        "The GPU is busy {} of the time, but while its kernels run only {} of the SMs work: each kernel is too small to fill the GPU (tiny kernels, a launch-bound step, or a batch too small). Raise the batch size, fuse small operations (torch.compile), or capture the step in CUDA graphs; a faster data loader will not help.",
                        pct(busy),
                        pct(s)
                    ),
                ),
                None => Judged::new(
                    VerdictKind::GpuBound,
                    format!(
                        "The GPU is the bottleneck (busy {}): the loader keeps up. Larger batches, mixed precision (AMP) or a lighter model are the levers; more loader workers will not help.",
                        pct(busy)
                    ),
                ),
            };
        }
        if let Some(c) = self.contended().filter(|_| !self.ebpf.up) {
            // Without stall tracing its loop is unseen, but it ran on the GPU and others ran
            // more: that much is measured.
            if busy >= config.idle_busy_max {
                return Judged::new(VerdictKind::Contention, contention_advice(c));
            }
        }
        if !self.ebpf.up {
            return self.without_tracing();
        }
        let throttled_hard = self.throttled.is_some_and(|t| t >= config.throttled_min);
        let loader_idle = self.loader.as_ref().is_none_or(|l| {
            l.busy_fraction <= config.loader_idle || l.busy_cores < config.loader_active_min
        });
        let trainer_idle = self
            .host
            .as_ref()
            .is_none_or(|h| h.trainer_busy_fraction <= config.loader_idle);
        if busy < config.idle_busy_max && loader_idle && trainer_idle && !throttled_hard {
            return Judged::new(
                VerdictKind::Idle,
                format!(
                    "No GPU work, no loader work and a training loop that does nothing in the window, while {:.1} GiB of GPU memory is held. If the job is finished or stuck, stop it to free the GPU.",
                    self.w.gpu.memory_bytes as f64 / (1u64 << 30) as f64
                ),
            );
        }
        self.input_or_host(throttled_hard, loader_idle)
    }

    /// A GPU that idles: the loader, the quota, or the host side of the step.
    fn input_or_host(&self, throttled_hard: bool, loader_idle: bool) -> Judged {
        let (idle, config) = (self.idle, self.config);
        let cores = host_cores(self.cpus);
        let saturated = |l: &LoaderSummary| {
            l.busy_fraction >= config.loader_saturated && l.busy_cores >= config.loader_active_min
        };
        let host_busy = self
            .host
            .as_ref()
            .is_some_and(|h| h.trainer_busy_fraction >= config.step_busy_min);
        match &self.loader {
            // The quota holds back a loader that works; a busy training loop with an idle loader
            // is the host side's, with the quota named in its advice.
            Some(_) if throttled_hard && !(loader_idle && host_busy) => Judged::new(
                VerdictKind::InputBoundCpu,
                format!(
                    "The container's CPU quota ({}) throttles it {} of the time while the GPU idles {}: raise the quota (docker --cpus) or use fewer, cheaper augmentations.",
                    self.w.cpu.and_then(|c| c.limit_cores).map_or("set".to_owned(), |c| format!("{c:.1} cores")),
                    pct(self.throttled.unwrap_or(0.0)),
                    pct(idle)
                ),
            ),
            Some(l) if saturated(l) && l.blocked_share >= config.io_share_min => Judged::new(
                VerdictKind::InputBoundIo,
                format!(
                    "The data loader waits on storage ({} of its busy time blocked on I/O) while the GPU idles {}: cache the dataset in RAM or on local NVMe, pack small files into larger shards, or raise num_workers to keep more reads in flight.",
                    pct(l.blocked_share),
                    pct(idle)
                ),
            ),
            Some(l) if saturated(l) => Judged::new(
                VerdictKind::InputBoundCpu,
                format!(
                    "The data loader is CPU-bound (on CPU {}, waiting for a CPU {} of its busy time) while the GPU idles {}: raise num_workers{cores}, lower imgsz, or move augmentation to the GPU.",
                    pct(l.on_cpu_share),
                    pct(l.runq_share),
                    pct(idle)
                ),
            ),
            _ => self.host_side_or_contention(throttled_hard),
        }
    }

    /// Without stall tracing: the cgroup's pressure stall information, when there is some.
    fn without_tracing(&self) -> Judged {
        let (idle, config) = (self.idle, self.config);
        let why = self
            .ebpf
            .detail()
            .unwrap_or_else(|| "stall tracing unavailable".into());
        let why = why.as_str();
        let Some(p) = self.w.pressure else {
            return Judged::new(
                VerdictKind::Unknown,
                format!(
                    "The GPU idles {} of the time; {why}. Without it the loader cannot be examined.",
                    pct(idle)
                ),
            );
        };
        if let Some((kind, share)) = pressure::cause(&p, self.throttled, config) {
            return Judged::new(kind, pressure::advice(kind, share, self.w, idle));
        }
        let device_busy = host_side::device_busy(self.w, self.busy);
        if let Some((kind, figure)) = self
            .cpu_times
            .and_then(|t| pressure::cpu_cause(&t, device_busy, config))
        {
            return Judged {
                kind,
                advice: pressure::cpu_advice(kind, figure, idle, self.cpus),
                host_share: (kind == VerdictKind::HostCpu).then_some(figure),
            };
        }
        let cores = self.w.cpu.and_then(|c| c.cores);
        if self.busy < config.idle_busy_max && cores.is_some_and(|c| c < config.loader_active_min) {
            return Judged::new(
                VerdictKind::Idle,
                format!(
                    "No GPU work, and the container used {:.2} of a CPU in the window (told without stall tracing: {why}). If the job is finished or stuck, stop it to free the GPU.",
                    cores.unwrap_or(0.0)
                ),
            );
        }
        Judged::new(
            VerdictKind::Unknown,
            format!(
                "The GPU idles {} of the time and the container's tasks waited for no CPU, I/O or memory to speak of; {why}, and without it a loader busy on free cores or the training loop's own work cannot be told apart.",
                pct(idle)
            ),
        )
    }

    /// The contention when it is large enough to be the cause: other workloads kept its GPU
    /// busy at least `contention_share_min` of the window, and more than its own work did.
    fn contended(&self) -> Option<&Contention> {
        self.contention.filter(|c| {
            c.others_fraction >= self.config.contention_share_min
                && c.others_fraction > c.own_fraction
        })
    }

    /// Other workloads' work, unless the training loop's own host side (copies, launches, its
    /// CPU work, told from the CUDA calls) took more of the window than theirs: a loop waiting
    /// in synchronisation behind their kernels is contention's.
    fn host_side_or_contention(&self, throttled_hard: bool) -> Judged {
        let Some(c) = self.contended() else {
            return self.host_side(throttled_hard);
        };
        let host_cause = self
            .host
            .as_ref()
            .filter(|h| h.cuda_traced)
            .and_then(|h| host_side::cause(h, self.busy, self.sm, self.config));
        match host_cause {
            Some((kind, Some(share)))
                if kind != VerdictKind::HostSync && share > c.others_fraction =>
            {
                self.host_side(throttled_hard)
            }
            _ => Judged::new(VerdictKind::Contention, contention_advice(c)),
        }
    }

    /// The host side of the step, or unknown when no cause reaches its threshold.
    fn host_side(&self, throttled_hard: bool) -> Judged {
        let (idle, config) = (self.idle, self.config);
        let cause = self
            .host
            .as_ref()
            .and_then(|h| Some((h, host_side::cause(h, self.busy, self.sm, config)?)));
        let Some((h, (kind, share))) = cause else {
            return Judged::new(
                VerdictKind::Unknown,
                format!(
                    "The GPU idles {} of the time, but neither the loader nor the training loop is busy enough to be the cause: the job may wait on something outside the container (a network file system, another job, a lock), or its work comes in bursts shorter than the window.",
                    pct(idle)
                ),
            );
        };
        let quota = throttled_hard.then(|| {
            (
                self.throttled.unwrap_or(0.0),
                self.w.cpu.and_then(|c| c.limit_cores),
            )
        });
        Judged {
            kind,
            advice: host_side::advice(kind, self.w, h, idle, quota),
            host_share: share,
        }
    }
}

/// "GPU 0 was busy 94% of the window: 43% train-a, 26% eval-b, 10% this job's own (host CPU
/// estimate)".
fn contention_evidence(c: &Contention) -> String {
    let gpus: std::collections::BTreeSet<u32> = c.others.iter().map(|o| o.gpu).collect();
    let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
    let others: Vec<String> = c
        .others
        .iter()
        .map(|o| match o.busy_fraction {
            Some(b) => format!("{} {}", pct(b), o.name),
            None => format!("{} (its part unknown)", o.name),
        })
        .collect();
    format!(
        "GPU {} was busy {} of the window: {}, {} this job's own ({})",
        gpus.join(", "),
        pct(c.device_busy_fraction),
        others.join(", "),
        pct(c.own_fraction),
        c.split.describe()
    )
}

fn contention_advice(c: &Contention) -> String {
    let move_to = match c.idlest_gpu {
        Some(g) => format!(
            "run it on a GPU of its own (GPU {} was busy {}: docker --gpus device={})",
            g.index,
            pct(g.busy_fraction),
            g.index
        ),
        None => "run it on a GPU of its own".to_owned(),
    };
    let names: Vec<&str> = c.others.iter().map(|o| o.name.as_str()).take(3).collect();
    format!(
        "Other workloads ({}) kept its GPU busy {} of the window, more than its own {}: its \
         kernels wait their turn while the driver time-slices between processes. A faster \
         loader or larger batch will not help: {move_to}, give each job a fixed share with MIG \
         or MPS, or schedule the jobs so they do not overlap.",
        names.join(", "),
        pct(c.others_fraction),
        pct(c.own_fraction)
    )
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
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
    use crate::model::{WorkloadId, WorkloadKind};
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
        let loader = vec![
            proc(1, GPU, 0.05, 0.0, 0.0, 0.95),
            proc(2, LOADER, 0.6, 0.35, 0.0, 0.05),
        ];
        let v = assess1(&workload(0.3, loader.clone(), None));
        assert_eq!(v.kind, VerdictKind::InputBoundCpu);
        assert!(v.advice.contains("num_workers"));
        let v = assess1(&workload(0.3, loader, Some(0.4)));
        assert_eq!(v.kind, VerdictKind::InputBoundCpu);
        assert!(v.advice.contains("quota"), "{}", v.advice);
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
    fn a_quota_is_the_cause_from_its_throttling_threshold() {
        // throttled_min 0.1, with a loader at work but not saturated (0.4 of the window).
        let v = assess1(&loader_job(0.3, 0.4, 0.0, Some(0.1)));
        assert_eq!(v.kind, VerdictKind::InputBoundCpu);
        assert!(v.advice.contains("CPU quota"), "{}", v.advice);
        assert_eq!(
            kind_of(&loader_job(0.3, 0.4, 0.0, Some(0.099))),
            VerdictKind::Unknown
        );
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
    fn copies_are_the_cause_from_their_threshold() {
        // The loop busy 0.6 of the window: copies 0.21 (its own CPU 0.39, under 0.5) are the
        // cause; at 0.19 no cause reaches its threshold.
        let v = assess1(&host_job(0.3, 0.6, Some(copies(0.21))));
        assert_eq!(v.kind, VerdictKind::HostTransfers);
        assert!((v.host_bound_share.unwrap() - 0.21).abs() < 1e-9);
        assert!(v.advice.contains("pageable"), "{}", v.advice);
        assert_eq!(
            kind_of(&host_job(0.3, 0.6, Some(copies(0.19)))),
            VerdictKind::Unknown
        );
        // The largest cause wins: copies 0.21 beside 0.69 of its own CPU work is CPU.
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
        // GPU busy 0.1: a loop spinning in synchronise 0.41 of the window waited 0.31 while the
        // GPU had nothing to run; 0.39 is 0.29.
        let v = assess1(&host_job(0.1, 0.41, Some(sync(0.41))));
        assert_eq!(v.kind, VerdictKind::HostSync);
        assert!((v.host_bound_share.unwrap() - 0.31).abs() < 1e-9);
        assert_eq!(
            kind_of(&host_job(0.1, 0.39, Some(sync(0.39)))),
            VerdictKind::Unknown
        );
        // Waiting for its own GPU work (sync 0.5, busy 0.5 on a 0.74-busy... idle GPU) is not.
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
    fn the_loops_own_cpu_work_is_the_cause_from_its_threshold() {
        let none = Some(CudaCalls::default());
        assert_eq!(kind_of(&host_job(0.3, 0.51, none)), VerdictKind::HostCpu);
        assert_eq!(kind_of(&host_job(0.3, 0.49, none)), VerdictKind::Unknown);
        // A quota that throttles a busy loop while the loader idles is named in its advice.
        let mut w = host_job(0.3, 0.9, none);
        w.cpu = Some(CpuUsage {
            usage_seconds_total: 1.0,
            cores: Some(1.0),
            limit_cores: Some(1.5),
            cpuset_cpus: None,
            throttled_seconds_total: Some(0.4),
            throttled_fraction: Some(0.4),
            quota_periods: None,
        });
        let v = assess1(&w);
        assert_eq!(v.kind, VerdictKind::HostCpu);
        assert!(
            v.advice.contains("quota (1.5 cores) throttles it 40%"),
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
        assert!(v.advice.starts_with("Other workloads (eval-b) kept its GPU busy 84% of the window, more than its own 10%"), "{}", v.advice);
        assert!(v.advice.contains("docker --gpus device=1"), "{}", v.advice);
        // contention_share_min (0.2): at it, and just under.
        assert_eq!(
            judged(&spinning(0.05), shared(0.05, 0.20), &up()).kind,
            VerdictKind::Contention
        );
        assert_ne!(
            judged(&spinning(0.05), shared(0.05, 0.19), &up()).kind,
            VerdictKind::Contention
        );
        // More than its own: equal is not.
        assert_eq!(
            judged(&spinning(0.30), shared(0.30, 0.31), &up()).kind,
            VerdictKind::Contention
        );
        assert_ne!(
            judged(&spinning(0.30), shared(0.30, 0.30), &up()).kind,
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
            v.evidence.iter().any(|e| e.starts_with("from the cgroup's pressure stall information (no CAP_BPF)")),
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
}
