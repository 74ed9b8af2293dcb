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
use super::verdict::VerdictConfig;
use crate::model::{Pressure, VerdictKind, Workload};

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
pub fn advice(kind: VerdictKind, share: f64, w: &Workload, idle: f64) -> String {
    let coarse = "Told from pressure stall information, without stall tracing: it cannot say \
                  whether the loader or the training loop waited.";
    match kind {
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
            let quota = w.cpu.and_then(|c| c.limit_cores);
            format!(
                "The container's tasks waited for a CPU {} of the window while the GPU idled \
                 {}{}: {}. {coarse}",
                pct(share),
                pct(idle),
                quota
                    .map(|q| format!(", under a CPU quota of {q:.2} cores"))
                    .unwrap_or_default(),
                if quota.is_some() {
                    "raise the quota (docker --cpus) or lower num_workers to fit it"
                } else {
                    "the host's CPUs are oversubscribed: give the job more cores (cpuset), or \
                     lighten the augmentations"
                }
            )
        }
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
