//! The Prometheus exposition of a snapshot (OpenMetrics text, through prometheus-client).
//!
//! Every scrape renders the latest snapshot, so the series of a container that exited are gone
//! from the next scrape on: nothing to expire by hand, no unbounded growth. Names follow the
//! Prometheus conventions: a `gpuwatch_` prefix, base units (bytes, seconds, celsius, watts,
//! hertz, ratios 0–1), `_total` for counters, `_info` for metadata. Labels name containers
//! (`container_id`, `container_name`, `image`, `compose_service`, `kind`) and GPUs (`gpu`,
//! `uuid`); never PIDs, whose values are unbounded. `docs/metrics.md` lists every metric.
use crate::health::alerts::Alert;
use crate::model::{Snapshot, Workload};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What `serve` publishes after each round: everything a scrape or an API call reads.
#[derive(Debug)]
pub struct Exported {
    pub snapshot: Snapshot,
    /// Pending and firing alerts.
    pub alerts: Vec<Alert>,
    /// Xid errors per GPU index since the agent started.
    pub xid_totals: BTreeMap<u32, u64>,
}

/// Adds the round's Xid events to the per-GPU totals `Exported::xid_totals` carries.
pub fn count_xids(totals: &mut BTreeMap<u32, u64>, s: &Snapshot) {
    for g in &s.gpus {
        *totals.entry(g.device.index).or_default() += g.device.xid_events.len() as u64;
    }
}

/// Renders `e` in the OpenMetrics text format.
pub fn render(e: &Arc<Exported>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(e.clone())));
    let mut out = String::with_capacity(64 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
struct SnapshotCollector(Arc<Exported>);

type Labels = Vec<(&'static str, String)>;

/// A per-GPU gauge: name, help, unit, and how to read it from a device.
/// A per-GPU figure of the completed round, 0–1.
type GpuRatio = fn(&crate::model::Gpu) -> Option<f64>;

/// A percent as a ratio.
fn ratio(percent: Option<f64>) -> Option<f64> {
    percent.map(|p| p / 100.0)
}

type DeviceGauge = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&crate::model::DeviceReading) -> Option<f64>,
);

/// One family: a descriptor, then one sample per label set.
fn family<I>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    kind: MetricType,
    samples: I,
) -> Result<(), std::fmt::Error>
where
    I: IntoIterator<Item = (Labels, f64)>,
{
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, v) in samples {
        let sample = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(v).encode(sample)?,
            _ => ConstGauge::new(v).encode(sample)?,
        }
    }
    Ok(())
}

fn workload_labels(w: &Workload) -> Labels {
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

fn with(mut labels: Labels, extra: &[(&'static str, String)]) -> Labels {
    labels.extend(extra.iter().cloned());
    labels
}

/// The build, and the agent's own process as every exporter reports it.
fn encode_agent(enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    use super::process_metrics::{self, REVISION};
    use MetricType::{Counter, Gauge};
    family(
        enc,
        "gpuwatch_build_info",
        "1, labelled with the version and the revision gpuwatch was built from.",
        None,
        Gauge,
        [(
            vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("revision", REVISION.to_owned()),
            ],
            1.0,
        )],
    )?;
    let Some(p) = process_metrics::read() else {
        return Ok(());
    };
    let one = |v: f64| [(Labels::new(), v)];
    family(
        enc,
        "process_cpu",
        "User and system CPU time of the agent.",
        Some(Unit::Seconds),
        Counter,
        one(p.cpu_seconds_total),
    )?;
    family(
        enc,
        "process_resident_memory",
        "Resident memory of the agent.",
        Some(Unit::Bytes),
        Gauge,
        one(p.resident_memory_bytes),
    )?;
    family(
        enc,
        "process_start_time",
        "When the agent started, since the Unix epoch.",
        Some(Unit::Seconds),
        Gauge,
        one(p.start_time_seconds),
    )?;
    family(
        enc,
        "process_open_fds",
        "Open file descriptors of the agent.",
        None,
        Gauge,
        one(p.open_fds),
    )?;
    family(
        enc,
        "process_max_fds",
        "The agent's open-file limit.",
        None,
        Gauge,
        one(p.max_fds),
    )
}

impl SnapshotCollector {
    /// The container's configuration: `/dev/shm`, and the GPUs it was given.
    fn encode_container_config(
        &self,
        enc: &mut DescriptorEncoder,
        ws: &[(&Workload, Labels)],
    ) -> Result<(), std::fmt::Error> {
        use MetricType::Gauge;
        let shm = |f: fn(&crate::model::ShmUse) -> u64| {
            ws.iter().filter_map(move |(w, l)| {
                Some((l.clone(), f(w.config.as_ref()?.shm.as_ref()?) as f64))
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
        let allocated = |f: fn(&crate::model::AllocatedGpu) -> f64| {
            ws.iter()
                .filter_map(|(w, l)| Some((w.config.as_ref()?.gpus.as_ref()?, l)))
                .flat_map(move |(a, l)| {
                    a.gpus.iter().map(move |g| {
                        (
                            with(
                                l.clone(),
                                &[
                                    ("gpu", g.index.to_string()),
                                    ("uuid", g.uuid.clone().unwrap_or_default()),
                                ],
                            ),
                            f(g),
                        )
                    })
                })
                .collect::<Vec<_>>()
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
            "1 when a GPU given to the container has none of its processes on it this round: \
             sum it over time for idle-held GPU-hours.",
            None,
            Gauge,
            allocated(|g| if g.in_use { 0.0 } else { 1.0 }),
        )
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        let e = &self.0;
        let s = &e.snapshot;
        let bool_f = |b: bool| if b { 1.0 } else { 0.0 };

        // The agent itself.
        family(
            &mut enc,
            "gpuwatch_up",
            "Whether a source delivers (1) or is down or disabled (0).",
            None,
            Gauge,
            [
                ("nvml", &s.sources.nvml),
                ("docker", &s.sources.docker),
                ("ebpf", &s.sources.ebpf),
            ]
            .map(|(name, st)| (vec![("source", name.to_owned())], bool_f(st.up))),
        )?;
        encode_agent(&mut enc)?;
        family(
            &mut enc,
            "gpuwatch_collection_duration",
            "Wall time of the last sampling round.",
            Some(Unit::Seconds),
            Gauge,
            [(Labels::new(), s.collection_seconds)],
        )?;
        family(
            &mut enc,
            "gpuwatch_last_collection_timestamp",
            "When the last sampling round ended, as a Unix time.",
            Some(Unit::Seconds),
            Gauge,
            [(Labels::new(), s.taken_at_unix_ms as f64 / 1000.0)],
        )?;
        family(
            &mut enc,
            "gpuwatch_nvml_query_duration",
            "Wall time of the last round's NVML queries.",
            Some(Unit::Seconds),
            Gauge,
            s.nvml_query_seconds.map(|v| (Labels::new(), v)),
        )?;
        family(
            &mut enc,
            "gpuwatch_internal_events",
            "The agent's own failures, by name (docs/snapshot-schema.md lists them).",
            None,
            Counter,
            s.internal_events
                .iter()
                .map(|(name, n)| (vec![("event", (*name).to_owned())], *n as f64)),
        )?;

        // GPUs.
        let gpu = |d: &crate::model::DeviceReading| -> Labels {
            vec![
                ("gpu", d.index.to_string()),
                ("uuid", d.uuid.clone().unwrap_or_default()),
            ]
        };
        let devices: Vec<_> = s.gpus.iter().map(|g| &g.device).collect();
        family(
            &mut enc,
            "gpuwatch_gpu_info",
            "A GPU: its model and driver.",
            None,
            Gauge,
            devices.iter().map(|d| {
                (
                    with(
                        gpu(d),
                        &[
                            ("name", d.name.clone().unwrap_or_default()),
                            (
                                "driver_version",
                                s.host.nvml_driver_version.clone().unwrap_or_default(),
                            ),
                        ],
                    ),
                    1.0,
                )
            }),
        )?;
        family(
            &mut enc,
            "gpuwatch_gpu_lost",
            "1 when NVML reports the GPU lost (fallen off the bus).",
            None,
            Gauge,
            devices.iter().map(|d| (gpu(d), bool_f(d.lost))),
        )?;
        let gauges: [DeviceGauge; 9] = [
            (
                "gpuwatch_gpu_utilization",
                "Share of the last sample period the GPU ran a kernel (NVML utilization.gpu).",
                Some(Unit::Other("ratio".into())),
                |d| d.utilization_gpu_percent.map(|v| f64::from(v) / 100.0),
            ),
            (
                "gpuwatch_gpu_memory_utilization",
                "Share of the period device memory was read or written.",
                Some(Unit::Other("ratio".into())),
                |d| d.utilization_memory_percent.map(|v| f64::from(v) / 100.0),
            ),
            (
                "gpuwatch_gpu_memory_used",
                "Device memory in use.",
                Some(Unit::Bytes),
                |d| d.memory_used_bytes.map(|v| v as f64),
            ),
            (
                "gpuwatch_gpu_memory_total",
                "Device memory in all.",
                Some(Unit::Bytes),
                |d| d.memory_total_bytes.map(|v| v as f64),
            ),
            (
                "gpuwatch_gpu_temperature",
                "GPU die temperature.",
                Some(Unit::Celsius),
                |d| d.temperature_celsius.map(f64::from),
            ),
            (
                "gpuwatch_gpu_power",
                "Power draw.",
                Some(Unit::Other("watts".into())),
                |d| d.power_watts,
            ),
            (
                "gpuwatch_gpu_power_limit",
                "Enforced power limit.",
                Some(Unit::Other("watts".into())),
                |d| d.power_limit_watts,
            ),
            (
                "gpuwatch_gpu_sm_clock",
                "SM clock.",
                Some(Unit::Other("hertz".into())),
                |d| d.sm_clock_mhz.map(|v| f64::from(v) * 1e6),
            ),
            (
                "gpuwatch_gpu_ecc_uncorrected_volatile_errors",
                "Uncorrected ECC errors since the driver loaded (read every 30 rounds).",
                None,
                |d| d.ecc_uncorrected_volatile.map(|v| v as f64),
            ),
        ];
        for (name, help, unit, get) in gauges {
            family(
                &mut enc,
                name,
                help,
                unit,
                Gauge,
                devices.iter().filter_map(|d| Some((gpu(d), get(d)?))),
            )?;
        }
        let activity: [(&str, &str, GpuRatio); 5] = [
            (
                "gpuwatch_gpu_busy",
                "Share of the last window a kernel ran on the GPU: the driver's utilisation \
                 series over the window (the snapshot's busy.source says when it was another).",
                |g| g.busy.map(|b| b.fraction),
            ),
            (
                "gpuwatch_gpu_sm_activity",
                "GPM: share of the SMs busy, averaged over the span holding the last window.",
                |g| ratio(g.sm_activity.and_then(|a| a.sm_percent)),
            ),
            (
                "gpuwatch_gpu_sm_occupancy",
                "GPM: share of the warp slots occupied, averaged over the span.",
                |g| ratio(g.sm_activity.and_then(|a| a.sm_occupancy_percent)),
            ),
            (
                "gpuwatch_gpu_tensor_activity",
                "GPM: share of the time the tensor pipes worked, averaged over the span.",
                |g| ratio(g.sm_activity.and_then(|a| a.tensor_percent)),
            ),
            (
                "gpuwatch_gpu_dram_bandwidth",
                "GPM: share of the DRAM bandwidth used, averaged over the span.",
                |g| ratio(g.sm_activity.and_then(|a| a.dram_bandwidth_percent)),
            ),
        ];
        for (name, help, get) in activity {
            family(
                &mut enc,
                name,
                help,
                Some(Unit::Other("ratio".into())),
                Gauge,
                s.gpus
                    .iter()
                    .filter_map(|g| Some((gpu(&g.device), get(g)?))),
            )?;
        }
        family(
            &mut enc,
            "gpuwatch_gpu_persistence_mode",
            "1 when persistence mode is on.",
            None,
            Gauge,
            devices
                .iter()
                .filter_map(|d| Some((gpu(d), bool_f(d.persistence_mode?)))),
        )?;
        family(
            &mut enc,
            "gpuwatch_gpu_clocks_event_reason",
            "1 per active clocks-event (throttle) reason.",
            None,
            Gauge,
            devices.iter().flat_map(|d| {
                d.clocks_event_reasons
                    .iter()
                    .map(|r| (with(gpu(d), &[("reason", (*r).to_owned())]), 1.0))
            }),
        )?;
        family(
            &mut enc,
            "gpuwatch_gpu_xid_errors",
            "Xid errors the driver reported since the agent started.",
            None,
            Counter,
            devices.iter().map(|d| {
                (
                    gpu(d),
                    e.xid_totals.get(&d.index).copied().unwrap_or(0) as f64,
                )
            }),
        )?;
        family(
            &mut enc,
            "gpuwatch_gpu_processes",
            "Processes holding a context on the GPU.",
            None,
            Gauge,
            s.gpus
                .iter()
                .map(|g| (gpu(&g.device), g.processes.len() as f64)),
        )?;
        family(
            &mut enc,
            "gpuwatch_gpu_unattributed_memory",
            "GPU memory of processes in no known workload (vanished or unreadable PIDs).",
            Some(Unit::Bytes),
            Gauge,
            s.gpus.iter().map(|g| {
                let bytes: u64 = g
                    .processes
                    .iter()
                    .filter(|p| p.workload.is_none())
                    .filter_map(|p| p.reading.used_memory_bytes)
                    .sum();
                (gpu(&g.device), bytes as f64)
            }),
        )?;

        // Workloads (containers, and any other cgroup holding a GPU).
        let ws: Vec<(&Workload, Labels)> = s
            .workloads
            .iter()
            .map(|w| (w, workload_labels(w)))
            .collect();
        family(
            &mut enc,
            "gpuwatch_container_info",
            "A container (or other workload) the agent sees.",
            None,
            Gauge,
            ws.iter().map(|(w, l)| {
                let c = w.container.as_ref();
                let pod = c.and_then(|c| c.kubernetes.as_ref());
                (
                    with(
                        l.clone(),
                        &[
                            (
                                "compose_project",
                                c.and_then(|c| c.compose_project.clone())
                                    .unwrap_or_default(),
                            ),
                            // Not `namespace` / `pod`: the Prometheus Operator gives every
                            // target those labels for the agent's own pod.
                            (
                                "pod_namespace",
                                pod.map(|p| p.namespace.clone()).unwrap_or_default(),
                            ),
                            ("pod_name", pod.map(|p| p.pod.clone()).unwrap_or_default()),
                        ],
                    ),
                    1.0,
                )
            }),
        )?;
        let per_gpu = |f: fn(&crate::model::WorkloadGpuShare) -> Option<f64>| {
            ws.iter()
                .flat_map(move |(w, l)| {
                    w.gpu.per_gpu.iter().filter_map(move |g| {
                        Some((
                            with(
                                l.clone(),
                                &[
                                    ("gpu", g.index.to_string()),
                                    ("uuid", g.uuid.clone().unwrap_or_default()),
                                ],
                            ),
                            f(g)?,
                        ))
                    })
                })
                .collect::<Vec<_>>()
        };
        family(
            &mut enc,
            "gpuwatch_container_gpu_memory",
            "GPU memory of the container's processes, per GPU.",
            Some(Unit::Bytes),
            Gauge,
            per_gpu(|g| Some(g.memory_bytes as f64)),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_gpu_busy",
            "Share of the last window the container kept the GPU busy: the GPU's busy share, or \
             its part of it on a shared GPU (absent when that part is unknown).",
            Some(Unit::Other("ratio".into())),
            Gauge,
            per_gpu(|g| g.busy_fraction),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_gpu_busy_estimated",
            "1 when the container shares the GPU and its busy share is estimated from host CPU \
             time or taken from the driver's per-process figures; 0 when it had the GPU alone.",
            None,
            Gauge,
            per_gpu(|g| g.split.map(|m| if m.is_exact() { 0.0 } else { 1.0 })),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_gpu_sm_activity",
            "GPM: of the SMs, the share busy while the container's kernels ran (on a GPU it held \
             alone).",
            Some(Unit::Other("ratio".into())),
            Gauge,
            per_gpu(|g| g.sm_activity_percent.map(|v| v / 100.0)),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_gpu_processes",
            "The container's processes holding a GPU context.",
            None,
            Gauge,
            ws.iter()
                .filter(|(w, _)| w.gpu.processes > 0)
                .map(|(w, l)| (l.clone(), w.gpu.processes as f64)),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_cpu_usage",
            "CPU time of the container's cgroup.",
            Some(Unit::Seconds),
            Counter,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.cpu?.usage_seconds_total))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_cpu_throttled",
            "Share of the last window the CPU quota held the container back.",
            Some(Unit::Other("ratio".into())),
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.cpu?.throttled_fraction?))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_memory_usage",
            "Memory charged to the container's cgroup.",
            Some(Unit::Bytes),
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.memory?.usage_bytes as f64))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_memory_limit",
            "The container's memory limit.",
            Some(Unit::Bytes),
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.memory?.limit_bytes? as f64))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_gpu_idle",
            "Share of the last window the container's GPUs idled (from its verdict).",
            Some(Unit::Other("ratio".into())),
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.verdict.as_ref()?.gpu_idle_fraction))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_input_bound",
            "Share of the last window the GPU idled because of the data loader.",
            Some(Unit::Other("ratio".into())),
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.verdict.as_ref()?.input_bound_share?))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_verdict",
            "1 for the container's current verdict (input-bound: I/O, input-bound: CPU, \
             GPU-bound, idle, unknown).",
            None,
            Gauge,
            ws.iter().filter_map(|(w, l)| {
                let v = w.verdict.as_ref()?;
                Some((
                    with(l.clone(), &[("verdict", v.kind.label().to_owned())]),
                    1.0,
                ))
            }),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_oom_headroom_batch_scale",
            "How many times the batch can grow before the container's tightest GPU is full.",
            None,
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.oom_headroom.as_ref()?.batch_scale?))),
        )?;
        family(
            &mut enc,
            "gpuwatch_container_loader_reads",
            "Read-family syscalls of the container's processes in the last window.",
            None,
            Gauge,
            ws.iter()
                .filter_map(|(w, l)| Some((l.clone(), w.stalls.as_ref()?.reads.count as f64))),
        )?;
        self.encode_container_config(&mut enc, &ws)?;

        // Alerts, as Prometheus's own ALERTS series: one per pending or firing alert.
        family(
            &mut enc,
            "gpuwatch_alert",
            "1 per pending or firing alert of the agent's rules.",
            None,
            Gauge,
            e.alerts.iter().map(|a| {
                let mut l: Labels = vec![
                    ("rule", a.rule.to_owned()),
                    ("severity", a.severity.as_str().to_owned()),
                    ("state", a.state.as_str().to_owned()),
                ];
                if let Some(g) = &a.subject.gpu {
                    l.push(("gpu", g.index.to_string()));
                }
                if let Some(c) = &a.subject.container {
                    l.push(("container_name", c.name.clone()));
                }
                (l, 1.0)
            }),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
    use crate::model::WorkloadGpuShare;

    /// A container with every part the encoder reads: 8 GPUs, CPU and memory, stall windows,
    /// a verdict, a Kubernetes pod.
    fn full_container(i: usize, gpus: u32) -> crate::model::Workload {
        use crate::model::{
            CpuUsage, IoSummary, KubernetesPod, MemoryUsage, StallWindow, Verdict, VerdictKind,
        };
        let mut w = container(&format!("train-{i:04}"));
        let mut info = (**w.container.as_ref().unwrap()).clone();
        info.kubernetes = Some(KubernetesPod {
            namespace: "ml".into(),
            pod: format!("train-{i}"),
            container: Some("trainer".into()),
            uid: None,
        });
        w.container = Some(Arc::new(info));
        w.gpu.processes = gpus as usize;
        w.gpu.busy_fraction = Some(0.8);
        w.gpu.per_gpu = (0..gpus)
            .map(|g| WorkloadGpuShare {
                memory_bytes: 1 << 30,
                busy_fraction: Some(0.8),
                split: Some(crate::model::SplitMethod::SoleHolder),
                device_busy_fraction: Some(0.8),
                sm_activity_percent: Some(90.0),
                pids: vec![1000 + g],
                ..WorkloadGpuShare::new(g, Some(format!("GPU-{g:08}")))
            })
            .collect();
        w.cpu = Some(CpuUsage {
            usage_seconds_total: 10.0,
            cores: Some(2.0),
            limit_cores: Some(4.0),
            throttled_seconds_total: Some(1.0),
            throttled_fraction: Some(0.1),
        });
        w.memory = Some(MemoryUsage {
            usage_bytes: 1 << 30,
            limit_bytes: Some(4 << 30),
            page_cache_bytes: Some(1 << 20),
        });
        let io = IoSummary {
            count: 10,
            bytes: 1 << 20,
            mean_latency_ms: Some(1.0),
            ..Default::default()
        };
        w.stalls = Some(StallWindow {
            cgroup_id: 1,
            processes: Vec::new(),
            reads: io,
            disk: io,
            io_traced: true,
        });
        w.verdict = Some(Verdict {
            kind: VerdictKind::InputBoundIo,
            gpu_busy_fraction: 0.2,
            gpu_idle_fraction: 0.8,
            input_bound_share: Some(0.7),
            trainer_wait_fraction: Some(0.7),
            sm_activity_fraction: Some(0.9),
            loader: None,
            cpu_throttled_fraction: Some(0.1),
            evidence: Vec::new(),
            advice: String::new(),
        });
        w
    }

    /// The cardinality budget (docs/metrics.md): at 1,000 containers on 8 GPUs, no series
    /// carries more than 15 labels (Mimir's default cap is 30), and a container costs at most
    /// 12 series plus 4 per GPU it holds (10 and 4 today).
    #[test]
    fn a_thousand_containers_stay_within_the_cardinality_budget() {
        const CONTAINERS: usize = 1_000;
        const GPUS: u32 = 8;
        let workloads = (0..CONTAINERS).map(|i| full_container(i, GPUS)).collect();
        let e = Arc::new(Exported {
            snapshot: snapshot(1_700_000_000_000, (0..GPUS).map(gpu).collect(), workloads),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
        });
        let text = render(&e).expect("render");
        let mut per_container: std::collections::HashMap<&str, usize> = Default::default();
        let mut most_labels = 0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let labels = line
                .split_once('{')
                .map_or("", |(_, rest)| rest.rsplit_once('}').map_or("", |(l, _)| l));
            // Label values here hold no `",`: a label ends at each `",`.
            let count = if labels.is_empty() {
                0
            } else {
                labels.matches("\",").count() + 1
            };
            most_labels = most_labels.max(count);
            if let Some(at) = labels.find("container_name=\"") {
                let name = &labels[at + 16..];
                let name = &name[..name.find('"').unwrap()];
                *per_container.entry(name).or_default() += 1;
            }
        }
        assert_eq!(per_container.len(), CONTAINERS);
        let worst = per_container.values().copied().max().unwrap();
        let budget = 12 + 4 * GPUS as usize;
        assert!(
            worst <= budget,
            "{worst} series for one container, budget {budget}"
        );
        assert!(most_labels <= 15, "a series with {most_labels} labels");
        eprintln!("worst container: {worst} series; most labels on a series: {most_labels}");
    }

    #[test]
    fn renders_conventional_names_units_and_labels() {
        let mut w = container("yolo");
        w.gpu.processes = 1;
        w.gpu.per_gpu.push(WorkloadGpuShare {
            memory_bytes: 3 << 30,
            busy_fraction: Some(0.8),
            split: Some(crate::model::SplitMethod::SoleHolder),
            device_busy_fraction: Some(0.8),
            sm_activity_percent: Some(90.0),
            pids: vec![42],
            ..WorkloadGpuShare::new(0, Some("GPU-00000000".into()))
        });
        let e = Arc::new(Exported {
            snapshot: snapshot(1_700_000_000_000, vec![gpu(0)], vec![w]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::from([(0, 2)]),
        });
        let text = render(&e).expect("render");
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_owned()
        };
        assert!(text.contains("# UNIT gpuwatch_gpu_memory_used_bytes bytes"));
        assert!(line("gpuwatch_gpu_memory_used_bytes{").ends_with(" 10737418240.0"));
        assert!(line("gpuwatch_gpu_utilization_ratio{").ends_with(" 0.5"));
        assert!(line("gpuwatch_gpu_xid_errors_total{").ends_with(" 2.0"));
        let mem = line("gpuwatch_container_gpu_memory_bytes{");
        for label in [
            "container_name=\"yolo\"",
            "image=\"trainer:latest\"",
            "compose_service=\"train\"",
            "gpu=\"0\"",
            "uuid=\"GPU-00000000\"",
        ] {
            assert!(mem.contains(label), "{label} in {mem}");
        }
        assert!(!text.contains("pid="), "no PID labels");
        assert!(line("gpuwatch_up{source=\"nvml\"}").ends_with(" 1.0"));
        let build = line("gpuwatch_build_info{");
        assert!(
            build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
                && build.contains("revision=\""),
            "{build}"
        );
        let rss: f64 = line("process_resident_memory_bytes ")
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1e6, "{rss}");
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"));
    }

    /// Every `gpuwatch_*` name the shipped Prometheus rules and Grafana dashboard use is one this
    /// exporter writes, and docs/metrics.md lists every one it writes.
    #[test]
    fn deploy_and_docs_match_the_exported_metrics() {
        let e = Arc::new(Exported {
            snapshot: snapshot(0, vec![], vec![]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
        });
        let text = render(&e).expect("render");
        let mut exported = std::collections::BTreeSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
                exported.insert(if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                });
            }
        }
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"),
        )
        .expect("docs/metrics.md");
        for name in &exported {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "docs/metrics.md does not list {name}"
            );
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        for file in [
            "prometheus/gpuwatch-rules.yml",
            "grafana/gpuwatch-dashboard.json",
        ] {
            let body = std::fs::read_to_string(root.join(file)).expect(file);
            if file.ends_with(".json") {
                serde_json::from_str::<serde_json::Value>(&body).expect("valid JSON");
            }
            let mut used = 0;
            for (i, _) in body.match_indices("gpuwatch_") {
                let name: String = body[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name.ends_with('_') {
                    continue; // prose, e.g. "gpuwatch_ prefix"
                }
                used += 1;
                assert!(exported.contains(&name), "{file} uses {name}, not exported");
            }
            assert!(used > 5, "{file} references the metrics");
        }
    }
}
