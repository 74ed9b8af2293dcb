//! What a recording says, summarised per container (over its span in the recording), per GPU
//! and for the host: GPU-hours held, busy and idle by cause, energy and its cost, memory,
//! verdicts, alerts, the OOM headroom, and the findings worth acting on first. `report` renders
//! it, `plot` draws its stacked bars, `compare` sets two of them side by side.
use super::{AlertRow, Recording, WorkloadSeries};
use crate::health::alerts::AlertState;
use crate::units::rfc3339;
use serde::Serialize;
use std::collections::BTreeMap;

const JOULES_PER_KWH: f64 = 3.6e6;

/// The config file's `prices:`: what a GPU-hour held and a kWh cost, for the report's money
/// figures (none without them).
#[derive(Clone, Debug, Default, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    /// Per GPU-hour held (a cloud or internal rate).
    pub per_gpu_hour: Option<f64>,
    /// Per kWh of the GPUs' energy.
    pub per_kwh: Option<f64>,
    /// Shown beside each figure (e.g. `USD`, `EUR`, `CNY`).
    pub currency: String,
}

impl Prices {
    pub fn validate(&self) -> Result<(), crate::field_error::FieldError> {
        for (field, v) in [
            ("per_gpu_hour", self.per_gpu_hour),
            ("per_kwh", self.per_kwh),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(crate::field_error::FieldError::new(
                    field,
                    "must be a number, 0 or more",
                ));
            }
        }
        Ok(())
    }

    fn any(&self) -> bool {
        self.per_gpu_hour.is_some() || self.per_kwh.is_some()
    }

    /// The money of `gpu_hours` held and `kwh` used.
    fn of(&self, gpu_hours: f64, kwh: Option<f64>) -> f64 {
        self.per_gpu_hour.unwrap_or(0.0) * gpu_hours
            + self.per_kwh.unwrap_or(0.0) * kwh.unwrap_or(0.0)
    }
}

/// A container's GPU time and energy in money, at the config's prices.
#[derive(Debug, Serialize)]
pub struct Cost {
    pub currency: String,
    /// Its GPU-hours held and its part of their energy.
    pub held: f64,
    /// The GPU-hours it held idle and the energy of that idle time: what the waste cost.
    pub idle: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub recording: String,
    pub started_at: String,
    pub ended_at: String,
    pub duration_seconds: f64,
    pub gpus: Vec<GpuSummary>,
    pub containers: Vec<ContainerSummary>,
    /// The containers that held GPUs idle, worst first.
    pub findings: Vec<Finding>,
    /// The prices' currency (empty without prices).
    pub currency: String,
    /// The containers on GPUs together: the host's totals.
    pub host: HostTotals,
}

/// Every container's GPU-hours, idle GPU-hours by cause, energy and cost, summed.
#[derive(Debug, Default, Serialize)]
pub struct HostTotals {
    pub gpu_hours: f64,
    pub busy_gpu_hours: f64,
    pub idle_gpu_hours: BTreeMap<String, f64>,
    /// `None` when no container has energy (a recording before it).
    pub energy_kwh: Option<f64>,
    pub idle_energy_kwh: BTreeMap<String, f64>,
    /// At the config's prices: held, and of it idle.
    pub cost: Option<Cost>,
}

impl HostTotals {
    fn of(containers: &[ContainerSummary]) -> Self {
        let mut t = Self::default();
        for c in containers {
            t.gpu_hours += c.gpu_hours;
            t.busy_gpu_hours += c.busy_gpu_hours;
            for (k, h) in &c.idle_gpu_hours {
                *t.idle_gpu_hours.entry(k.clone()).or_default() += h;
            }
            if let Some(e) = c.energy_kwh {
                *t.energy_kwh.get_or_insert(0.0) += e;
            }
            for (k, e) in &c.idle_energy_kwh {
                *t.idle_energy_kwh.entry(k.clone()).or_default() += e;
            }
            if let Some(k) = &c.cost {
                let sum = t.cost.get_or_insert(Cost {
                    currency: k.currency.clone(),
                    held: 0.0,
                    idle: 0.0,
                });
                sum.held += k.held;
                sum.idle += k.idle;
            }
        }
        t
    }
}

#[derive(Debug, Serialize)]
pub struct GpuSummary {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Mean busy share (percent) from the utilisation series.
    pub mean_utilization_percent: Option<f64>,
    /// Mean SM activity (GPM, percent).
    pub mean_sm_activity_percent: Option<f64>,
    /// Mean PCIe traffic, host to device and device to host (bytes/s).
    pub mean_pcie_rx_bytes_per_second: Option<f64>,
    pub mean_pcie_tx_bytes_per_second: Option<f64>,
    pub mean_temperature_celsius: Option<f64>,
    pub peak_temperature_celsius: Option<f64>,
    pub peak_memory_percent: Option<f64>,
    /// Its energy over the recording (kWh), from recordings that have it.
    pub energy_kwh: Option<f64>,
    /// Alert transitions about this GPU (naming it, with or without a container), by rule.
    pub alerts: BTreeMap<String, AlertCount>,
}

#[derive(Debug, Default, Serialize)]
pub struct AlertCount {
    pub fired: u32,
    pub resolved: u32,
}

#[derive(Debug, Serialize)]
pub struct ContainerSummary {
    pub workload_id: String,
    pub name: String,
    pub image: String,
    pub compose_service: String,
    /// `namespace/pod`; empty unless a Kubernetes pod's.
    pub pod: String,
    pub first_seen: String,
    pub last_seen: String,
    pub duration_seconds: f64,
    pub samples: usize,
    /// Σ over the span of (time × GPUs held).
    pub gpu_hours: f64,
    pub gpus: Vec<u32>,
    pub mean_gpu_memory_bytes: f64,
    pub peak_gpu_memory_bytes: f64,
    /// GPU busy share over samples: mean and percentiles (0–1).
    pub gpu_busy: Option<Distribution>,
    /// Share of the span in each GPU-busy band: 0–20 %, 20–40 %, ... 80–100 %.
    pub gpu_busy_histogram: [f64; 5],
    /// Share of samples per verdict.
    pub verdicts: BTreeMap<String, f64>,
    /// The most frequent verdict, if any.
    pub main_verdict: Option<String>,
    /// Mean share of the window the trainer waited for batches while the GPU idled.
    pub mean_input_bound_share: Option<f64>,
    /// Mean share of the SMs busy while its kernels ran (percent; GPM).
    pub mean_sm_activity_percent: Option<f64>,
    pub mean_cpu_cores: Option<f64>,
    pub peak_memory_bytes: Option<f64>,
    /// The smallest batch scale factor seen (the tightest moment).
    pub min_oom_batch_scale: Option<f64>,
    /// A distributed job's straggler: the GPU whose rank the others waited for most often, and
    /// in what share of the samples.
    pub straggler: Option<StragglerShare>,
    pub alerts: BTreeMap<String, AlertCount>,
    /// GPU-hours its GPUs were busy with its work, and GPU-hours it held them idle by the
    /// verdict of each sample (samples whose busy share is unknown are in neither).
    pub busy_gpu_hours: f64,
    pub idle_gpu_hours: BTreeMap<String, f64>,
    /// Its part of its GPUs' energy (kWh): its busy part of their time and an equal part of
    /// their idle time among those holding them; and of that, the idle part by verdict.
    /// `None` in recordings without energy.
    pub energy_kwh: Option<f64>,
    pub idle_energy_kwh: BTreeMap<String, f64>,
    /// At the config's `prices`, when it has any.
    pub cost: Option<Cost>,
    /// What removing its main verdict's bottleneck would buy, from the time-weighted mean busy
    /// and cause shares of that verdict's samples (`analysis::verdict::speedup::estimate`); none for a
    /// verdict that names no bottleneck or without the shares (contention's is not recorded).
    pub speedup: Option<crate::model::Speedup>,
    /// The advice of its main verdict, the last the recording wrote for it.
    pub advice: Option<String>,
    /// The last advice the recording wrote for each of its verdicts.
    #[serde(skip)]
    pub advice_by_verdict: BTreeMap<String, String>,
}

/// A container that held GPUs idle, worst first: where the report starts.
#[derive(Debug, Serialize)]
pub struct Finding {
    pub name: String,
    pub idle_gpu_hours: f64,
    pub held_gpu_hours: f64,
    /// The verdict under which it idled most, and the GPU-hours it idled under it.
    pub cause: String,
    pub cause_gpu_hours: f64,
    /// What its idle time cost at the config's prices.
    pub idle_cost: Option<f64>,
    pub advice: Option<String>,
}

/// Containers whose idle GPU-hours are at least this share of those they held make a finding.
const FINDING_IDLE_SHARE: f64 = 0.2;

/// The findings of `containers`: each that held its GPUs idle at least [`FINDING_IDLE_SHARE`]
/// of the time, the most idle GPU-hours first.
fn findings(containers: &[ContainerSummary]) -> Vec<Finding> {
    let mut out: Vec<Finding> = containers
        .iter()
        .filter_map(|c| {
            let idle: f64 = c.idle_gpu_hours.values().sum();
            let held = idle + c.busy_gpu_hours;
            if held <= 0.0 || idle < held * FINDING_IDLE_SHARE {
                return None;
            }
            let (cause, hours) = c.idle_gpu_hours.iter().max_by(|a, b| a.1.total_cmp(b.1))?;
            Some(Finding {
                name: c.name.clone(),
                idle_gpu_hours: idle,
                held_gpu_hours: held,
                cause: cause.clone(),
                cause_gpu_hours: *hours,
                idle_cost: c.cost.as_ref().map(|k| k.idle),
                advice: c.advice_by_verdict.get(cause).cloned(),
            })
        })
        .collect();
    out.sort_by(|a, b| b.idle_gpu_hours.total_cmp(&a.idle_gpu_hours));
    out
}

#[derive(Debug, PartialEq, Serialize)]
pub struct StragglerShare {
    pub gpu: u32,
    pub share_of_samples: f64,
}

/// The GPU named straggler in most samples, if any was.
pub(crate) fn straggler(s: &[crate::recording::WorkloadSample]) -> Option<StragglerShare> {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for g in s.iter().filter_map(|x| x.straggler_gpu) {
        *counts.entry(g).or_default() += 1;
    }
    let (gpu, n) = counts
        .into_iter()
        .max_by_key(|(g, n)| (*n, std::cmp::Reverse(*g)))?;
    Some(StragglerShare {
        gpu,
        share_of_samples: n as f64 / s.len() as f64,
    })
}

#[derive(Debug, Serialize)]
pub struct Distribution {
    pub mean: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

fn distribution(mut v: Vec<f64>) -> Option<Distribution> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    Some(Distribution {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p10: q(0.1),
        p50: q(0.5),
        p90: q(0.9),
        max: v[v.len() - 1],
    })
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| sum / n as f64)
}

fn count_alerts<'a>(rows: impl Iterator<Item = &'a AlertRow>) -> BTreeMap<String, AlertCount> {
    let mut m: BTreeMap<String, AlertCount> = BTreeMap::new();
    for a in rows {
        let c = m.entry(a.rule.clone()).or_default();
        match a.state {
            AlertState::Firing => c.fired += 1,
            AlertState::Resolved => c.resolved += 1,
            AlertState::Pending => {}
        }
    }
    m
}

/// Summarises `rec`; `name` is how the report names the recording, `prices` what turns its
/// GPU-hours and energy into money.
pub fn summarise(rec: &Recording, name: &str, prices: &Prices) -> Report {
    let gpus = rec
        .gpus
        .iter()
        .map(|(&index, g)| GpuSummary {
            index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            mean_utilization_percent: mean(g.samples.iter().filter_map(|s| s.utilization_percent)),
            mean_sm_activity_percent: mean(g.samples.iter().filter_map(|s| s.sm_activity_percent)),
            mean_pcie_rx_bytes_per_second: mean(
                g.samples.iter().filter_map(|s| s.pcie_rx_bytes_per_second),
            ),
            mean_pcie_tx_bytes_per_second: mean(
                g.samples.iter().filter_map(|s| s.pcie_tx_bytes_per_second),
            ),
            mean_temperature_celsius: mean(g.samples.iter().filter_map(|s| s.temperature_celsius)),
            peak_temperature_celsius: g
                .samples
                .iter()
                .filter_map(|s| s.temperature_celsius)
                .reduce(f64::max),
            peak_memory_percent: g
                .samples
                .iter()
                .filter_map(|s| s.memory_percent())
                .reduce(f64::max),
            energy_kwh: kwh(g.samples.iter().map(|s| s.energy_joules)),
            alerts: count_alerts(rec.alerts.iter().filter(|a| a.gpu == Some(index))),
        })
        .collect();
    let containers: Vec<ContainerSummary> = rec
        .workloads
        .values()
        .filter(|w| w.samples.iter().any(|s| !s.gpus.is_empty()))
        .map(|w| container(rec, w, prices))
        .collect();
    Report {
        findings: findings(&containers),
        currency: prices.currency.clone(),
        host: HostTotals::of(&containers),
        recording: name.to_owned(),
        started_at: rfc3339(rec.first_ms),
        ended_at: rfc3339(rec.last_ms),
        duration_seconds: rec.last_ms.saturating_sub(rec.first_ms) as f64 / 1000.0,
        gpus,
        containers,
    }
}

/// The sum of the joules given, in kWh; `None` when none is given (a recording before energy).
fn kwh(joules: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    joules
        .flatten()
        .fold(None, |sum: Option<f64>, j| Some(sum.unwrap_or(0.0) + j))
        .map(|j| j / JOULES_PER_KWH)
}

fn container(rec: &Recording, w: &WorkloadSeries, prices: &Prices) -> ContainerSummary {
    let s = &w.samples;
    let first = s.first().map_or(0, |x| x.unix_ms);
    let last = s.last().map_or(0, |x| x.unix_ms);
    // Each sample stands for the time until the next one (the last for the median interval).
    let mut gaps: Vec<f64> = s
        .windows(2)
        .map(|p| p[1].unix_ms.saturating_sub(p[0].unix_ms) as f64 / 1000.0)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let typical = gaps.get(gaps.len() / 2).copied().unwrap_or(1.0);
    let dt = |i: usize| {
        s.get(i + 1).map_or(typical, |n| {
            n.unix_ms.saturating_sub(s[i].unix_ms) as f64 / 1000.0
        })
    };
    let gpu_hours = (0..s.len())
        .map(|i| dt(i) * s[i].gpus.len() as f64)
        .sum::<f64>()
        / 3600.0;
    let busy: Vec<(f64, f64)> = (0..s.len())
        .filter_map(|i| Some((s[i].gpu_busy_fraction?, dt(i))))
        .collect();
    let mut histogram = [0.0; 5];
    let total: f64 = busy.iter().map(|b| b.1).sum();
    if total > 0.0 {
        for (b, d) in &busy {
            histogram[((b * 5.0) as usize).min(4)] += d / total;
        }
    }
    let mut verdicts: BTreeMap<String, f64> = BTreeMap::new();
    let judged = s.iter().filter(|x| x.verdict.is_some()).count();
    for v in s.iter().filter_map(|x| x.verdict) {
        *verdicts.entry(v.label().to_owned()).or_default() += 1.0 / judged as f64;
    }
    let main_verdict = verdicts
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(k, _)| k.clone());
    let (busy_gpu_hours, idle_gpu_hours) = by_cause(s, &dt);
    let energy_kwh = kwh(s.iter().map(|x| x.energy_joules));
    let mut idle_energy_kwh: BTreeMap<String, f64> = BTreeMap::new();
    for x in s {
        if let Some(j) = x.idle_energy_joules.filter(|j| *j > 0.0) {
            let cause = x.verdict.map_or("unknown", |v| v.label()).to_owned();
            *idle_energy_kwh.entry(cause).or_default() += j / JOULES_PER_KWH;
        }
    }
    let speedup = run_speedup(s, &dt, main_verdict.as_deref());
    let cost = prices.any().then(|| Cost {
        currency: prices.currency.clone(),
        held: prices.of(gpu_hours, energy_kwh),
        idle: prices.of(
            idle_gpu_hours.values().sum(),
            energy_kwh.map(|_| idle_energy_kwh.values().sum()),
        ),
    });
    // The last advice written for each verdict; the main verdict's is the container's.
    let mut advice_by_verdict: BTreeMap<String, String> = BTreeMap::new();
    for x in s {
        if let (Some(v), Some(a)) = (x.verdict, &x.advice) {
            advice_by_verdict.insert(v.label().to_owned(), a.clone());
        }
    }
    let advice = main_verdict
        .as_ref()
        .and_then(|v| advice_by_verdict.get(v).cloned());
    let mut gpus: Vec<u32> = s.iter().flat_map(|x| x.gpus.iter().copied()).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let alerts = count_alerts(rec.alerts.iter().filter(|a| {
        a.workload_id.as_deref() == Some(w.id.as_str())
            || (a.workload_id.is_none() && a.gpu.is_some_and(|g| gpus.contains(&g)))
    }));
    ContainerSummary {
        workload_id: w.id.clone(),
        name: w.name.clone(),
        image: w.image.clone(),
        compose_service: w.compose_service.clone(),
        pod: w.pod.clone(),
        first_seen: rfc3339(first),
        last_seen: rfc3339(last),
        duration_seconds: last.saturating_sub(first) as f64 / 1000.0,
        samples: s.len(),
        gpu_hours,
        gpus,
        mean_gpu_memory_bytes: mean(s.iter().map(|x| x.gpu_memory_bytes)).unwrap_or(0.0),
        peak_gpu_memory_bytes: s.iter().map(|x| x.gpu_memory_bytes).fold(0.0, f64::max),
        gpu_busy: distribution(busy.iter().map(|b| b.0).collect()),
        gpu_busy_histogram: histogram,
        verdicts,
        main_verdict,
        mean_input_bound_share: mean(s.iter().filter_map(|x| x.input_bound_share)),
        mean_sm_activity_percent: mean(s.iter().filter_map(|x| x.sm_activity_percent)),
        mean_cpu_cores: mean(s.iter().filter_map(|x| x.cpu_cores)),
        peak_memory_bytes: s.iter().filter_map(|x| x.memory_bytes).reduce(f64::max),
        min_oom_batch_scale: s.iter().filter_map(|x| x.oom_batch_scale).reduce(f64::min),
        straggler: straggler(s),
        alerts,
        busy_gpu_hours,
        idle_gpu_hours,
        energy_kwh,
        idle_energy_kwh,
        cost,
        speedup,
        advice,
        advice_by_verdict,
    }
}

/// The speed-up over the samples of the verdict labelled `main`: their time-weighted mean busy
/// share and cause share.
fn run_speedup(
    s: &[crate::recording::WorkloadSample],
    dt: &dyn Fn(usize) -> f64,
    main: Option<&str>,
) -> Option<crate::model::Speedup> {
    let kind: crate::model::VerdictKind = main?.parse().ok()?;
    let (mut time, mut busy, mut share) = (0.0, 0.0, 0.0);
    for (i, x) in s
        .iter()
        .enumerate()
        .filter(|(_, x)| x.verdict == Some(kind))
    {
        let cause = match kind {
            crate::model::VerdictKind::InputBoundIo
            | crate::model::VerdictKind::InputBoundCpu
            | crate::model::VerdictKind::InputBoundMemory => x.input_bound_share,
            _ => x.host_bound_share,
        };
        if let (Some(b), Some(c)) = (x.gpu_busy_fraction, cause) {
            time += dt(i);
            busy += b * dt(i);
            share += c * dt(i);
        }
    }
    if time <= 0.0 || kind == crate::model::VerdictKind::Contention {
        return None;
    }
    crate::analysis::verdict::speedup::estimate(
        kind,
        busy / time,
        share / time,
        crate::analysis::VerdictConfig::default().gpu_bound_idle_max,
    )
}

/// Busy GPU-hours, and idle GPU-hours by verdict: each sample's GPUs held times its interval,
/// split by its busy share (the mean over its GPUs).
fn by_cause(
    s: &[crate::recording::WorkloadSample],
    dt: &dyn Fn(usize) -> f64,
) -> (f64, BTreeMap<String, f64>) {
    let mut busy = 0.0;
    let mut idle: BTreeMap<String, f64> = BTreeMap::new();
    for (i, x) in s.iter().enumerate() {
        let Some(b) = x.gpu_busy_fraction.map(|b| b.clamp(0.0, 1.0)) else {
            continue;
        };
        let held = dt(i) * x.gpus.len() as f64 / 3600.0;
        busy += held * b;
        let cause = x.verdict.map_or("unknown", |v| v.label()).to_owned();
        *idle.entry(cause).or_default() += held * (1.0 - b);
    }
    idle.retain(|_, h| *h > 0.0);
    (busy, idle)
}
