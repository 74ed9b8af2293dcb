//! What to do, for each verdict, in the user's words: acting only on what the evidence says,
//! counting the CPUs the container may use (its cpuset and quota, not the host's), and naming a
//! framework's own flags only where the workload shows that framework.
use super::training_loop::pageable;
use super::words::{cpus, pct};
use crate::model::{Contention, HostSide, LoaderSummary, VerdictKind, Workload};

/// The CPUs a workload may use: the host's, its cpuset's, its quota.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cpus {
    pub host: Option<u32>,
    pub cpuset: Option<u32>,
    pub quota: Option<f64>,
}

impl Cpus {
    pub fn of(w: &Workload, host: Option<u32>) -> Self {
        Self {
            host,
            cpuset: w.cpu.and_then(|c| c.cpuset_cpus),
            quota: w.cpu.and_then(|c| c.limit_cores),
        }
    }

    /// The most CPUs its tasks can use at once, `None` where nothing is known.
    pub fn usable(&self) -> Option<f64> {
        [
            self.host.map(f64::from),
            self.cpuset.map(f64::from),
            self.quota,
        ]
        .into_iter()
        .flatten()
        .reduce(f64::min)
    }

    /// What limits it, in words: "its cpuset's 2 CPUs", "its quota of 1.5 CPUs", "the host's
    /// 16 CPUs".
    pub fn describe(&self) -> Option<String> {
        let usable = self.usable()?;
        Some(if self.quota.is_some_and(|q| q <= usable) {
            format!("its quota of {}", cpus(usable))
        } else if self.cpuset.is_some_and(|c| f64::from(c) <= usable) {
            format!("its cpuset's {}", cpus(usable))
        } else {
            format!("the host's {}", cpus(usable))
        })
    }
}

/// Whether the workload shows it runs Ultralytics YOLO (its name or image says so).
fn yolo(w: &Workload) -> bool {
    let named = |s: &str| {
        let s = s.to_ascii_lowercase();
        s.contains("yolo") || s.contains("ultralytics")
    };
    named(&w.name) || w.container.as_ref().is_some_and(|c| named(&c.image))
}

pub fn gpu_bound(busy: f64) -> String {
    format!(
        "The GPU is the bottleneck (busy {}): the loader keeps up. Larger batches, mixed \
         precision (AMP) or a lighter model are the levers; more loader workers will not help.",
        pct(busy)
    )
}

pub fn low_sm_activity(busy: f64, sm: f64) -> String {
    format!(
        "The GPU is busy {} of the time, but while its kernels run only {} of the SMs work: each \
         kernel is too small to fill the GPU (tiny kernels, a launch-bound step, or a batch too \
         small). Raise the batch size, fuse small operations (torch.compile), or capture the \
         step in CUDA graphs; a faster data loader will not help.",
        pct(busy),
        pct(sm)
    )
}

pub fn idle(w: &Workload) -> String {
    format!(
        "No GPU work, no loader work and a training loop whose threads do nothing in the window, \
         while {:.1} GiB of GPU memory is held. If the job is finished or stuck, stop it to free \
         the GPU.",
        w.gpu.memory_bytes as f64 / (1u64 << 30) as f64
    )
}

/// The container's quota holding its work back: the lead of a CPU verdict's advice.
pub fn quota(throttled: f64, cpus: &Cpus) -> String {
    format!(
        "The container's CPU quota ({}) throttled it {} of the window: raise it (docker \
         --cpus), or fit the work to it.",
        cpus.quota.map_or("set".to_owned(), super::words::cpus),
        pct(throttled)
    )
}

pub fn input_io(l: &LoaderSummary, idle: f64) -> String {
    format!(
        "The data loader waits on storage ({} of its busy time blocked on I/O) while the GPU \
         idles {}: cache the dataset in RAM or on local NVMe, pack small files into larger \
         shards, or raise num_workers to keep more reads in flight.",
        pct(l.blocked_share),
        pct(idle)
    )
}

/// A loader short of CPU: held by the quota, waiting for CPUs others hold, or using all the
/// container has; else free to use more workers.
pub fn input_cpu(
    w: &Workload,
    l: &LoaderSummary,
    idle: f64,
    throttled: Option<f64>,
    cpus: &Cpus,
) -> String {
    let lighter = if yolo(w) {
        "lighten the augmentations (lower imgsz, mosaic off) or move them to the GPU"
    } else {
        "lighten the augmentations or move them to the GPU (torchvision.transforms.v2 on GPU \
         tensors, DALI)"
    };
    let head = format!(
        "The data loader is CPU-bound (on CPU {}, waiting for a CPU {} of its busy time) while \
         the GPU idles {}",
        pct(l.on_cpu_share),
        pct(l.runq_share),
        pct(idle)
    );
    if let Some(t) = throttled {
        return format!("{head}. {} Or {lighter}.", quota(t, cpus));
    }
    let usable = cpus.usable();
    let limit = cpus.describe();
    let on_cpu = l.busy_cores * l.on_cpu_share;
    if l.runq_share >= 1.0 / 3.0 {
        return format!(
            "{head}: its workers wait for CPUs that other work holds, so more workers will not \
             help. Give the container CPUs of its own (docker --cpuset-cpus) or move the other \
             work away, or {lighter}."
        );
    }
    match (usable, limit) {
        (Some(n), Some(limit)) if on_cpu >= 0.9 * n => format!(
            "{head}: it already uses {on_cpu:.1} of the {} the container may use ({limit}). Give \
             the container more CPUs (docker --cpus, --cpuset-cpus), or {lighter}.",
            cpus_word(n)
        ),
        (Some(n), Some(limit)) => format!(
            "{head}: raise num_workers (the loader uses {on_cpu:.1} of the {} the container \
             may use: {limit}), or {lighter}.",
            cpus_word(n)
        ),
        _ => format!("{head}: raise num_workers, or {lighter}."),
    }
}

fn cpus_word(n: f64) -> String {
    cpus(n)
}

/// The advice for a host-side verdict, the quota first when it held the loop.
pub fn host_side(
    kind: VerdictKind,
    w: &Workload,
    h: &HostSide,
    idle: f64,
    throttled: Option<f64>,
    cpus: &Cpus,
) -> String {
    let text = match kind {
        VerdictKind::HostTransfers => {
            let how = match pageable(w) {
                Some(true) => {
                    "; the copy calls themselves held the thread, so the host memory \
                               is pageable and the driver stages every byte"
                }
                Some(false) => {
                    "; the thread waited for the copies to finish, so they do not \
                                overlap with compute"
                }
                None => "",
            };
            let held = match (h.copy_share, h.pcie_bytes_per_second) {
                (Some(c), _) => format!("{} of the window{how}", pct(c)),
                (None, Some(b)) => format!("{:.1} GB/s across PCIe", b / 1e9),
                (None, None) => "PCIe traffic".to_owned(),
            };
            format!(
                "The training loop is held by copies between host and GPU ({held}) while the \
                 GPU's kernels idle {}: pin the host memory (DataLoader(pin_memory=True)) and \
                 copy with non_blocking=True one batch ahead so copies overlap compute, move \
                 fewer or larger transfers, or preprocess on the GPU.",
                pct(idle)
            )
        }
        VerdictKind::HostLaunches => format!(
            "The training loop launches kernels one by one{} and each is too small to keep the \
             GPU busy, which idles {}: capture the step in CUDA graphs \
             (torch.compile(mode=\"reduce-overhead\"), torch.cuda.graphs), fuse small \
             operations (torch.compile), or raise the batch size; a faster data loader will \
             not help.",
            h.launches_per_second.zip(h.host_us_per_launch).map_or_else(
                String::new,
                |(l, us)| format!(
                    " ({l:.0} a second, {us:.1} µs of its own work each, {} of the window)",
                    pct(h.own_cpu_share)
                )
            ),
            pct(idle)
        ),
        VerdictKind::HostSync => format!(
            "The training loop waits in CUDA synchronisations {} of the window, {} of it while \
             the GPU had nothing to run, which idles {}: it waits on something other than its \
             own GPU work (a host callback, another stream's event, another process). Remove \
             per-step synchronisations (torch.cuda.synchronize(), .item(), .cpu() of results) \
             or move what they wait for off the step.",
            pct(h.sync_share.unwrap_or(0.0)),
            pct(h.sync_idle_share.unwrap_or(0.0)),
            pct(idle)
        ),
        _ => {
            let threads = if h.other_threads_cores >= 0.5 {
                format!(
                    " (its other threads, a pool, a tokenizer or a decoder, kept {:.1} CPUs' \
                     worth busy or waiting)",
                    h.other_threads_cores
                )
            } else {
                String::new()
            };
            format!(
                "The training loop is busy on the CPU with its own work{threads} ({} of the \
                 window, not copying or waiting on the GPU) while the GPU idles {}: \
                 tokenising, preparing batches, Python in the step, data conversion, \
                 autotuning (cudnn.benchmark with changing shapes), logging. Move that work \
                 into DataLoader workers (separate processes, in parallel with the step), keep \
                 input shapes fixed, profile the step (py-spy, torch.profiler).",
                pct(h.own_cpu_share),
                pct(idle)
            )
        }
    };
    match throttled {
        Some(t) => format!("{} {text}", quota(t, cpus)),
        None => text,
    }
}

pub fn contention(c: &Contention) -> String {
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

/// Unknown: what was measured, and how much of the idle time it explains.
pub fn unknown(idle: f64, explained: f64, measured: &str) -> String {
    format!(
        "The GPU idles {} of the time, and the causes measured ({measured}) explain only {} of \
         that: the job may wait on something outside its processes (a network file system, a \
         lock, another job), or its work comes in bursts shorter than the window.",
        pct(idle),
        pct(explained)
    )
}
