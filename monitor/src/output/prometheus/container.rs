//! Per workload (containers, and any other cgroup holding a GPU): identity, its share of each
//! GPU it holds, CPU and memory, the verdict, and the container's own configuration. Labels
//! `container_id`, `container_name`, `image`, `compose_service`, `kind` (and `gpu`, `uuid` per
//! GPU).
use super::{bool_value, family, ratio_unit, with, Labels};
use crate::model::{AllocatedGpu, ShmUse, Snapshot, Workload, WorkloadGpuShare};
use crate::output::accounting::{Accounting, WorkloadTotals};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType::{self, Counter, Gauge};
use prometheus_client::registry::Unit;

fn labels(w: &Workload) -> Labels {
    let c = w.container.as_ref();
    vec![
        (
            "container_id",
            c.map_or_else(|| w.id.to_string(), |c| c.id.chars().take(12).collect()),
        ),
        ("container_name", w.name.clone()),
        ("image", c.map(|c| c.image.clone()).unwrap_or_default()),
        (
            "compose_service",
            c.and_then(|c| c.compose_service.clone())
                .unwrap_or_default(),
        ),
        ("kind", w.kind.as_str().to_owned()),
    ]
}

/// A figure of the workload: name, help, unit, type, how to read it (absent: no sample).
type WorkloadFigure = (
    &'static str,
    &'static str,
    Option<Unit>,
    MetricType,
    fn(&Workload) -> Option<f64>,
);

fn workload_figures() -> [WorkloadFigure; 10] {
    [
        (
            "gpuwatch_container_gpu_processes",
            "The container's processes holding a GPU context.",
            None,
            Gauge,
            |w| (w.gpu.processes > 0).then_some(w.gpu.processes as f64),
        ),
        (
            "gpuwatch_container_cpu_usage",
            "CPU time of the container's cgroup.",
            Some(Unit::Seconds),
            Counter,
            |w| Some(w.cpu?.usage_seconds_total),
        ),
        (
            "gpuwatch_container_cpu_throttled",
            "Share of the last window the CPU quota held the container back.",
            ratio_unit(),
            Gauge,
            |w| w.cpu?.throttled_fraction,
        ),
        (
            "gpuwatch_container_memory_usage",
            "Memory charged to the container's cgroup.",
            Some(Unit::Bytes),
            Gauge,
            |w| Some(w.memory?.usage_bytes as f64),
        ),
        (
            "gpuwatch_container_memory_limit",
            "The container's memory limit.",
            Some(Unit::Bytes),
            Gauge,
            |w| Some(w.memory?.limit_bytes? as f64),
        ),
        (
            "gpuwatch_container_gpu_idle",
            "Share of the last window the container's GPUs idled (from its verdict).",
            ratio_unit(),
            Gauge,
            |w| Some(w.verdict.as_ref()?.gpu_idle_fraction),
        ),
        (
            "gpuwatch_container_input_bound",
            "Share of the last window the GPU idled because of the data loader.",
            ratio_unit(),
            Gauge,
            |w| w.verdict.as_ref()?.input_bound_share,
        ),
        (
            "gpuwatch_container_host_bound",
            "Share of the last window the training loop spent on its host-side verdict's cause \
             (copying, synchronising while the GPU idled, its own CPU work or launches).",
            ratio_unit(),
            Gauge,
            |w| w.verdict.as_ref()?.host_bound_share,
        ),
        (
            "gpuwatch_container_oom_headroom_batch_scale",
            "How many times the batch can grow before the container's tightest GPU is full.",
            None,
            Gauge,
            |w| w.oom_headroom.as_ref()?.batch_scale,
        ),
        (
            "gpuwatch_container_loader_reads",
            "Read-family syscalls of the container's processes in the last window.",
            None,
            Gauge,
            |w| Some(w.stalls.as_ref()?.reads.count as f64),
        ),
    ]
}

/// A figure of the workload on one GPU: name, help, unit, how to read it.
type ShareFigure = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&WorkloadGpuShare) -> Option<f64>,
);

fn share_figures() -> [ShareFigure; 4] {
    [
        (
            "gpuwatch_container_gpu_memory",
            "GPU memory of the container's processes, per GPU.",
            Some(Unit::Bytes),
            |g| Some(g.memory_bytes as f64),
        ),
        (
            "gpuwatch_container_gpu_busy",
            "Share of the last window the container kept the GPU busy: the GPU's busy share, or \
             its part of it on a shared GPU (absent when that part is unknown).",
            ratio_unit(),
            |g| g.busy_fraction,
        ),
        (
            "gpuwatch_container_gpu_busy_estimated",
            "1 when the container shares the GPU and its busy share is estimated from host CPU \
             time or taken from the driver's per-process figures; 0 when it had the GPU alone.",
            None,
            |g| g.split.map(|m| bool_value(!m.is_exact())),
        ),
        (
            "gpuwatch_container_gpu_sm_activity",
            "GPM: of the SMs, the share busy while the container's kernels ran (on a GPU it held \
             alone).",
            ratio_unit(),
            |g| g.sm_activity_percent.map(|v| v / 100.0),
        ),
    ]
}

pub(super) fn encode(
    enc: &mut DescriptorEncoder<'_>,
    s: &Snapshot,
    accounting: &Accounting,
) -> Result<(), std::fmt::Error> {
    let ws: Vec<(&Workload, Labels)> = s.workloads.iter().map(|w| (w, labels(w))).collect();
    totals(enc, &ws, accounting)?;
    family(
        enc,
        "gpuwatch_container_info",
        "A container (or other workload) the agent sees.",
        None,
        Gauge,
        ws.iter()
            .map(|(w, l)| (with(l.clone(), &info_labels(w)), 1.0)),
    )?;
    for (name, help, unit, read) in share_figures() {
        let samples = ws.iter().flat_map(|(w, l)| {
            w.gpu
                .per_gpu
                .iter()
                .filter_map(move |g| Some((gpu_labels(l, g.index, g.uuid.as_deref()), read(g)?)))
        });
        family(enc, name, help, unit, Gauge, samples)?;
    }
    for (name, help, unit, kind, read) in workload_figures() {
        let samples = ws.iter().filter_map(|(w, l)| Some((l.clone(), read(w)?)));
        family(enc, name, help, unit, kind, samples)?;
    }
    let window = s.window_seconds.filter(|x| *x > 0.0).unwrap_or(1.0);
    let traced = |w: &Workload| w.cuda.as_ref().filter(|c| c.traced).map(|c| c.total);
    family(
        enc,
        "gpuwatch_container_cuda_kernel_launches_per_second",
        "Kernel launches of the container's GPU processes over the last window (while the CUDA \
         driver probes were attached for all of it).",
        None,
        Gauge,
        ws.iter()
            .filter_map(|(w, l)| Some((l.clone(), traced(w)?.launches as f64 / window))),
    )?;
    family(
        enc,
        "gpuwatch_container_cuda_copy_bytes_per_second",
        "Bytes the container's GPU processes copied between host and GPU in the last window \
         (direction: to_gpu, from_gpu; while the CUDA driver probes were attached).",
        None,
        Gauge,
        ws.iter().flat_map(|(w, l)| {
            traced(w).into_iter().flat_map(move |c| {
                [("to_gpu", c.h2d.bytes), ("from_gpu", c.d2h.bytes)].map(|(dir, bytes)| {
                    (
                        with(l.clone(), &[("direction", dir.to_owned())]),
                        bytes as f64 / window,
                    )
                })
            })
        }),
    )?;
    family(
        enc,
        "gpuwatch_container_verdict",
        "1 for the container's current verdict (input-bound: I/O, input-bound: CPU, input-bound: \
         memory, host-bound: transfers, host-bound: launches, host-bound: CPU, host-bound: sync, \
         contention, GPU-bound, low SM activity, idle, unknown).",
        None,
        Gauge,
        ws.iter().filter_map(|(w, l)| {
            let kind = w.verdict.as_ref()?.kind;
            Some((
                with(l.clone(), &[("verdict", kind.label().to_owned())]),
                1.0,
            ))
        }),
    )?;
    family(
        enc,
        "gpuwatch_container_straggler",
        "1 on the GPU of a distributed job's rank the others wait for, when its ranks spread \
         apart (by: sm_activity or busy). Each rank's figures are the container's per-GPU \
         series.",
        None,
        Gauge,
        ws.iter().filter_map(|(w, l)| {
            let s = w.straggler.as_ref()?;
            let by = match s.by {
                crate::model::StragglerBasis::SmActivity => "sm_activity",
                crate::model::StragglerBasis::Busy => "busy",
            };
            let extra = [("gpu", s.gpu.to_string()), ("by", by.to_owned())];
            Some((with(l.clone(), &extra), 1.0))
        }),
    )?;
    encode_config(enc, &ws)
}

/// `gpuwatch_container_info`'s own labels: the compose project and the Kubernetes pod.
fn info_labels(w: &Workload) -> [(&'static str, String); 3] {
    let c = w.container.as_ref();
    let pod = c.and_then(|c| c.kubernetes.as_ref());
    [
        (
            "compose_project",
            c.and_then(|c| c.compose_project.clone())
                .unwrap_or_default(),
        ),
        // Not `namespace` / `pod`: the Prometheus Operator gives every target those labels for
        // the agent's own pod.
        (
            "pod_namespace",
            pod.map(|p| p.namespace.clone()).unwrap_or_default(),
        ),
        ("pod_name", pod.map(|p| p.pod.clone()).unwrap_or_default()),
    ]
}

fn gpu_labels(l: &Labels, index: u32, uuid: Option<&str>) -> Labels {
    with(
        l.clone(),
        &[
            ("gpu", index.to_string()),
            ("uuid", uuid.unwrap_or_default().to_owned()),
        ],
    )
}

/// The container's configuration: `/dev/shm`, and the GPUs it was given.
fn encode_config(
    enc: &mut DescriptorEncoder<'_>,
    ws: &[(&Workload, Labels)],
) -> Result<(), std::fmt::Error> {
    let shm = |read: fn(&ShmUse) -> u64| {
        ws.iter().filter_map(move |(w, l)| {
            Some((l.clone(), read(w.config.as_ref()?.shm.as_ref()?) as f64))
        })
    };
    family(
        enc,
        "gpuwatch_container_shm_size",
        "Size of the container's /dev/shm.",
        Some(Unit::Bytes),
        Gauge,
        shm(|s| s.size_bytes),
    )?;
    family(
        enc,
        "gpuwatch_container_shm_used",
        "Bytes used in the container's /dev/shm.",
        Some(Unit::Bytes),
        Gauge,
        shm(|s| s.used_bytes),
    )?;
    let allocated = |read: fn(&AllocatedGpu) -> f64| {
        ws.iter()
            .filter_map(|(w, l)| Some((w.config.as_ref()?.gpus.as_ref()?, l)))
            .flat_map(move |(a, l)| {
                a.gpus
                    .iter()
                    .map(move |g| (gpu_labels(l, g.index, g.uuid.as_deref()), read(g)))
            })
    };
    family(
        enc,
        "gpuwatch_container_gpu_allocated",
        "1 per GPU given to the container (--gpus, --device /dev/nvidiaN, or \
         NVIDIA_VISIBLE_DEVICES under the NVIDIA runtime).",
        None,
        Gauge,
        allocated(|_| 1.0),
    )?;
    family(
        enc,
        "gpuwatch_container_gpu_allocated_idle",
        "1 when a GPU given to the container has none of its processes on it this round: sum \
         it over time for idle-held GPU-hours.",
        None,
        Gauge,
        allocated(|g| bool_value(!g.in_use)),
    )
}

/// The accounting counters: busy and idle GPU-seconds and joules, the loader's seconds by state.
fn totals(
    enc: &mut DescriptorEncoder<'_>,
    ws: &[(&Workload, Labels)],
    accounting: &Accounting,
) -> Result<(), std::fmt::Error> {
    let with_totals: Vec<(&WorkloadTotals, &Labels)> = ws
        .iter()
        .filter_map(|(w, l)| Some((accounting.workloads.get(&w.id)?, l)))
        .collect();
    family(
        enc,
        "gpuwatch_container_gpu_busy",
        "GPU-seconds the container kept its GPUs busy (summed over its GPUs) since the agent \
         started or the container appeared.",
        Some(Unit::Seconds),
        Counter,
        with_totals
            .iter()
            .filter(|(t, _)| t.gpu_busy_seconds > 0.0 || !t.gpu_idle_seconds.is_empty())
            .map(|(t, l)| ((*l).clone(), t.gpu_busy_seconds)),
    )?;
    family(
        enc,
        "gpuwatch_container_gpu_idle",
        "GPU-seconds the container held GPUs without keeping them busy, by the verdict of each \
         window: what the idle time was for.",
        Some(Unit::Seconds),
        Counter,
        with_totals.iter().flat_map(|(t, l)| {
            t.gpu_idle_seconds
                .iter()
                .map(|(k, v)| (with((*l).clone(), &[("verdict", k.label().to_owned())]), *v))
        }),
    )?;
    family(
        enc,
        "gpuwatch_container_gpu_busy_energy",
        "Joules of its GPUs' energy charged to the container's busy part of their time.",
        Some(Unit::Joules),
        Counter,
        with_totals
            .iter()
            .filter(|(t, _)| !t.energy_idle_joules.is_empty())
            .map(|(t, l)| ((*l).clone(), t.energy_busy_joules)),
    )?;
    family(
        enc,
        "gpuwatch_container_gpu_idle_energy",
        "Joules of its GPUs' energy while they idled, charged to the containers holding them \
         (equal parts), by the verdict of each window.",
        Some(Unit::Joules),
        Counter,
        with_totals.iter().flat_map(|(t, l)| {
            t.energy_idle_joules
                .iter()
                .map(|(k, v)| (with((*l).clone(), &[("verdict", k.label().to_owned())]), *v))
        }),
    )?;
    family(
        enc,
        "gpuwatch_container_loader",
        "Seconds the container's loader processes (its processes without a GPU context) were on \
         a CPU, waiting for one, or blocked on I/O (state: on_cpu, runq, blocked), from stall \
         tracing.",
        Some(Unit::Seconds),
        Counter,
        with_totals
            .iter()
            .filter(|(t, _)| {
                t.loader_on_cpu_seconds + t.loader_runq_seconds + t.loader_blocked_seconds > 0.0
            })
            .flat_map(|(t, l)| {
                [
                    ("on_cpu", t.loader_on_cpu_seconds),
                    ("runq", t.loader_runq_seconds),
                    ("blocked", t.loader_blocked_seconds),
                ]
                .map(|(state, v)| (with((*l).clone(), &[("state", state.to_owned())]), v))
            }),
    )
}
