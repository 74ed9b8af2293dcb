//! Why a workload's GPU idles: the verdict, from one window of GPU-side and host-side evidence.
//!
//! GPU side (`gpu_time`): the share of the window the workload's kernels kept its GPUs busy
//! (NVML's utilisation counts copies as busy; GPM's engine activity does not), and how much of
//! the SMs they used. Host side: the data loader (`loader`: the workload's processes without a
//! GPU context, and the training loop's wait for their batches), and the training loop itself
//! (`training_loop`: every thread of the GPU processes, their copies, synchronisations and own
//! work, from the stall probes and the CUDA driver probes).
//!
//! A verdict names what explains the GPU's idle time. Each cause's time in the window (the
//! loop's wait for batches, its copies, its synchronisations while the GPU had nothing to run,
//! its own work, other workloads' kernels on the GPU) is set against the kernels' idle time in
//! the same window; the one that explains most of it is the verdict, with the quota named where
//! it held the work back. `unknown` only when the causes measured together explain less than
//! `explained_min` of the idle time, and it says how much they explain. GPU-bound is said of a
//! GPU whose kernels idle less than `gpu_bound_idle_max`; one whose kernels keep few of the SMs
//! busy gets its own verdict. Idle only when the GPU, the loader and every thread of the
//! training loop do (almost) nothing and no quota held them.
mod advice;
mod config;
mod evidence;
mod gpu_time;
mod loader;
pub mod pressure;
pub mod speedup;
mod training_loop;
mod words;

pub use advice::Cpus;
pub use config::VerdictConfig;

use crate::model::{Contention, HostSide, LoaderSummary, Verdict, VerdictBasis, VerdictKind};
use crate::model::{SourceState, Workload};
use gpu_time::KernelBusy;
use training_loop::{HostCause, LoopContext};
use words::pct;

/// The round's facts about the host a verdict reads besides the workload's own.
#[derive(Clone, Copy, Debug)]
pub struct HostFacts<'a> {
    /// The stall probes' state.
    pub ebpf: &'a SourceState,
    /// The host's online CPUs, for the advice.
    pub cpus: Option<u32>,
}

/// The verdict for one workload, or `None` when it holds no GPU or the window is unknown.
pub fn assess(
    w: &Workload,
    window: Option<f64>,
    host_facts: HostFacts<'_>,
    contention: Option<Contention>,
    config: &VerdictConfig,
) -> Option<Verdict> {
    if w.gpu.processes == 0 {
        return None;
    }
    let window = window.filter(|w| *w > 0.0)?;
    let Some(busy) = w.gpu.busy_fraction else {
        return Some(unknown_busy(w));
    };
    let facts = Facts::measure(w, window, busy, host_facts, contention, config);
    let mut evidence = evidence::gpu(w, busy, facts.kernel, facts.sm);
    evidence.extend(evidence::loader(
        w,
        window,
        facts.loader.as_ref(),
        facts.wait,
        facts.throttled,
    ));
    if let Some(h) = &facts.host {
        evidence.extend(evidence::training_loop(w, h, window));
    }
    evidence.extend(facts.contention.as_ref().map(evidence::contention));
    if !facts.ebpf.up {
        let why = facts
            .ebpf
            .detail()
            .unwrap_or_else(|| "stall tracing unavailable".into());
        evidence.extend(w.pressure.map(|p| pressure::evidence(&p, &why)));
    }
    let judged = facts.classify();
    let basis = match (facts.ebpf.up, w.pressure) {
        (true, _) => VerdictBasis::StallTracing,
        (false, Some(_)) => VerdictBasis::Pressure,
        (false, None) => VerdictBasis::GpuOnly,
    };
    let mut v = Verdict {
        kind: judged.kind,
        basis,
        gpu_busy_fraction: busy,
        gpu_idle_fraction: (1.0 - busy).max(0.0),
        input_bound_share: facts.input,
        trainer_wait_fraction: facts.wait,
        sm_activity_fraction: facts.sm,
        loader: facts.loader,
        host: facts.host,
        host_bound_share: judged.host_share,
        idle_explained_fraction: judged.explained,
        cpu_throttled_fraction: facts.throttled,
        contention: facts.contention,
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
        idle_explained_fraction: None,
        cpu_throttled_fraction: w.cpu.and_then(|c| c.throttled_fraction),
        contention: None,
        speedup: None,
        evidence: vec![format!("GPU busy share unknown: {why}")],
        advice: format!("The GPU busy share of this workload is unknown: {why}."),
    }
}

/// What the classification looks at: the window's measurements, read once.
struct Facts<'a> {
    w: &'a Workload,
    window: f64,
    busy: f64,
    /// The kernels' busy share, and how it was found.
    kernel: (f64, KernelBusy),
    /// The kernels' idle share: the time the causes must explain.
    idle: f64,
    throttled: Option<f64>,
    loader: Option<LoaderSummary>,
    /// The training loop's wait (of its main thread's traced time), and the share of the
    /// window it waited for batches.
    wait: Option<f64>,
    input: Option<f64>,
    host: Option<HostSide>,
    sm: Option<f64>,
    ebpf: &'a SourceState,
    contention: Option<Contention>,
    cpus: Cpus,
    config: &'a VerdictConfig,
}

/// A classification: the kind, the advice, for a host-side kind its cause's share, and how
/// much of the idle time the causes explain.
struct Judged {
    kind: VerdictKind,
    advice: String,
    host_share: Option<f64>,
    explained: Option<f64>,
}

impl Judged {
    fn new(kind: VerdictKind, advice: String) -> Self {
        Self {
            kind,
            advice,
            host_share: None,
            explained: None,
        }
    }
}

/// A candidate cause of the idle time: its kind, the share of the window it took, how much of
/// the idle time it explains, and for a host-side one its share.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    kind: VerdictKind,
    explains: f64,
    host_share: Option<f64>,
}

impl<'a> Facts<'a> {
    fn measure(
        w: &'a Workload,
        window: f64,
        busy: f64,
        host_facts: HostFacts<'a>,
        contention: Option<Contention>,
        config: &'a VerdictConfig,
    ) -> Self {
        let ebpf = host_facts.ebpf;
        let throttled = w.cpu.and_then(|c| c.throttled_fraction);
        let loader = ebpf.up.then(|| loader::loader_summary(w, window)).flatten();
        let wait = loader
            .as_ref()
            .and_then(|l| loader::trainer_wait(w, l.in_gpu_process));
        let input = wait
            .zip(loader.as_ref())
            .map(|(t, l)| loader::input_bound((1.0 - busy).max(0.0), t, l, config));
        let device_busy = contention
            .as_ref()
            .map_or(0.0, |c| c.device_busy_fraction)
            .max(gpu_time::device_busy(w, busy));
        let pcie = gpu_time::pcie(w);
        let context = |kernel_busy| LoopContext {
            window,
            kernel_busy,
            device_busy,
            loader_wait: input.unwrap_or(0.0),
        };
        // The copies (traced) say how much of the busy share was copying where GPM cannot.
        let copy = ebpf
            .up
            .then(|| training_loop::host_side(w, &context(busy), pcie))
            .flatten()
            .and_then(|h| h.copy_share);
        let kernel = gpu_time::kernel_busy(w, busy, copy, config);
        let host = ebpf
            .up
            .then(|| training_loop::host_side(w, &context(kernel.0), pcie))
            .flatten();
        Self {
            w,
            window,
            busy,
            kernel,
            idle: (1.0 - kernel.0).max(0.0),
            throttled,
            loader,
            wait,
            input: input.map(|i| i.min((1.0 - kernel.0).max(0.0))),
            host,
            sm: gpu_time::sm_activity(w),
            ebpf,
            contention,
            cpus: Cpus::of(w, host_facts.cpus),
            config,
        }
    }

    fn classify(&self) -> Judged {
        let config = self.config;
        if self.idle < config.gpu_bound_idle_max {
            return match self.sm.filter(|s| *s < config.sm_active_min) {
                Some(s) => Judged::new(
                    VerdictKind::LowSmActivity,
                    advice::low_sm_activity(self.busy, s),
                ),
                None => Judged::new(VerdictKind::GpuBound, advice::gpu_bound(self.busy)),
            };
        }
        if !self.ebpf.up {
            return self.without_tracing();
        }
        if self.idle_everywhere() {
            return Judged::new(VerdictKind::Idle, advice::idle(self.w));
        }
        self.explained()
    }

    /// The GPU, the loader and every thread of the training loop (almost) still, and no quota
    /// holding them back: a process starting up or warming up is busy or throttled, not idle.
    fn idle_everywhere(&self) -> bool {
        let config = self.config;
        let loader_idle = self.loader.as_ref().is_none_or(|l| {
            l.busy_fraction <= config.loader_idle || l.busy_cores < config.loader_active_min
        });
        let loop_idle = self.host.as_ref().is_none_or(|h| {
            h.main_thread_busy_fraction + h.other_threads_cores <= config.loader_idle
        });
        let throttled = self.throttled.is_some_and(|t| t >= config.throttled_min);
        self.busy < config.idle_busy_max && loader_idle && loop_idle && !throttled
    }

    /// The contention when it is large enough to be a cause: other workloads kept its GPU
    /// busy at least `contention_share_min` of the window, and more than its own work did.
    fn contended(&self) -> Option<&Contention> {
        self.contention.as_ref().filter(|c| {
            c.others_fraction >= self.config.contention_share_min
                && c.others_fraction > c.own_fraction
        })
    }

    /// The candidates: the loader's batches, the training loop's host-side causes, others'
    /// kernels (a loop waiting in synchronisation behind them is theirs, not sync's).
    fn candidates(&self) -> Vec<Candidate> {
        let config = self.config;
        let explains = |t: f64| (t / self.idle).min(1.0);
        let mut out = Vec::new();
        if let (Some(l), Some(input)) = (&self.loader, self.input) {
            let saturated = l.in_gpu_process
                || (l.busy_fraction >= config.loader_saturated
                    && l.busy_cores >= config.loader_active_min);
            if saturated && input > 0.0 {
                let io = l.blocked_share >= config.io_share_min;
                out.push(Candidate {
                    kind: if io {
                        VerdictKind::InputBoundIo
                    } else {
                        VerdictKind::InputBoundCpu
                    },
                    explains: explains(input),
                    host_share: None,
                });
            }
        }
        let contended = self.contended();
        // Untraced, a loop spinning behind others' kernels cannot be told from its own work.
        if let Some(h) = self
            .host
            .as_ref()
            .filter(|h| h.cuda_traced || contended.is_none())
        {
            let sm = self.sm;
            for HostCause {
                kind,
                share,
                explains,
            } in training_loop::causes(h, self.idle, sm, config)
            {
                if kind == VerdictKind::HostSync && contended.is_some() {
                    continue;
                }
                out.push(Candidate {
                    kind,
                    explains,
                    host_share: share,
                });
            }
        }
        if let Some(c) = contended {
            out.push(Candidate {
                kind: VerdictKind::Contention,
                explains: explains(c.others_fraction),
                host_share: None,
            });
        }
        out.sort_by(|a, b| b.explains.total_cmp(&a.explains));
        out
    }

    /// The cause that explains most of the idle time, or `unknown` when the causes together
    /// explain less than `explained_min` of it.
    fn explained(&self) -> Judged {
        let candidates = self.candidates();
        let together: f64 = candidates.iter().map(|c| c.explains).sum::<f64>().min(1.0);
        let Some(top) = candidates
            .first()
            .filter(|_| together >= self.config.explained_min)
        else {
            return Judged {
                explained: Some(together),
                ..Judged::new(
                    VerdictKind::Unknown,
                    advice::unknown(self.idle, together, &self.measured()),
                )
            };
        };
        let throttled = self.throttled.filter(|t| *t >= self.config.throttled_min);
        let advice = match top.kind {
            VerdictKind::InputBoundIo => {
                advice::input_io(self.loader.as_ref().expect("a loader"), self.idle)
            }
            VerdictKind::InputBoundCpu => advice::input_cpu(
                self.w,
                self.loader.as_ref().expect("a loader"),
                self.idle,
                throttled,
                &self.cpus,
            ),
            VerdictKind::Contention => advice::contention(self.contended().expect("contention")),
            kind => {
                let h = self.host.as_ref().expect("a host side");
                let quota = throttled.filter(|_| kind != VerdictKind::HostTransfers);
                advice::host_side(kind, self.w, h, self.idle, quota, &self.cpus)
            }
        };
        Judged {
            kind: top.kind,
            advice,
            host_share: top.host_share,
            explained: Some(together),
        }
    }

    /// What was measured of the causes, for an unknown verdict: each with its share.
    fn measured(&self) -> String {
        let mut parts = Vec::new();
        if let Some(i) = self.input {
            parts.push(format!("waiting for batches {}", pct(i)));
        }
        if let Some(h) = &self.host {
            if let Some(c) = h.copy_share {
                parts.push(format!("copies {}", pct(c)));
            }
            if let Some(s) = h.sync_idle_share {
                parts.push(format!(
                    "synchronising while the GPU had nothing to run {}",
                    pct(s)
                ));
            }
            parts.push(format!(
                "the training loop's own work {}",
                pct(h.own_cpu_share)
            ));
        }
        if let Some(t) = self.throttled.filter(|t| *t > 0.0) {
            parts.push(format!("throttled by the quota {}", pct(t)));
        }
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// Without stall tracing: other workloads' kernels, copies the utilisation hid, the
    /// cgroup's pressure stall information, and CPU times (`pressure`).
    fn without_tracing(&self) -> Judged {
        let (idle, config) = (self.idle, self.config);
        if let Some(c) = self.contended() {
            // Its loop is unseen, but it ran on the GPU and others ran more: that much is
            // measured.
            if self.busy >= config.idle_busy_max {
                return Judged::new(VerdictKind::Contention, advice::contention(c));
            }
        }
        let why = self
            .ebpf
            .detail()
            .unwrap_or_else(|| "stall tracing unavailable".into());
        if self.kernel.1 == KernelBusy::Gpm
            && self.busy - self.kernel.0 >= config.gpu_bound_idle_max
        {
            return Judged::new(
                VerdictKind::HostTransfers,
                format!(
                    "The GPU counts as busy {} of the time, but its kernels ran only {}: the rest \
                     was copies between host and GPU. Pin the host memory \
                     (DataLoader(pin_memory=True)) and copy with non_blocking=True one batch \
                     ahead so copies overlap compute, or move fewer or larger transfers. Told \
                     from GPM without stall tracing ({why}).",
                    pct(self.busy),
                    pct(self.kernel.0)
                ),
            );
        }
        if let Some(b) = gpu_time::pcie(self.w).filter(|b| *b >= config.pcie_busy_bytes_per_second)
        {
            return Judged::new(
                VerdictKind::HostTransfers,
                format!(
                    "The GPU's kernels idle {} of the time while {:.1} GB/s crosses PCIe: copies \
                     between host and GPU hold the step. Pin the host memory \
                     (DataLoader(pin_memory=True)) and copy with non_blocking=True one batch \
                     ahead so copies overlap compute, or move fewer or larger transfers. Told \
                     from PCIe traffic without stall tracing ({why}).",
                    pct(idle),
                    b / 1e9
                ),
            );
        }
        let Some(p) = self.w.pressure else {
            return Judged::new(
                VerdictKind::Unknown,
                format!(
                    "The GPU idles {} of the time; {why}. Without it the loader cannot be examined.",
                    pct(idle)
                ),
            );
        };
        let times = pressure::cpu_times(self.w, self.window);
        if let Some((kind, share)) = pressure::cause(&p, self.throttled, config) {
            // Waiting for a CPU with no process but the GPU processes at work: the training
            // loop's own work waited, not a loader.
            let loop_alone = times.is_some_and(|t| {
                t.other_cores < config.loader_active_min
                    && t.gpu_processes_busy >= config.loader_idle
            });
            let kind = if kind == VerdictKind::InputBoundCpu && loop_alone {
                VerdictKind::HostCpu
            } else {
                kind
            };
            return Judged::new(
                kind,
                pressure::advice(kind, share, self.w, idle, &self.cpus),
            );
        }
        let device_busy = gpu_time::device_busy(self.w, self.busy);
        if let Some((kind, figure)) =
            times.and_then(|t| pressure::cpu_cause(&t, device_busy, config))
        {
            return Judged {
                host_share: (kind == VerdictKind::HostCpu).then_some(figure),
                ..Judged::new(kind, pressure::cpu_advice(kind, figure, idle, &self.cpus))
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
}

#[cfg(test)]
mod invariants;
#[cfg(test)]
mod tests;
