//! The data loader: the workload's processes without a GPU context (PyTorch DataLoader workers
//! are child processes), how saturated they are, and how long the training loop waited for its
//! batches.
//!
//! The `input_bound_share` is the time the trainer waited for its next batch while the GPU
//! idled. The trainer waits on its main thread (a DataLoader's main process sleeps on its
//! workers' queue; without loader processes it reads itself, in D): that wait, as a share of
//! the main thread's traced time, at most the GPU's idle share. The main thread also sleeps
//! while the GPU computes (autograd's backward runs on other threads; on the H200 a GPU-bound
//! step's main thread slept 31–34 % of the time against 6 % of data wait), so the wait counts as
//! waiting for batches as far as the loader is saturated: in full once its busy share reaches
//! `loader_saturated`, in proportion below.
use super::VerdictConfig;
use crate::model::{LoaderSummary, ProcessRole, Workload};

/// The loader summary of a workload's stall window, `None` without one.
pub fn loader_summary(w: &Workload, window: f64) -> Option<LoaderSummary> {
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
pub fn trainer_wait(w: &Workload, in_gpu_process: bool) -> Option<f64> {
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
pub fn input_bound(idle: f64, wait: f64, loader: &LoaderSummary, config: &VerdictConfig) -> f64 {
    let saturation = if loader.in_gpu_process {
        1.0
    } else {
        (loader.busy_fraction / config.loader_saturated.max(f64::EPSILON)).min(1.0)
    };
    wait.min(idle) * saturation
}
