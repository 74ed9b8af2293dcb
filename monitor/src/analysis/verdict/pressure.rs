//! A coarser verdict where the stall probes cannot load (no CAP_BPF, no BTF, `--no-ebpf`): the
//! container's cgroup pressure stall information tells which resource its tasks waited for in
//! the window. It cannot tell the loader from the training loop, nor a loader that saturates
//! free cores (no task waits for a CPU then), so the verdict says what it was told from.
//!
//! - `input-bound: CPU`: tasks waited for a CPU (its quota's throttling counts here)
//!   `pressure_cpu_min` of the window or more;
//! - `input-bound: I/O`: tasks waited for I/O `pressure_io_min` of the window or more;
//! - `input-bound: memory`: tasks waited for memory (reclaim, refaults of a squeezed page cache,
//!   swap-in) `pressure_memory_min` of the window or more;
//!
//! the largest share over its threshold wins.
//!
//! Pressure cannot see a loader that saturates free cores: on an H100 host a DataLoader with 4
//! workers used 2.05 CPUs while the GPU idled 94 %, with 0.01 % CPU pressure. Where no pressure
//! reaches its threshold, CPU times (`/proc`, and the cgroup's usage) split the container's
//! work between its GPU processes and the rest:
//! - `host-bound: CPU`: the GPU processes were on a CPU beyond the GPU's busy time (a spin in a
//!   synchronisation lasts no longer than the GPU's work) for `step_busy_min` of the GPU's idle
//!   time or more;
//! - `input-bound: CPU`: the container's other processes used `pressure_loader_cores_min` CPUs
//!   or more while the GPU idled (the GPU-bound phase of the same job: 0.09).
use super::advice::Cpus;
use super::words::pct;
use super::VerdictConfig;
use crate::model::{Pressure, VerdictKind, Workload};

/// A window's CPU time split between the GPU processes and the rest of the container.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTimes {
    /// The GPU processes' time on a CPU, mean per process, as a share of the window.
    pub gpu_processes_busy: f64,
    /// The container's CPU time less its GPU processes', in CPUs: the loader's workers and
    /// anything else it runs.
    pub other_cores: f64,
}

/// The CPU times of a window, when the container's usage and every GPU process's were
/// measured.
pub fn cpu_times(w: &Workload, window: f64) -> Option<CpuTimes> {
    let p = w.gpu.process_cpu.filter(|p| p.processes > 0)?;
    let cores = w.cpu.and_then(|c| c.cores)?;
    let gpu_cores = p.seconds / window;
    Some(CpuTimes {
        gpu_processes_busy: (gpu_cores / p.processes as f64).min(1.0),
        other_cores: (cores - gpu_cores).max(0.0),
    })
}

/// The cause CPU times show where pressure showed none, with its figure: the GPU processes'
/// busy share beyond the GPU's busy time, or the other processes' CPUs.
pub fn cpu_cause(
    t: &CpuTimes,
    device_busy: f64,
    config: &VerdictConfig,
) -> Option<(VerdictKind, f64)> {
    let own = (t.gpu_processes_busy - device_busy).max(0.0);
    let device_idle = (1.0 - device_busy).max(0.0);
    if device_idle > 0.0 && own >= config.step_busy_min * device_idle {
        return Some((VerdictKind::HostCpu, own));
    }
    (t.other_cores >= config.pressure_loader_cores_min)
        .then_some((VerdictKind::InputBoundCpu, t.other_cores))
}

/// What to do, for a cause [`cpu_cause`] found.
pub fn cpu_advice(kind: VerdictKind, figure: f64, idle: f64, cpus: &Cpus) -> String {
    let coarse = "Told from CPU times, without stall tracing.";
    let cores = cpus
        .describe()
        .map_or_else(String::new, |d| format!(" (the container may use {d})"));
    if kind == VerdictKind::HostCpu {
        return format!(
            "The training loop (the GPU processes) was on a CPU {} of the window beyond the \
             GPU's busy time while the GPU idled {}: its own work on the CPU (Python in the \
             step, data conversion, autotuning, copies or kernel launches) holds the GPU back. \
             Profile the step (py-spy, torch.profiler), move preprocessing into DataLoader \
             workers; more loader workers will not help. {coarse}",
            pct(figure),
            pct(idle)
        );
    }
    format!(
        "The container's other processes (its DataLoader workers) used {figure:.1} CPUs while \
         the GPU idled {} and no task waited for a CPU: the loader is CPU-bound on the cores it \
         has. Raise num_workers{cores}, lighten the augmentations or move \
         them to the GPU. {coarse}",
        pct(idle)
    )
}

/// The resource its tasks waited for most, over its threshold, with the share of the window.
/// The CPU's share is the larger of its pressure and the quota's throttled share (`cpu.stat`),
/// which measure the same wait where the kernel counts throttling as pressure.
pub fn cause(
    p: &Pressure,
    throttled: Option<f64>,
    config: &VerdictConfig,
) -> Option<(VerdictKind, f64)> {
    let cpu = p.cpu_some.max(throttled.unwrap_or(0.0));
    [
        (VerdictKind::InputBoundCpu, cpu, config.pressure_cpu_min),
        (VerdictKind::InputBoundIo, p.io_some, config.pressure_io_min),
        (
            VerdictKind::InputBoundMemory,
            p.memory_some,
            config.pressure_memory_min,
        ),
    ]
    .into_iter()
    .filter(|(_, share, min)| share >= min)
    .map(|(kind, share, _)| (kind, share))
    .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// The pressure figures, in words.
pub fn evidence(p: &Pressure, why_no_tracing: &str) -> String {
    format!(
        "from the cgroup's pressure stall information ({why_no_tracing}): its tasks waited for a \
         CPU {} of the window, for I/O {} (all of them at once {}), for memory {} ({})",
        pct(p.cpu_some),
        pct(p.io_some),
        pct(p.io_full),
        pct(p.memory_some),
        pct(p.memory_full)
    )
}

/// What to do, for a cause `cause` found.
pub fn advice(kind: VerdictKind, share: f64, w: &Workload, idle: f64, cpus: &Cpus) -> String {
    let coarse = "Told from pressure stall information, without stall tracing: it cannot say \
                  whether the loader or the training loop waited.";
    match kind {
        VerdictKind::HostCpu => format!(
            "The container's tasks waited for a CPU {} of the window while the GPU idled {}, \
             and no process but the training loop's was at work: its own work is held back{}. \
             {} Told from pressure stall information and CPU times, without stall tracing.",
            pct(share),
            pct(idle),
            cpus.quota
                .map(|q| format!(" by the container's CPU quota ({q:.2} cores)"))
                .unwrap_or_default(),
            if cpus.quota.is_some() {
                "Raise the quota (docker --cpus), or move work off the training loop."
            } else {
                "Give the job CPUs of its own (docker --cpuset-cpus), or move work off the \
                 training loop."
            }
        ),
        VerdictKind::InputBoundIo => format!(
            "The container's tasks waited for I/O {} of the window while the GPU idled {}: \
             cache the dataset in RAM or on local NVMe, pack small files into larger shards, \
             or raise num_workers to keep more reads in flight. {coarse}",
            pct(share),
            pct(idle)
        ),
        VerdictKind::InputBoundMemory => format!(
            "The container's tasks waited for memory {} of the window while the GPU idled {}: \
             its memory limit{} squeezes the page cache or its own memory, so pages are \
             reclaimed and read again. Raise --memory, or lower the DataLoader's prefetch_factor \
             and num_workers. {coarse}",
            pct(share),
            pct(idle),
            w.memory
                .and_then(|m| m.limit_bytes)
                .map(|l| format!(" ({})", crate::units::ByteSize(l)))
                .unwrap_or_default()
        ),
        _ => {
            let quota = cpus.quota;
            format!(
                "The container's tasks waited for a CPU {} of the window while the GPU idled \
                 {}{}: {}. {coarse}",
                pct(share),
                pct(idle),
                quota
                    .map(|q| format!(", under a CPU quota of {q:.2} cores"))
                    .unwrap_or_default(),
                if quota.is_some() {
                    "raise the quota (docker --cpus) or lower num_workers to fit it".to_owned()
                } else {
                    format!(
                        "the CPUs it may use ({}) are oversubscribed: give the job CPUs of its \
                         own (docker --cpuset-cpus), or lighten the work",
                        cpus.describe().unwrap_or_else(|| "the host's".to_owned())
                    )
                }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The advice counts the CPUs the container may use: the host's, or fewer in its cpuset or
    /// quota; and says nothing of a count it does not have.
    #[test]
    fn cpu_bound_advice_names_the_cpus_the_container_may_use() {
        let host = Cpus {
            host: Some(96),
            ..Default::default()
        };
        let known = cpu_advice(VerdictKind::InputBoundCpu, 3.5, 0.4, &host);
        assert!(
            known.contains("Raise num_workers (the container may use the host's 96 CPUs),"),
            "{known}"
        );
        let cpuset = Cpus {
            host: Some(16),
            cpuset: Some(2),
            quota: None,
        };
        let small = cpu_advice(VerdictKind::InputBoundCpu, 1.9, 0.4, &cpuset);
        assert!(small.contains("its cpuset's 2 CPUs"), "{small}");
        assert!(!small.contains("16"), "{small}");
        let unknown = cpu_advice(VerdictKind::InputBoundCpu, 3.5, 0.4, &Cpus::default());
        assert!(unknown.contains("Raise num_workers, lighten"), "{unknown}");
        assert!(!unknown.contains("CPUs)"), "{unknown}");
    }

    fn p(cpu: f64, io: f64, memory: f64) -> Pressure {
        Pressure {
            cpu_some: cpu,
            io_some: io,
            io_full: io / 2.0,
            memory_some: memory,
            memory_full: memory / 2.0,
        }
    }

    #[test]
    fn each_cause_from_its_threshold_and_the_largest_wins() {
        let c = VerdictConfig::default();
        let kind = |pr: Pressure| cause(&pr, None, &c).map(|(k, _)| k);
        assert_eq!(
            kind(p(c.pressure_cpu_min, 0.0, 0.0)),
            Some(VerdictKind::InputBoundCpu)
        );
        assert_eq!(kind(p(c.pressure_cpu_min - 0.01, 0.0, 0.0)), None);
        assert_eq!(
            kind(p(0.0, c.pressure_io_min, 0.0)),
            Some(VerdictKind::InputBoundIo)
        );
        assert_eq!(kind(p(0.0, c.pressure_io_min - 0.01, 0.0)), None);
        assert_eq!(
            kind(p(0.0, 0.0, c.pressure_memory_min)),
            Some(VerdictKind::InputBoundMemory)
        );
        assert_eq!(kind(p(0.0, 0.0, c.pressure_memory_min - 0.01)), None);
        assert_eq!(kind(p(0.5, 0.8, 0.3)), Some(VerdictKind::InputBoundIo));
        assert_eq!(kind(p(0.9, 0.8, 0.3)), Some(VerdictKind::InputBoundCpu));
        // The quota's throttling stands in for CPU pressure the kernel did not count.
        let throttled = |t| cause(&p(0.0, 0.0, 0.0), Some(t), &c).map(|(k, _)| k);
        assert_eq!(
            throttled(c.pressure_cpu_min),
            Some(VerdictKind::InputBoundCpu)
        );
        assert_eq!(throttled(c.pressure_cpu_min - 0.01), None);
    }

    fn times(gpu_processes_busy: f64, other_cores: f64) -> CpuTimes {
        CpuTimes {
            gpu_processes_busy,
            other_cores,
        }
    }

    #[test]
    fn cpu_times_tell_the_loop_from_the_loader_at_their_thresholds() {
        let c = VerdictConfig::default();
        let kind = |t: CpuTimes, busy: f64| cpu_cause(&t, busy, &c).map(|(k, _)| k);
        // H100, the loader phase on free cores: the workers 2.05 CPUs, the GPU busy 0.04.
        assert_eq!(
            kind(times(0.04, 2.0), 0.04),
            Some(VerdictKind::InputBoundCpu)
        );
        assert_eq!(
            kind(times(0.0, c.pressure_loader_cores_min), 0.0),
            Some(VerdictKind::InputBoundCpu)
        );
        assert_eq!(
            kind(times(0.0, c.pressure_loader_cores_min - 0.01), 0.0),
            None
        );
        // The same job starting up: its main process on a CPU 0.99 of the window, the GPU idle.
        let (k, own) = cpu_cause(&times(0.99, 0.01), 0.0, &c).unwrap();
        assert_eq!((k, own), (VerdictKind::HostCpu, 0.99));
        // GPU busy 0.4: the loop's time beyond it must fill half the idle 0.6.
        assert_eq!(kind(times(0.701, 0.0), 0.4), Some(VerdictKind::HostCpu));
        assert_eq!(kind(times(0.699, 0.0), 0.4), None);
        // A loop that spins while the GPU (its kernels or another job's) is busy: no cause of
        // its own, and a busy loader beside it is the cause.
        assert_eq!(kind(times(0.5, 0.0), 0.49), None);
        assert_eq!(
            kind(times(0.5, 1.0), 0.49),
            Some(VerdictKind::InputBoundCpu)
        );
    }

    #[test]
    fn cpu_times_need_the_containers_usage_and_every_gpu_process() {
        let mut w = Workload::new(crate::model::WorkloadId::host(), "c".to_owned(), None);
        assert_eq!(cpu_times(&w, 2.0), None);
        w.gpu.process_cpu = Some(crate::model::ProcessCpu {
            seconds: 0.2,
            processes: 2,
        });
        assert_eq!(cpu_times(&w, 2.0), None, "no cgroup usage");
        w.cpu = Some(crate::model::CpuUsage {
            usage_seconds_total: 10.0,
            cores: Some(2.1),
            limit_cores: None,
            cpuset_cpus: None,
            throttled_seconds_total: None,
            throttled_fraction: None,
            quota_periods: None,
        });
        let t = cpu_times(&w, 2.0).unwrap();
        assert!((t.gpu_processes_busy - 0.05).abs() < 1e-9, "{t:?}");
        assert!((t.other_cores - 2.0).abs() < 1e-9, "{t:?}");
    }
}
