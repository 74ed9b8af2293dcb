//! The host side of the training step: what the training loop (the GPU processes' main threads)
//! does while the GPU waits, when the data loader is not the cause.
//!
//! Four causes, each a verdict with its own fix:
//! - **transfers**: the loop copies between host and GPU (`cuMemcpy*`, in the calls and in the
//!   synchronisations that wait for them right after);
//! - **launches**: it issues kernels one by one as fast as it can, each too small to keep the GPU
//!   busy: its own CPU time is a few µs per kernel launched, and the GPU runs each in less;
//! - **sync**: it waits in synchronisations while the GPU has nothing to run (the time in
//!   `cu*Synchronize` beyond the GPU's busy share: a host callback, another stream's event,
//!   another process);
//! - **CPU**: its own work on the CPU, whatever is left of its busy time (Python, data
//!   conversion, autotuning, logging).
//!
//! With the CUDA driver calls traced, each cause's share of the window is measured and the
//! largest one over its threshold is the verdict; the loop's own CPU work is launches or CPU by
//! its time per kernel launched. Without them (the probes attach only while a
//! GPU idles under a busy trainer, so the first such window has none), PCIe traffic says
//! transfers, kernels that keep almost no SMs busy say launches, and a trainer busy beyond the
//! GPU's busy time for at least `step_busy_min` of the GPU's idle time says CPU: untraced, the loop's spin in synchronisations cannot be told from
//! its own work, and it spins while the GPU runs its kernels or another process's (on an H100
//! host, a job bursting matmuls 50 % of the time beside two others spun 50 % of the window
//! with the device busy 49 %: it was called host-bound before this bound).
//!
//! Measured on an H100 host (tests/gpu/cuda_calls.py): a pageable-copy step spent 66 % copying
//! at 5.1 GB/s of PCIe receive; a one-element-kernel loop launched 116 k kernels/s (2.7 µs of GPU
//! each, SM activity 0.03 %); a step doing 25 ms of Python per 2 ms of GPU work launched 370/s;
//! a step held 8 ms per 10 by a host callback waited in `cuCtxSynchronize` 99 % of the time
//! with the GPU busy 14 %.
use super::VerdictConfig;
use crate::model::{CudaCalls, HostSide, ProcessRole, VerdictKind, Workload};

/// The host-side facts of a workload in one window, `None` without a stall window or a GPU
/// process whose main thread was seen.
pub fn host_side(w: &Workload, window: f64, busy: f64, pcie: Option<f64>) -> Option<HostSide> {
    let stalls = w.stalls.as_ref()?;
    let busy_shares: Vec<f64> = stalls
        .processes
        .iter()
        .filter(|p| p.role == ProcessRole::Gpu)
        .filter_map(|p| p.main_thread)
        .map(|m| ((m.on_cpu_seconds + m.runq_seconds) / window).min(1.0))
        .collect();
    if busy_shares.is_empty() {
        return None;
    }
    let n = busy_shares.len() as f64;
    let trainer_busy = busy_shares.iter().sum::<f64>() / n;
    let cuda = w.cuda.as_ref().filter(|c| c.traced);
    // Per main thread, mean over the GPU processes the stall window saw.
    let main = cuda.map(|c| {
        let mut sum = CudaCalls::default();
        for p in &c.processes {
            sum.add(&p.main_thread);
        }
        sum
    });
    let per_window = |s: f64| (s / window / n).min(1.0);
    let copy_share = main.map(|m| per_window(m.host_copy_seconds()));
    let sync_share = main.map(|m| per_window(m.sync_seconds));
    let launches = cuda.map(|c| c.total.launches as f64 / window);
    let gpu_us_per_launch = cuda
        .map(|c| c.total.launches)
        .filter(|l| *l > 0)
        .map(|l| busy * window * 1e6 / l as f64);
    let device_busy = device_busy(w, busy);
    let own_cpu = match (copy_share, sync_share) {
        (Some(copy), Some(sync)) => (trainer_busy - copy - sync).max(0.0),
        // Untraced, its synchronisations are unseen, and PyTorch's spin while the GPU runs its
        // kernels, or another process's: only the busy time beyond the GPU's is surely its own.
        _ => (trainer_busy - device_busy).max(0.0),
    };
    // per main thread: each process's loop launches its own kernels
    let host_us_per_launch = launches
        .filter(|l| *l > 0.0)
        .map(|l| own_cpu * 1e6 / (l / n));
    Some(HostSide {
        cuda_traced: cuda.is_some(),
        trainer_busy_fraction: trainer_busy,
        device_busy_fraction: device_busy,
        copy_share,
        sync_share,
        sync_idle_share: sync_share.map(|s| (s - busy).max(0.0)),
        launches_per_second: launches,
        host_us_per_launch,
        gpu_us_per_launch,
        own_cpu_share: own_cpu,
        pcie_bytes_per_second: pcie,
    })
}

/// The GPU's busy share, all holders together, over the workload's GPUs (its own where the
/// device's is unknown).
pub fn device_busy(w: &Workload, own: f64) -> f64 {
    let device: Vec<f64> = w
        .gpu
        .per_gpu
        .iter()
        .filter_map(|g| g.device_busy_fraction)
        .collect();
    if device.is_empty() {
        own
    } else {
        (device.iter().sum::<f64>() / device.len() as f64).max(own)
    }
}

/// The host-side cause of a GPU that idles, with its share of the window (`None` where the
/// evidence gives none), or `None` when no cause reaches its threshold.
pub fn cause(
    h: &HostSide,
    busy: f64,
    sm_activity: Option<f64>,
    config: &VerdictConfig,
) -> Option<(VerdictKind, Option<f64>)> {
    if h.cuda_traced {
        let own = if launch_bound(h, config) {
            VerdictKind::HostLaunches
        } else {
            VerdictKind::HostCpu
        };
        let candidates = [
            (
                VerdictKind::HostTransfers,
                h.copy_share,
                config.copy_share_min,
            ),
            (
                VerdictKind::HostSync,
                h.sync_idle_share,
                config.sync_idle_min,
            ),
            (own, Some(h.own_cpu_share), config.step_busy_min),
        ];
        return candidates
            .into_iter()
            .filter_map(|(k, share, min)| share.filter(|s| *s >= min).map(|s| (k, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(k, s)| (k, Some(s)));
    }
    if h.pcie_bytes_per_second
        .is_some_and(|b| b >= config.pcie_busy_bytes_per_second)
    {
        return Some((VerdictKind::HostTransfers, None));
    }
    if h.trainer_busy_fraction < config.step_busy_min {
        return None;
    }
    let tiny_kernels =
        busy >= config.idle_busy_max && sm_activity.is_some_and(|s| s < config.sm_active_min);
    if tiny_kernels {
        return Some((VerdictKind::HostLaunches, None));
    }
    // Its work beyond the GPU's busy time falls in the GPU's idle time: the cause when it fills
    // `step_busy_min` of that.
    let device_idle = (1.0 - h.device_busy_fraction).max(0.0);
    (device_idle > 0.0 && h.own_cpu_share >= config.step_busy_min * device_idle)
        .then_some((VerdictKind::HostCpu, Some(h.own_cpu_share)))
}

/// Whether the loop's own CPU work is issuing kernels: a few µs of it per launch, and the GPU
/// done with each kernel sooner.
fn launch_bound(h: &HostSide, config: &VerdictConfig) -> bool {
    match (h.host_us_per_launch, h.gpu_us_per_launch) {
        (Some(host), Some(gpu)) => host <= config.launch_host_max_us && gpu < host,
        _ => false,
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The evidence lines of the host side.
pub fn evidence(w: &Workload, h: &HostSide, window: f64) -> Vec<String> {
    let mut lines = vec![format!(
        "the training loop (the GPU processes' main threads) was on a CPU or waiting for one {} \
         of the window",
        pct(h.trainer_busy_fraction)
    )];
    if let Some(b) = h.pcie_bytes_per_second {
        lines.push(format!("PCIe traffic of its GPUs: {:.0} MB/s", b / 1e6));
    }
    let Some(c) = w.cuda.as_ref().filter(|c| c.traced) else {
        lines.push(
            "CUDA driver calls not traced in this window (they are probed while a GPU idles \
             under a busy trainer): the host-side cause is told from PCIe traffic, SM activity \
             and thread states"
                .to_owned(),
        );
        return lines;
    };
    let t = &c.total;
    let mut calls = format!(
        "CUDA calls: {:.0} kernel launches/s",
        t.launches as f64 / window
    );
    if let (Some(host), Some(gpu)) = (h.host_us_per_launch, h.gpu_us_per_launch) {
        calls.push_str(&format!(
            " ({host:.1} µs of the loop's CPU and {gpu:.1} µs of GPU time each)"
        ));
    }
    if t.graph_launches > 0 {
        calls.push_str(&format!(", {} graph launches", t.graph_launches));
    }
    for (name, x) in [("to the GPU", &t.h2d), ("from the GPU", &t.d2h)] {
        if x.count > 0 {
            calls.push_str(&format!(
                ", {} copies {name} ({:.1} MiB/s, {:.0} ms in the calls, {:.0} ms waiting)",
                x.count,
                x.bytes as f64 / (1 << 20) as f64 / window,
                x.call_seconds * 1e3,
                x.wait_seconds * 1e3
            ));
        }
    }
    if t.syncs > 0 {
        calls.push_str(&format!(
            ", {} synchronisations ({:.0} ms)",
            t.syncs,
            t.sync_seconds * 1e3
        ));
    }
    lines.push(calls);
    lines.push(format!(
        "the training loop's time: copying {}, synchronising {} ({} while the GPU had nothing \
         to run), its own CPU work (issuing kernels among it) {}",
        pct(h.copy_share.unwrap_or(0.0)),
        pct(h.sync_share.unwrap_or(0.0)),
        pct(h.sync_idle_share.unwrap_or(0.0)),
        pct(h.own_cpu_share)
    ));
    lines
}

/// Whether the copies were from pageable memory: the copy calls themselves held the thread
/// (the driver stages pageable memory before it returns; a pinned `non_blocking` copy returns
/// at once and its time is in the wait after it).
fn pageable(w: &Workload) -> Option<bool> {
    let t = &w.cuda.as_ref().filter(|c| c.traced)?.total;
    let (call, held) = (
        t.h2d.call_seconds + t.d2h.call_seconds + t.other_copies.call_seconds,
        t.host_copy_seconds(),
    );
    (held > 0.0).then_some(call >= 0.5 * held)
}

/// The advice for a host-side verdict.
pub fn advice(
    kind: VerdictKind,
    w: &Workload,
    h: &HostSide,
    idle: f64,
    throttled: Option<(f64, Option<f64>)>,
) -> String {
    let mut text = match kind {
        VerdictKind::HostTransfers => {
            let how = match pageable(w) {
                Some(true) => "; the copy calls themselves held the thread, so the host memory \
                               is pageable and the driver stages every byte",
                Some(false) => "; the thread waited for the copies to finish, so they do not \
                                overlap with compute",
                None => "",
            };
            format!(
                "The training loop is held by copies between host and GPU ({} of the window{how}) while the GPU idles {}: pin the host memory (DataLoader(pin_memory=True)) and copy with non_blocking=True one batch ahead so copies overlap compute, move fewer or larger transfers, or preprocess on the GPU.",
                h.copy_share.map_or_else(|| "PCIe busy".to_owned(), pct),
                pct(idle)
            )
        }
        VerdictKind::HostLaunches => format!(
            "The training loop launches kernels one by one{} and each is too small to keep the GPU busy, which idles {}: capture the step in CUDA graphs (torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs), fuse small operations (torch.compile), or raise the batch size; a faster data loader will not help.",
            h.launches_per_second.zip(h.host_us_per_launch).map_or_else(
                String::new,
                |(l, us)| format!(" ({l:.0} a second, {us:.1} µs of its CPU each, {} of the window)", pct(h.own_cpu_share))
            ),
            pct(idle)
        ),
        VerdictKind::HostSync => format!(
            "The training loop waits in CUDA synchronisations {} of the window, {} of it while the GPU had nothing to run, which idles {}: it waits on something other than its own GPU work (a host callback, another stream's event, another process). Remove per-step synchronisations (torch.cuda.synchronize(), .item(), .cpu() of results) or move what they wait for off the step.",
            pct(h.sync_share.unwrap_or(0.0)),
            pct(h.sync_idle_share.unwrap_or(0.0)),
            pct(idle)
        ),
        _ => format!(
            "The training loop is busy on the CPU with its own work ({} of the window: not copying, launching or waiting on the GPU) while the GPU idles {}: Python in the step, data conversion on the main thread, autotuning (cudnn.benchmark with changing shapes), logging. Profile the step (py-spy, torch.profiler), move preprocessing into DataLoader workers, keep input shapes fixed; more loader workers will not help.",
            pct(h.own_cpu_share),
            pct(idle)
        ),
    };
    if let Some((t, limit)) = throttled {
        text.push_str(&format!(
            " The container's CPU quota ({}) throttles it {} of the window: raise it (docker --cpus).",
            limit.map_or("set".to_owned(), |c| format!("{c:.1} cores")),
            pct(t)
        ));
    }
    text
}
