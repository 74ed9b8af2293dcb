//! The training loop on the host: every thread of the workload's GPU processes, and what each
//! cause of the GPU's idle time cost it in the window.
//!
//! The loop is the process, not its main thread. On an H100 host (tests/gpu/real_loops.py,
//! docs/accuracy.md): a forward/backward/Adam step with `loss.item()` had its main thread on a
//! CPU 51 % of the window while autograd's device thread, launching the backward pass, was on
//! one 47 %, the main thread asleep in `backward()` meanwhile; a batch prepared by a thread pool
//! kept 8 CPUs busy while the main thread slept 69 % on the futures; a native tokenizer's
//! threads 6 CPUs. So the loop's work is its main thread's, and its other threads' while the
//! main thread waited on them (at most the main thread's wait: threads that run beside the main
//! thread, a pin-memory thread, do not stretch the step). Waiting for the data loader's batches
//! is not a wait on its own threads.
//!
//! Four host-side causes, each the share of the window it held the loop:
//! - **transfers**: copies between host and GPU (`cuMemcpy*`: in the calls, in the
//!   synchronisations that waited for them, and the loop's own time issuing them back to back);
//! - **sync**: synchronisations while the GPU had nothing to run (their time beyond the kernels'
//!   busy share: a host callback, another stream's event, another process);
//! - **launches** and **CPU**: the loop's own work, its busy time less the time in copies and
//!   synchronisations (PyTorch spins in a synchronise: `.item()` waiting 1.985 s for a kernel
//!   took 1.984 s of its thread's CPU on the H100 host), launches when it is a few µs per kernel
//!   launched and the GPU runs each kernel in less.
//!
//! Untraced (the probes attach only while a GPU idles under a busy loop, and not at all on
//! kernels without them), a synchronise's spin cannot be told from the loop's own work, and a
//! loop spins while the GPU runs its kernels or another process's: only its work beyond the
//! GPU's busy time is surely its own (on an H100 host, a job bursting matmuls 50 % of the time
//! beside two others spun 50 % of the window with the device busy 49 %). PCIe traffic then says
//! transfers, kernels that keep almost no SMs busy say launches.
use super::VerdictConfig;
use crate::model::{CudaCalls, HostSide, ProcessRole, ProcessStall, VerdictKind, Workload};

/// One GPU process's loop, as shares of the window (the other threads' work in CPUs).
#[derive(Clone, Copy, Debug, Default)]
struct ProcessLoop {
    main_busy: f64,
    other_cores: f64,
    /// The other threads' work that falls in the main thread's waits (not on the loader).
    helping: f64,
    own: f64,
    copy: f64,
    sync: f64,
    launches: u64,
    other_launches: u64,
}

/// The facts a loop is read against.
#[derive(Clone, Copy, Debug)]
pub struct LoopContext {
    pub window: f64,
    /// The kernels' busy share of the workload's GPUs, and all holders' busy share of them.
    pub kernel_busy: f64,
    pub device_busy: f64,
    /// The share of the window the main thread waited for the loader's batches.
    pub loader_wait: f64,
}

fn process_loop(
    p: &ProcessStall,
    cuda: Option<(&CudaCalls, &CudaCalls)>,
    c: &LoopContext,
) -> ProcessLoop {
    let w = c.window;
    let m = p.main_thread.unwrap_or_default();
    let main_busy = ((m.on_cpu_seconds + m.runq_seconds) / w).min(1.0);
    let main_sleep = m.sleep_seconds / w;
    let other_cores =
        ((p.on_cpu_seconds + p.runq_seconds - m.on_cpu_seconds - m.runq_seconds) / w).max(0.0);
    // The main thread's wait that is not a wait for the loader's batches.
    let room = (main_sleep - c.loader_wait).max(0.0);
    let Some((all, main)) = cuda else {
        // Untraced: beyond the GPU's busy time, surely not a spin in a synchronise.
        let helping = other_cores.min(room);
        return ProcessLoop {
            main_busy,
            other_cores,
            helping,
            own: ((main_busy - c.device_busy).max(0.0) + helping).min(1.0),
            ..Default::default()
        };
    };
    let mut others = *all;
    subtract(&mut others, main);
    let held = |x: &CudaCalls| (x.host_copy_seconds() + x.sync_seconds) / w;
    let issuing = (main.host_copy_seconds_with_issuing() - main.host_copy_seconds()) / w;
    let helping = (other_cores - held(&others)).max(0.0).min(room);
    ProcessLoop {
        main_busy,
        other_cores,
        helping,
        own: ((main_busy - held(main) - issuing).max(0.0) + helping).min(1.0),
        copy: (main.host_copy_seconds_with_issuing() / w
            + (others.host_copy_seconds() / w).min(room))
        .min(1.0),
        sync: (main.sync_seconds / w + (others.sync_seconds / w).min(room)).min(1.0),
        launches: all.launches,
        other_launches: others.launches,
    }
}

/// `a - b`, call by call (the other threads: all of them less the main one).
fn subtract(a: &mut CudaCalls, b: &CudaCalls) {
    a.launches = a.launches.saturating_sub(b.launches);
    a.graph_launches = a.graph_launches.saturating_sub(b.graph_launches);
    a.syncs = a.syncs.saturating_sub(b.syncs);
    a.sync_seconds = (a.sync_seconds - b.sync_seconds).max(0.0);
    for (x, y) in [
        (&mut a.h2d, &b.h2d),
        (&mut a.d2h, &b.d2h),
        (&mut a.d2d, &b.d2d),
        (&mut a.other_copies, &b.other_copies),
    ] {
        x.count = x.count.saturating_sub(y.count);
        x.bytes = x.bytes.saturating_sub(y.bytes);
        x.call_seconds = (x.call_seconds - y.call_seconds).max(0.0);
        x.wait_seconds = (x.wait_seconds - y.wait_seconds).max(0.0);
        x.between_seconds = (x.between_seconds - y.between_seconds).max(0.0);
    }
}

/// The host-side facts of a workload in one window, `None` without a stall window or a GPU
/// process in it.
pub fn host_side(w: &Workload, c: &LoopContext, pcie: Option<f64>) -> Option<HostSide> {
    let stalls = w.stalls.as_ref()?;
    let cuda = w.cuda.as_ref().filter(|c| c.traced);
    let loops: Vec<ProcessLoop> = stalls
        .processes
        .iter()
        .filter(|p| p.role == ProcessRole::Gpu)
        .map(|p| {
            let calls = cuda.map(|c| {
                c.processes
                    .iter()
                    .find(|q| q.pid == p.pid)
                    .map_or((&ZERO, &ZERO), |q| (&q.calls, &q.main_thread))
            });
            process_loop(p, calls, c)
        })
        .collect();
    if loops.is_empty() {
        return None;
    }
    let n = loops.len() as f64;
    let mean = |f: fn(&ProcessLoop) -> f64| loops.iter().map(f).sum::<f64>() / n;
    let (own, copy, sync) = (mean(|l| l.own), mean(|l| l.copy), mean(|l| l.sync));
    let launches: u64 = loops.iter().map(|l| l.launches).sum();
    let other_launches: u64 = loops.iter().map(|l| l.other_launches).sum();
    let traced = cuda.is_some();
    // Per process: each one's loop launches its own kernels.
    let per_process_launches = (launches as f64 / c.window / n).max(0.0);
    Some(HostSide {
        cuda_traced: traced,
        trainer_busy_fraction: mean(|l| (l.main_busy + l.helping).min(1.0)),
        main_thread_busy_fraction: mean(|l| l.main_busy),
        other_threads_cores: mean(|l| l.other_cores),
        kernel_busy_fraction: c.kernel_busy,
        device_busy_fraction: c.device_busy,
        copy_share: traced.then_some(copy),
        sync_share: traced.then_some(sync),
        sync_idle_share: traced.then_some((sync - c.kernel_busy).max(0.0)),
        launches_per_second: traced.then_some(launches as f64 / c.window),
        other_threads_launch_share: (traced && launches > 0)
            .then(|| other_launches as f64 / launches as f64),
        host_us_per_launch: (traced && launches > 0).then(|| own * 1e6 / per_process_launches),
        gpu_us_per_launch: (traced && launches > 0)
            .then(|| c.kernel_busy * 1e6 / per_process_launches),
        own_cpu_share: own,
        pcie_bytes_per_second: pcie,
    })
}

const ZERO: CudaCalls = CudaCalls {
    launches: 0,
    graph_launches: 0,
    h2d: crate::model::Transfer::ZERO,
    d2h: crate::model::Transfer::ZERO,
    d2d: crate::model::Transfer::ZERO,
    other_copies: crate::model::Transfer::ZERO,
    syncs: 0,
    sync_seconds: 0.0,
};

/// A host-side cause of the GPU's idle time: its kind, the share of the window it held the loop
/// (`None` where the evidence gives none: untraced), and the share of the GPU's idle time it
/// explains.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostCause {
    pub kind: VerdictKind,
    pub share: Option<f64>,
    pub explains: f64,
}

/// The host-side causes of a GPU that idles `idle` (the kernels' idle share) of the window,
/// largest first; those below their floor are left out. The loop's own work explains the idle
/// time the copies and synchronisations leave (issuing kernels overlaps the kernels before).
pub fn causes(
    h: &HostSide,
    idle: f64,
    sm_activity: Option<f64>,
    config: &VerdictConfig,
) -> Vec<HostCause> {
    if idle <= 0.0 {
        return Vec::new();
    }
    let explains = |t: f64| (t / idle).min(1.0);
    let mut out = Vec::new();
    if h.cuda_traced {
        let copy = h.copy_share.unwrap_or(0.0);
        let sync = h.sync_idle_share.unwrap_or(0.0);
        if copy >= config.cause_min {
            out.push(HostCause {
                kind: VerdictKind::HostTransfers,
                share: Some(copy),
                explains: explains(copy),
            });
        }
        if sync >= config.sync_idle_min {
            out.push(HostCause {
                kind: VerdictKind::HostSync,
                share: Some(sync),
                explains: explains(sync),
            });
        }
        let left = (idle - copy.min(idle) - sync.min(idle)).max(0.0);
        if h.own_cpu_share >= config.cause_min && left > 0.0 {
            let launch_bound = launch_bound(h, config);
            out.push(HostCause {
                kind: if launch_bound {
                    VerdictKind::HostLaunches
                } else {
                    VerdictKind::HostCpu
                },
                // Launches: the loop's time issuing them; its own work: the idle time it fills.
                share: Some(if launch_bound {
                    h.own_cpu_share
                } else {
                    h.own_cpu_share.min(left)
                }),
                explains: explains(h.own_cpu_share.min(left)),
            });
        }
    } else if h
        .pcie_bytes_per_second
        .is_some_and(|b| b >= config.pcie_busy_bytes_per_second)
    {
        out.push(HostCause {
            kind: VerdictKind::HostTransfers,
            share: None,
            explains: 1.0,
        });
    } else if h.trainer_busy_fraction >= config.step_busy_min {
        let device_idle = (1.0 - h.device_busy_fraction).max(0.0);
        let tiny_kernels = h.kernel_busy_fraction >= config.idle_busy_max
            && sm_activity.is_some_and(|s| s < config.sm_active_min);
        if tiny_kernels {
            out.push(HostCause {
                kind: VerdictKind::HostLaunches,
                share: None,
                explains: 1.0,
            });
        } else if device_idle > 0.0 && h.own_cpu_share >= config.step_busy_min * device_idle {
            out.push(HostCause {
                kind: VerdictKind::HostCpu,
                share: Some(h.own_cpu_share.min(device_idle)),
                explains: explains(h.own_cpu_share),
            });
        }
    }
    out.sort_by(|a, b| b.explains.total_cmp(&a.explains));
    out
}

/// Whether the loop's own work is issuing kernels: a few µs of it per launch, and the GPU
/// done with each kernel sooner.
fn launch_bound(h: &HostSide, config: &VerdictConfig) -> bool {
    match (h.host_us_per_launch, h.gpu_us_per_launch) {
        (Some(host), Some(gpu)) => host <= config.launch_host_max_us && gpu < host,
        _ => false,
    }
}

/// Whether the copies were from pageable memory: the copy calls themselves held the thread
/// (the driver stages pageable memory before it returns; a pinned `non_blocking` copy returns
/// at once and its time is in the wait after it).
pub fn pageable(w: &Workload) -> Option<bool> {
    let t = &w.cuda.as_ref().filter(|c| c.traced)?.total;
    let (call, held) = (
        t.h2d.call_seconds + t.d2h.call_seconds + t.other_copies.call_seconds,
        t.host_copy_seconds(),
    );
    (held > 0.0).then_some(call >= 0.5 * held)
}
