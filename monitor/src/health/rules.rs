//! The alert rules (the config file's `alerts.rules:` section). Each rule looks at one snapshot
//! (and, for leaks, the series it keeps) and says for each subject — a GPU, a container, a GPU
//! process — whether its condition holds ([`Outcome::Breached`]), does not ([`Outcome::Clear`]),
//! or cannot be told this round ([`Outcome::Unknown`]: the data is missing, and a missing reading
//! must neither fire nor resolve an alert). How long a condition must hold is the lifecycle's job
//! ([`super::alerts`]).
use super::trend::Series;
use crate::model::{WorkloadId, WorkloadKind};

use crate::model::{Gpu, GpuProcess, Snapshot, Workload};
use crate::units::{duration, ByteSize};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

macro_rules! rule_config {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty = $default:expr,)* }
     for = $for:expr, severity = $sev:expr) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            pub enabled: bool,
            /// How long the condition must hold before the alert fires.
            #[serde(rename = "for", with = "duration")]
            pub for_: Duration,
            pub severity: Severity,
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    enabled: true,
                    for_: $for,
                    severity: $sev,
                    $($field: $default,)*
                }
            }
        }
    };
}

rule_config! {
    /// A container's GPU busy share below a threshold (the seed's "utilisation < 30 % for 60 s").
    UnderutilizedRule { below_percent: f64 = 30.0, }
    for = Duration::from_secs(60), severity = Severity::Warning
}
rule_config! {
    /// A GPU's memory use above a share of its total (the seed's "memory > 95 %").
    GpuMemoryRule { above_percent: f64 = 95.0, }
    for = Duration::from_secs(10), severity = Severity::Critical
}
rule_config! {
    /// A GPU hotter than a threshold (the seed's "> 83 °C for more than 3 minutes").
    TemperatureRule { above_celsius: u32 = 83, }
    for = Duration::from_secs(180), severity = Severity::Critical
}
rule_config! {
    /// Sustained, near-linear memory growth: a least-squares slope over `window`, with at least
    /// `min_duration` of data, a slope of at least `min_growth_per_minute` and a fit of at least
    /// `min_r_squared`.
    LeakRule {
        #[serde(with = "duration")]
        window: Duration = Duration::from_secs(600),
        #[serde(with = "duration")]
        min_duration: Duration = Duration::from_secs(300),
        min_growth_per_minute: ByteSize = ByteSize(64 * ByteSize::MIB),
        min_r_squared: f64 = 0.9,
    }
    for = Duration::ZERO, severity = Severity::Warning
}
rule_config! {
    /// The SM utilisation of one container's GPUs spread apart (the seed's DDP check).
    ImbalanceRule { spread_percent: f64 = 5.0, }
    for = Duration::from_secs(60), severity = Severity::Warning
}
rule_config! {
    /// Power near the cap while utilisation is low: memory bandwidth, not compute, is the limit.
    PowerRule { power_ratio: f64 = 0.95, below_utilization_percent: f64 = 80.0, }
    for = Duration::from_secs(120), severity = Severity::Warning
}
rule_config! {
    /// A GPU that fell off the bus (NVML: GPU is lost).
    GpuLostRule {}
    for = Duration::ZERO, severity = Severity::Critical
}
rule_config! {
    /// Volatile uncorrected ECC errors on a GPU.
    EccRule {}
    for = Duration::ZERO, severity = Severity::Critical
}
rule_config! {
    /// Xid errors reported by the driver. The alert stays firing for `hold` after the last one;
    /// codes in `ignore` (e.g. 13, 31, 43: faults of an application's own kernels) are skipped.
    XidRule {
        #[serde(with = "duration")]
        hold: Duration = Duration::from_secs(600),
        ignore: Vec<u64> = Vec::new(),
    }
    for = Duration::ZERO, severity = Severity::Critical
}
rule_config! {
    /// GPU memory held by a process that no longer exists, that sits in no live container, or
    /// that is stuck in uninterruptible sleep.
    GhostRule {}
    for = Duration::from_secs(30), severity = Severity::Critical
}

rule_config! {
    /// A GPU given to a container that none of its processes uses (see `allocated_idle`).
    AllocatedIdleRule {}
    for = Duration::from_secs(600), severity = Severity::Warning
}

macro_rules! rules_config {
    ($($field:ident : $ty:ty,)*) => {
        /// Every rule, each with `enabled`, `for` and `severity` besides its own thresholds.
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct RulesConfig {
            $(pub $field: $ty,)*
        }

        /// The rule names, as in the config file and in alerts.
        pub const RULE_NAMES: &[&str] = &[$(stringify!($field),)*];

        impl RulesConfig {
            /// Whether the rule named `name` runs (`false` for an unknown name).
            pub fn is_enabled(&self, name: &str) -> bool {
                match name {
                    $(stringify!($field) => self.$field.enabled,)*
                    _ => false,
                }
            }
        }
    };
}

rules_config! {
    gpu_underutilized: UnderutilizedRule,
    gpu_memory_high: GpuMemoryRule,
    gpu_temperature_high: TemperatureRule,
    gpu_memory_leak: LeakRule,
    cpu_memory_leak: LeakRule,
    gpu_imbalance: ImbalanceRule,
    power_cap_low_util: PowerRule,
    gpu_lost: GpuLostRule,
    gpu_ecc_errors: EccRule,
    gpu_xid_errors: XidRule,
    ghost_process: GhostRule,
    gpu_allocated_idle: AllocatedIdleRule,
}

impl RulesConfig {
    /// Returns the offending `rule.field` and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let percent = |rule: &str, field: &str, v: f64| {
            if (0.0..=100.0).contains(&v) {
                Ok(())
            } else {
                Err((
                    format!("{rule}.{field}"),
                    format!("{v} is not a percentage (0–100)"),
                ))
            }
        };
        percent(
            "gpu_underutilized",
            "below_percent",
            self.gpu_underutilized.below_percent,
        )?;
        percent(
            "gpu_memory_high",
            "above_percent",
            self.gpu_memory_high.above_percent,
        )?;
        percent(
            "gpu_imbalance",
            "spread_percent",
            self.gpu_imbalance.spread_percent,
        )?;
        percent(
            "power_cap_low_util",
            "below_utilization_percent",
            self.power_cap_low_util.below_utilization_percent,
        )?;
        if !(0.0..=1.5).contains(&self.power_cap_low_util.power_ratio) {
            return Err((
                "power_cap_low_util.power_ratio".into(),
                "must be a ratio of the power cap, 0–1.5".into(),
            ));
        }
        for (name, r) in [
            ("gpu_memory_leak", &self.gpu_memory_leak),
            ("cpu_memory_leak", &self.cpu_memory_leak),
        ] {
            if !(0.0..=1.0).contains(&r.min_r_squared) {
                return Err((
                    format!("{name}.min_r_squared"),
                    "must be between 0 and 1".into(),
                ));
            }
            if r.min_duration > r.window || r.min_duration.is_zero() {
                return Err((
                    format!("{name}.min_duration"),
                    format!(
                        "must be more than 0 and at most the window ({})",
                        humantime::format_duration(r.window)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What an alert is about.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Subject {
    pub gpu: Option<GpuRef>,
    pub container: Option<ContainerRef>,
    pub pid: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuRef {
    pub index: u32,
    pub uuid: Option<String>,
}

/// A workload as alerts name it: the container's name, image and compose service when it is
/// one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContainerRef {
    pub workload: WorkloadId,
    pub name: String,
    pub id: Option<String>,
    pub image: Option<String>,
    pub compose_service: Option<String>,
    /// `namespace/pod`, where the container is a Kubernetes pod's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl ContainerRef {
    pub fn of(w: &Workload) -> Self {
        Self {
            workload: w.id.clone(),
            name: w.name.clone(),
            id: w.container.as_ref().map(|c| c.id.clone()),
            image: w.container.as_ref().map(|c| c.image.clone()),
            compose_service: w.container.as_ref().and_then(|c| c.compose_service.clone()),
            pod: w
                .container
                .as_ref()
                .and_then(|c| c.kubernetes.as_ref())
                .map(ToString::to_string),
        }
    }
}

/// A breached condition, with the words an alert carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub value: f64,
    pub threshold: f64,
    pub unit: &'static str,
    pub summary: String,
    pub action: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Breached(Finding),
    Clear,
    /// The data is missing this round: keep the alert as it is.
    Unknown,
}

/// One rule's outcome for one subject.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub rule: &'static str,
    pub severity: Severity,
    pub for_: Duration,
    /// Identifies the alert across rounds: rule and subject.
    pub key: String,
    pub subject: Subject,
    pub outcome: Outcome,
}

/// What the rules remember between snapshots.
#[derive(Debug, Default)]
pub struct RuleState {
    gpu_memory: HashMap<WorkloadId, Series>,
    cpu_memory: HashMap<WorkloadId, Series>,
    /// The last container each GPU PID belonged to, to name a ghost after its process is gone.
    owners: HashMap<u32, ContainerRef>,
    /// The last Xid per GPU and when it came (unix ms).
    last_xid: HashMap<String, (u64, u64)>,
}

const MIB: f64 = 1_048_576.0;

/// Evaluates every enabled rule on `snap`.
pub fn evaluate(config: &RulesConfig, state: &mut RuleState, snap: &Snapshot) -> Vec<Evaluation> {
    let mut out = Vec::new();
    // Trends and holds go by the monotonic clock: a wall-clock step bends no line.
    let t = snap.monotonic_ms as f64 / 1000.0;
    let gpu_ref = |g: &Gpu| GpuRef {
        index: g.device.index,
        uuid: g.device.uuid.clone(),
    };
    let gpu_key = |g: &Gpu| {
        g.device
            .uuid
            .clone()
            .unwrap_or_else(|| format!("index-{}", g.device.index))
    };
    let workloads = workload_index(snap);
    // The container using the most memory on a GPU, to name in GPU-level alerts.
    let top_user = |g: &Gpu| -> Option<ContainerRef> {
        let mut by: HashMap<&WorkloadId, u64> = HashMap::new();
        for p in &g.processes {
            if let Some(w) = &p.workload {
                *by.entry(w).or_default() += p.reading.used_memory_bytes.unwrap_or(0);
            }
        }
        let (id, _) = by.into_iter().max_by_key(|(_, m)| *m)?;
        workloads.get(id).map(|w| ContainerRef::of(w))
    };
    let mut push = |rule: &'static str,
                    severity: Severity,
                    for_: Duration,
                    key: String,
                    subject: Subject,
                    outcome: Outcome| {
        out.push(Evaluation {
            rule,
            severity,
            for_,
            key: format!("{rule}/{key}"),
            subject,
            outcome,
        })
    };

    // Per GPU.
    for g in &snap.gpus {
        let d = &g.device;
        let subject = || Subject {
            gpu: Some(gpu_ref(g)),
            container: top_user(g),
            pid: None,
        };
        let r = &config.gpu_lost;
        if r.enabled {
            let outcome = if d.lost {
                Outcome::Breached(Finding {
                    value: 1.0,
                    threshold: 1.0,
                    unit: "",
                    summary: format!("GPU {} is lost: NVML reports it fell off the bus", d.index),
                    action: "Check `dmesg` for Xid 79 and the GPU's power and PCIe seating; the \
                             GPU needs a reset or a reboot, and its jobs a restart."
                        .into(),
                })
            } else {
                Outcome::Clear
            };
            push(
                "gpu_lost",
                r.severity,
                r.for_,
                gpu_key(g),
                subject(),
                outcome,
            );
        }
        if d.lost {
            continue; // nothing else on a lost GPU can be read
        }
        let r = &config.gpu_memory_high;
        if r.enabled {
            let outcome = match (d.memory_used_bytes, d.memory_total_bytes) {
                (Some(u), Some(t)) if t > 0 => {
                    let v = u as f64 * 100.0 / t as f64;
                    if v > r.above_percent {
                        Outcome::Breached(Finding {
                            value: v,
                            threshold: r.above_percent,
                            unit: "%",
                            summary: format!(
                                "GPU {} memory {v:.1}% used ({:.0} of {:.0} MiB), above {}%",
                                d.index,
                                u as f64 / MIB,
                                t as f64 / MIB,
                                r.above_percent
                            ),
                            action: "An out-of-memory error is close: lower the batch size or \
                                     imgsz, enable AMP, or stop what else holds memory on this \
                                     GPU."
                                .into(),
                        })
                    } else {
                        Outcome::Clear
                    }
                }
                _ => Outcome::Unknown,
            };
            push(
                "gpu_memory_high",
                r.severity,
                r.for_,
                gpu_key(g),
                subject(),
                outcome,
            );
        }
        let r = &config.gpu_temperature_high;
        if r.enabled {
            let outcome = match d.temperature_celsius {
                Some(c) if c > r.above_celsius => Outcome::Breached(Finding {
                    value: f64::from(c),
                    threshold: f64::from(r.above_celsius),
                    unit: "°C",
                    summary: format!("GPU {} at {c} °C, above {} °C", d.index, r.above_celsius),
                    action: "Check the fans and the rack's airflow; meanwhile lower the batch \
                             size, enable AMP, or use gradient accumulation to cut the heat."
                        .into(),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            push(
                "gpu_temperature_high",
                r.severity,
                r.for_,
                gpu_key(g),
                subject(),
                outcome,
            );
        }
        let r = &config.power_cap_low_util;
        if r.enabled {
            // The window's busy share where the series gave one; else the instantaneous figure.
            let util = g
                .busy
                .map(|b| b.fraction * 100.0)
                .or(d.utilization_gpu_percent.map(f64::from));
            let outcome = match (d.power_watts, d.power_limit_watts, util) {
                (Some(p), Some(cap), Some(u)) if cap > 0.0 => {
                    let ratio = p / cap;
                    if ratio >= r.power_ratio && u < r.below_utilization_percent {
                        Outcome::Breached(Finding {
                            value: ratio,
                            threshold: r.power_ratio,
                            unit: "of cap",
                            summary: format!(
                                "GPU {} draws {p:.0} W of its {cap:.0} W cap at only {u:.0}% \
                                 utilisation",
                                d.index
                            ),
                            action: "Memory bandwidth, not compute, limits this GPU: a smaller \
                                     imgsz or batch helps more than more GPUs."
                                .into(),
                        })
                    } else {
                        Outcome::Clear
                    }
                }
                _ => Outcome::Unknown,
            };
            push(
                "power_cap_low_util",
                r.severity,
                r.for_,
                gpu_key(g),
                subject(),
                outcome,
            );
        }
        let r = &config.gpu_ecc_errors;
        if r.enabled {
            let outcome = match d.ecc_uncorrected_volatile {
                Some(n) if n > 0 => Outcome::Breached(Finding {
                    value: n as f64,
                    threshold: 0.0,
                    unit: "errors",
                    summary: format!(
                        "GPU {} has {n} uncorrected ECC errors since the driver loaded",
                        d.index
                    ),
                    action: "Results computed on this GPU may be corrupt: drain it, check \
                             `nvidia-smi -q -d ECC` and retired pages, and reset the GPU."
                        .into(),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            push(
                "gpu_ecc_errors",
                r.severity,
                r.for_,
                gpu_key(g),
                subject(),
                outcome,
            );
        }
        let r = &config.gpu_xid_errors;
        if r.enabled {
            let now = snap.monotonic_ms;
            if let Some(&xid) = d.xid_events.iter().rev().find(|x| !r.ignore.contains(x)) {
                state.last_xid.insert(gpu_key(g), (xid, now));
            }
            let outcome = match state.last_xid.get(&gpu_key(g)) {
                Some(&(xid, at)) if now.saturating_sub(at) < r.hold.as_millis() as u64 => {
                    Outcome::Breached(Finding {
                        value: xid as f64,
                        threshold: 0.0,
                        unit: "Xid",
                        summary: format!(
                            "GPU {} reported Xid {xid}: {}",
                            d.index,
                            crate::sources::gpu::xid::describe(xid)
                        ),
                        action: if matches!(xid, 13 | 31 | 43 | 45) {
                            "A job's own GPU code faulted (illegal address, killed kernel): \
                             read that container's log; if it recurs across jobs, test the GPU."
                                .into()
                        } else {
                            "Look up the Xid in NVIDIA's catalogue, check `dmesg` and \
                             `nvidia-smi -q`; drain the GPU and reset it if it repeats."
                                .into()
                        },
                    })
                }
                _ => Outcome::Clear,
            };
            push(
                "gpu_xid_errors",
                r.severity,
                r.for_,
                gpu_key(g),
                subject(),
                outcome,
            );
        }
    }

    // Per workload holding a GPU (and, for CPU memory, any container).
    for w in &snap.workloads {
        let subject = || Subject {
            gpu: None,
            container: Some(ContainerRef::of(w)),
            pid: None,
        };
        let key = w.id.to_string();
        let on_gpu = w.gpu.processes > 0 && !w.exited;
        let r = &config.gpu_underutilized;
        if r.enabled && on_gpu {
            let outcome = match w.gpu.busy_fraction {
                Some(b) if b * 100.0 < r.below_percent => Outcome::Breached(Finding {
                    value: b * 100.0,
                    threshold: r.below_percent,
                    unit: "%",
                    summary: format!(
                        "{}: GPU busy {:.0}%, below {}%{}",
                        w.name,
                        b * 100.0,
                        r.below_percent,
                        w.verdict
                            .as_ref()
                            .map(|v| format!(" (verdict: {})", verdict_name(v.kind)))
                            .unwrap_or_default()
                    ),
                    action: w.verdict.as_ref().map_or_else(
                        || {
                            "The GPU waits: check the data loader (more workers, cached \
                             dataset, faster storage)."
                                .to_owned()
                        },
                        |v| v.advice.clone(),
                    ),
                }),
                Some(_) => Outcome::Clear,
                None => Outcome::Unknown,
            };
            push(
                "gpu_underutilized",
                r.severity,
                r.for_,
                key.clone(),
                subject(),
                outcome,
            );
        }
        let r = &config.gpu_imbalance;
        if r.enabled && on_gpu && w.gpu.per_gpu.len() >= 2 {
            let outcome = if w.gpu.busy_fraction.is_none() {
                Outcome::Unknown
            } else {
                let utils: Vec<(u32, f64)> = w
                    .gpu
                    .per_gpu
                    .iter()
                    .filter_map(|g| Some((g.index, g.busy_fraction? * 100.0)))
                    .collect();
                let hi = utils
                    .iter()
                    .copied()
                    .fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
                let lo = utils
                    .iter()
                    .copied()
                    .fold((0, f64::MAX), |a, b| if b.1 < a.1 { b } else { a });
                let spread = hi.1 - lo.1;
                if spread > r.spread_percent {
                    Outcome::Breached(Finding {
                        value: spread,
                        threshold: r.spread_percent,
                        unit: "points",
                        summary: format!(
                            "{}: GPU busy spread {spread:.0} points across its GPUs \
                             (GPU {} at {:.0}%, GPU {} at {:.0}%)",
                            w.name, hi.0, hi.1, lo.0, lo.1
                        ),
                        action: "The ranks of a distributed job wait on each other: check the \
                                 data sharding, NCCL settings (NCCL_IB_DISABLE, \
                                 NCCL_SOCKET_TIMEOUT) and whether another job shares the slow \
                                 GPU."
                            .into(),
                    })
                } else {
                    Outcome::Clear
                }
            };
            push(
                "gpu_imbalance",
                r.severity,
                r.for_,
                key.clone(),
                subject(),
                outcome,
            );
        }
        let r = &config.gpu_memory_leak;
        if r.enabled && on_gpu {
            let series = state.gpu_memory.entry(w.id.clone()).or_default();
            series.push(t, w.gpu.memory_bytes as f64, r.window.as_secs_f64());
            let outcome = leak_outcome(r, series, &w.name, "GPU memory", true);
            push(
                "gpu_memory_leak",
                r.severity,
                r.for_,
                key.clone(),
                subject(),
                outcome,
            );
        }
        let r = &config.cpu_memory_leak;
        if r.enabled && w.kind != WorkloadKind::Host && !w.exited {
            if let Some(m) = w.memory {
                let series = state.cpu_memory.entry(w.id.clone()).or_default();
                series.push(t, m.usage_bytes as f64, r.window.as_secs_f64());
                let outcome = leak_outcome(r, series, &w.name, "CPU memory", false);
                push(
                    "cpu_memory_leak",
                    r.severity,
                    r.for_,
                    key,
                    subject(),
                    outcome,
                );
            }
        }
    }
    state.gpu_memory.retain(|id, _| workloads.contains_key(id));
    state.cpu_memory.retain(|id, _| workloads.contains_key(id));

    // Per GPU process: ghosts.
    let r = &config.ghost_process;
    let mut live_pids = std::collections::HashSet::new();
    for g in &snap.gpus {
        for p in &g.processes {
            live_pids.insert(p.reading.pid);
            let current = p
                .workload
                .as_ref()
                .and_then(|id| workloads.get(id).copied());
            let owner = current.map(ContainerRef::of);
            if let Some(o) = &owner {
                state.owners.insert(p.reading.pid, o.clone());
            }
            if !r.enabled {
                continue;
            }
            let owner = owner.or_else(|| state.owners.get(&p.reading.pid).cloned());
            let outcome = ghost_outcome(snap.sources.docker.up, g, p, current, owner.as_ref());
            push(
                "ghost_process",
                r.severity,
                r.for_,
                format!("{}/{}", gpu_key(g), p.reading.pid),
                Subject {
                    gpu: Some(gpu_ref(g)),
                    container: owner,
                    pid: Some(p.reading.pid),
                },
                outcome,
            );
        }
    }
    state.owners.retain(|pid, _| live_pids.contains(pid));
    out.extend(super::allocated_idle::evaluate(
        &config.gpu_allocated_idle,
        snap,
    ));
    out
}

fn verdict_name(kind: crate::model::VerdictKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn leak_outcome(r: &LeakRule, series: &Series, name: &str, what: &str, gpu: bool) -> Outcome {
    let Some(fit) = series.fit() else {
        return Outcome::Unknown;
    };
    if fit.span < r.min_duration.as_secs_f64() {
        return Outcome::Unknown; // not enough history to tell a leak from a warm-up
    }
    let per_minute = fit.slope * 60.0;
    if per_minute >= r.min_growth_per_minute.0 as f64 && fit.r_squared >= r.min_r_squared {
        Outcome::Breached(Finding {
            value: per_minute / MIB,
            threshold: r.min_growth_per_minute.0 as f64 / MIB,
            unit: "MiB/min",
            summary: format!(
                "{name}: {what} grows {:.0} MiB/min steadily over {:.0} s (R² {:.2}), now {:.0} MiB",
                per_minute / MIB,
                fit.span,
                fit.r_squared,
                series.last().unwrap_or(0.0) / MIB
            ),
            action: if gpu {
                "Something keeps tensors alive across steps: look for losses or outputs kept \
                 without .item()/.detach(), growing caches, or callbacks holding graphs."
                    .into()
            } else {
                "The process keeps growing on the host: check Dataset.__getitem__ for objects \
                 kept per sample, caches without bounds, and DataLoader workers copying the \
                 dataset."
                    .into()
            },
        })
    } else {
        Outcome::Clear
    }
}

/// The snapshot's workloads by id, built once per evaluation (lookups per GPU and per process).
pub(crate) fn workload_index(snap: &Snapshot) -> HashMap<&WorkloadId, &Workload> {
    snap.workloads.iter().map(|w| (&w.id, w)).collect()
}

/// Whether process `p` on `g` is a ghost. `current` is the workload its cgroup names in this
/// snapshot; `owner` the container it last belonged to (to name it after it is gone).
pub(crate) fn ghost_outcome(
    docker_up: bool,
    g: &Gpu,
    p: &GpuProcess,
    current: Option<&Workload>,
    owner: Option<&ContainerRef>,
) -> Outcome {
    let mib = p.reading.used_memory_bytes.unwrap_or(0) as f64 / MIB;
    let pid = p.reading.pid;
    let whose = owner.map_or_else(String::new, |o| format!(" (last in {})", o.name));
    let breached = |value: f64, summary: String, action: &str| {
        Outcome::Breached(Finding {
            value,
            threshold: 0.0,
            unit: "MiB",
            summary,
            action: action.to_owned(),
        })
    };
    if p.vanished {
        if p.reading.used_memory_bytes == Some(0) {
            return Outcome::Clear;
        }
        return breached(
            mib,
            format!(
                "GPU {}: PID {pid}{whose} no longer exists, but NVML still reports it holding \
                 {mib:.0} MiB",
                g.device.index
            ),
            "The driver has not released a dead process's memory: look for a zombie or its \
             parent (`ps -o ppid= -p` on its children), stop the container that owned it, and \
             reset the GPU (`nvidia-smi -r`) once it is idle.",
        );
    }
    if p.stuck {
        return breached(
            mib,
            format!(
                "GPU {}: PID {pid}{whose} is stuck in uninterruptible sleep (D) while holding \
                 {mib:.0} MiB and computing nothing",
                g.device.index
            ),
            "Its kernel call does not return (storage, NFS or driver): check `cat \
             /proc/<pid>/stack` and `dmesg`; the memory is freed only when it exits.",
        );
    }
    // A Docker cgroup that Docker does not know: the container is gone but its process is not.
    let in_dead_container = docker_up
        && p.workload
            .as_ref()
            .is_some_and(|id| id.kind == WorkloadKind::Docker)
        && current.is_none_or(|w| w.container.is_none());
    if in_dead_container && current.is_some_and(|w| w.container_unverified.is_some()) {
        // Docker runs it but could not be asked about it: not gone, not known either.
        return Outcome::Unknown;
    }
    if in_dead_container {
        return breached(
            mib,
            format!(
                "GPU {}: PID {pid} holds {mib:.0} MiB in the cgroup of a container Docker no \
                 longer runs",
                g.device.index
            ),
            "The container exited but this process survived it: kill it (`kill -9`), or \
             restart the Docker daemon if the cgroup lingers.",
        );
    }
    Outcome::Clear
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, process, snapshot};

    fn ghost(snap: &Snapshot) -> Vec<Outcome> {
        let mut state = RuleState::default();
        evaluate(&RulesConfig::default(), &mut state, snap)
            .into_iter()
            .filter(|e| e.rule == "ghost_process")
            .map(|e| e.outcome)
            .collect()
    }

    #[test]
    fn ghosts_are_dead_stuck_or_containerless() {
        let live = container("train");
        let mut g = gpu(0);
        g.processes.push(process(10, Some(&live.id), 1 << 30));
        // A Docker cgroup Docker does not know: the container is gone, its process is not.
        let orphan = crate::model::WorkloadId {
            kind: WorkloadKind::Docker,
            id: "f".repeat(64).into(),
        };
        g.processes.push(process(11, Some(&orphan), 2 << 30));
        let mut stuck = process(12, Some(&live.id), 3 << 30);
        stuck.state = Some('D');
        stuck.stuck = true;
        g.processes.push(stuck);
        // In D at one check only, or with CPU time between two: busy with I/O, not stuck.
        let mut reading = process(13, Some(&live.id), 1 << 30);
        reading.state = Some('D');
        g.processes.push(reading);
        let mut orphan_w = container("x");
        orphan_w.id = orphan.clone();
        orphan_w.container = None;
        let snap = snapshot(0, vec![g], vec![live, orphan_w]);
        let out = ghost(&snap);
        assert_eq!(out[0], Outcome::Clear);
        let Outcome::Breached(f) = &out[1] else {
            panic!("{:?}", out[1]);
        };
        assert!(
            f.summary.contains("container Docker no longer runs"),
            "{}",
            f.summary
        );
        assert_eq!(f.value, 2048.0);
        let Outcome::Breached(f) = &out[2] else {
            panic!("{:?}", out[2]);
        };
        assert!(f.summary.contains("uninterruptible sleep"), "{}", f.summary);
        assert_eq!(out[3], Outcome::Clear, "one D reading is not stuck");
        // Docker lists it but inspecting it failed: not known, and not gone either.
        let mut unverified = snap.clone();
        unverified.workloads[1].container_unverified =
            Some("inspecting ff…: 500 Internal Server Error".to_owned());
        assert_eq!(ghost(&unverified)[1], Outcome::Unknown);
        // With Docker down, an unknown container is no evidence of anything.
        let mut snap = snap;
        snap.sources.docker = crate::model::SourceState::down("socket missing");
        assert_eq!(ghost(&snap)[1], Outcome::Clear);
    }

    #[test]
    fn a_sawtooth_is_no_leak_and_a_ramp_is() {
        let config = RulesConfig {
            gpu_memory_leak: LeakRule {
                window: Duration::from_secs(60),
                min_duration: Duration::from_secs(20),
                ..LeakRule::default()
            },
            ..RulesConfig::default()
        };
        let run = |memory: &dyn Fn(u64) -> u64| {
            let mut state = RuleState::default();
            let mut last = Outcome::Unknown;
            for t in 0..40u64 {
                let mut w = container("train");
                w.gpu.processes = 1;
                w.gpu.memory_bytes = memory(t);
                let snap = snapshot(t * 1000, vec![], vec![w]);
                last = evaluate(&config, &mut state, &snap)
                    .into_iter()
                    .find(|e| e.rule == "gpu_memory_leak")
                    .map(|e| e.outcome)
                    .expect("evaluated");
                if t < 20 {
                    assert_eq!(last, Outcome::Unknown, "too little history at {t} s");
                }
            }
            last
        };
        // Allocations that are freed again every other second.
        assert_eq!(run(&|t| (4 << 30) + (t % 2) * (2 << 30)), Outcome::Clear);
        // 2 MiB/s = 120 MiB/min, steady.
        let Outcome::Breached(f) = run(&|t| (4 << 30) + t * (2 << 20)) else {
            panic!("a steady ramp is a leak");
        };
        assert!((f.value - 120.0).abs() < 0.5, "{f:?}");
    }
}
