//! The measurements behind a verdict, in words: the GPU side, the loader, the training loop's
//! threads and calls, the contention. Each line states a measured figure; the advice
//! (`advice.rs`) may only act on what these lines say.
use super::gpu_time::KernelBusy;
use super::words::{ms, pct};
use crate::model::{Contention, HostSide, LoaderSummary, SplitMethod, Workload};

/// The GPU-side lines.
pub fn gpu(w: &Workload, busy: f64, kernel: (f64, KernelBusy), sm: Option<f64>) -> Vec<String> {
    let mut evidence = vec![format!(
        "GPU busy {} of the window ({} idle)",
        pct(busy),
        pct(1.0 - busy)
    )];
    match kernel {
        (k, KernelBusy::Gpm) if busy - k >= 0.05 => evidence.push(format!(
            "of that, its kernels ran {} of the window (GPM's engine activity): the rest was \
             copies, which utilisation counts as busy",
            pct(k)
        )),
        (k, KernelBusy::LessCopies) => evidence.push(format!(
            "less the copies the training loop waited on beside heavy PCIe traffic, its kernels \
             ran at most {} of the window: utilisation counts copies as busy",
            pct(k)
        )),
        _ => {}
    }
    for g in &w.gpu.per_gpu {
        let (Some(b), Some(d), Some(split)) = (g.busy_fraction, g.device_busy_fraction, g.split)
        else {
            continue;
        };
        let how = if split.is_exact() {
            String::new()
        } else if split == SplitMethod::HostCpuEstimate {
            "; shared, its part estimated from the holders' host CPU time".to_owned()
        } else {
            "; shared, its part taken from the driver's per-process figures".to_owned()
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

/// The loader- and I/O-side lines.
pub fn loader(
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
            // step's own): the training loop's lines say what else they did.
            format!(
                "no loader processes (num_workers=0): reading their own data blocked the GPU \
                 processes {} of the window",
                pct(l.busy_fraction)
            )
        } else {
            format!(
                "{} loader process(es) busy {} of the window ({:.1} CPUs): on CPU {}, waiting \
                 for a CPU {}, blocked on I/O {} of that",
                l.processes,
                pct(l.busy_fraction),
                l.busy_cores,
                pct(l.on_cpu_share),
                pct(l.runq_share),
                pct(l.blocked_share)
            )
        });
    }
    if let Some(t) = wait {
        evidence.push(format!(
            "the training loop's main thread waited {} of the window",
            pct(t)
        ));
    }
    if let Some(r) = w.stalls.as_ref().map(|s| s.reads).filter(|r| r.count > 0) {
        evidence.push(format!(
            "{} reads, {:.1} MiB, p50 {} ms, p99 {} ms, {} slower than 10 ms",
            r.count,
            r.bytes as f64 / (1 << 20) as f64,
            ms(r.p50_latency_ms),
            ms(r.p99_latency_ms),
            r.slow_count
        ));
    }
    if let Some(d) = w.stalls.as_ref().map(|s| s.disk).filter(|d| d.count > 0) {
        evidence.push(format!(
            "{} disk requests, {:.1} MiB/s, p50 {} ms, p99 {} ms",
            d.count,
            d.bytes as f64 / (1 << 20) as f64 / window,
            ms(d.p50_latency_ms),
            ms(d.p99_latency_ms)
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

/// The training loop's lines: which threads did what, and its CUDA calls.
pub fn training_loop(w: &Workload, h: &HostSide, window: f64) -> Vec<String> {
    let mut lines = vec![format!(
        "the training loop was at work {} of the window: its main thread on a CPU or waiting for \
         one {}, its other threads (autograd, pools, tokenizers, decoders) {:.2} CPUs",
        pct(h.trainer_busy_fraction),
        pct(h.main_thread_busy_fraction),
        h.other_threads_cores
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
    if let Some(o) = h.other_threads_launch_share.filter(|o| *o > 0.0) {
        calls.push_str(&format!(
            " ({} of them from threads other than the main one)",
            pct(o)
        ));
    }
    if let (Some(host), Some(gpu)) = (h.host_us_per_launch, h.gpu_us_per_launch) {
        calls.push_str(&format!(
            ", {host:.1} µs of the loop's own work and {gpu:.1} µs of kernel time each"
        ));
    }
    if t.graph_launches > 0 {
        calls.push_str(&format!(", {} graph launches", t.graph_launches));
    }
    for (name, x) in [("to the GPU", &t.h2d), ("from the GPU", &t.d2h)] {
        if x.count > 0 {
            calls.push_str(&format!(
                ", {} copies {name} ({:.1} MiB/s, {:.0} ms in the calls, {:.0} ms waiting, {:.0} \
                 ms issuing them)",
                x.count,
                x.bytes as f64 / (1 << 20) as f64 / window,
                x.call_seconds * 1e3,
                x.wait_seconds * 1e3,
                x.between_seconds * 1e3
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
         to run), its own work (issuing kernels among it) {}",
        pct(h.copy_share.unwrap_or(0.0)),
        pct(h.sync_share.unwrap_or(0.0)),
        pct(h.sync_idle_share.unwrap_or(0.0)),
        pct(h.own_cpu_share)
    ));
    lines
}

/// "GPU 0 was busy 94% of the window: 43% train-a, 26% eval-b, 10% this job's own (host CPU
/// estimate)".
pub fn contention(c: &Contention) -> String {
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
