//! `gpuwatch doctor`: the seed's pre-launch checklist, measured. A few seconds of snapshots go in;
//! a list of checks comes out, each with a status, the measured value, the threshold and what
//! to do. Any `risk` makes the command exit non-zero, so it can gate a training launch.
use super::rules::{self, ContainerRef, Outcome};
use super::trend::Series;
use crate::model::{BlindSpot, SourceState, WorkloadKind};

use crate::model::Snapshot;
use crate::units::{duration, ByteSize};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The config file's `doctor:` section: the seed's thresholds, adjustable.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DoctorConfig {
    /// How long `doctor` samples.
    #[serde(with = "duration")]
    pub window: Duration,
    pub start_temperature_ok_celsius: u32,
    pub start_temperature_risk_celsius: u32,
    pub peak_temperature_ok_celsius: u32,
    pub peak_temperature_risk_celsius: u32,
    pub gpu_memory_ok_percent: f64,
    pub gpu_memory_risk_percent: f64,
    pub container_memory_ok: ByteSize,
    pub container_memory_risk: ByteSize,
    #[serde(with = "duration")]
    pub nvml_latency_ok: Duration,
    #[serde(with = "duration")]
    pub nvml_latency_risk: Duration,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(5),
            start_temperature_ok_celsius: 45,
            start_temperature_risk_celsius: 55,
            peak_temperature_ok_celsius: 80,
            peak_temperature_risk_celsius: 83,
            gpu_memory_ok_percent: 85.0,
            gpu_memory_risk_percent: 92.0,
            container_memory_ok: ByteSize(2 * ByteSize::GIB),
            container_memory_risk: ByteSize(3 * ByteSize::GIB),
            nvml_latency_ok: Duration::from_millis(100),
            nvml_latency_risk: Duration::from_millis(500),
        }
    }
}

impl DoctorConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        let order = |name: &str, ok: f64, risk: f64| {
            if ok <= risk {
                Ok(())
            } else {
                Err((
                    format!("{name}_ok"),
                    format!("the ok level ({ok}) is above the risk level ({risk})"),
                ))
            }
        };
        order(
            "start_temperature",
            f64::from(self.start_temperature_ok_celsius),
            f64::from(self.start_temperature_risk_celsius),
        )?;
        order(
            "peak_temperature",
            f64::from(self.peak_temperature_ok_celsius),
            f64::from(self.peak_temperature_risk_celsius),
        )?;
        order(
            "gpu_memory",
            self.gpu_memory_ok_percent,
            self.gpu_memory_risk_percent,
        )?;
        order(
            "container_memory",
            self.container_memory_ok.0 as f64,
            self.container_memory_risk.0 as f64,
        )?;
        order(
            "nvml_latency",
            self.nvml_latency_ok.as_secs_f64(),
            self.nvml_latency_risk.as_secs_f64(),
        )?;
        if self.window < Duration::from_secs(1) {
            return Err(("window".into(), "must be at least 1s".into()));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warning,
    Risk,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub check: &'static str,
    /// `GPU 0`, a container name, `host`.
    pub subject: String,
    pub status: Status,
    pub value: String,
    pub threshold: String,
    /// What to do; empty when all is well.
    pub action: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The worst status of all checks.
    pub status: Status,
    pub window_seconds: f64,
    pub samples: usize,
    pub checks: Vec<Check>,
}

fn level<T: PartialOrd>(v: T, ok: T, risk: T) -> Status {
    if v <= ok {
        Status::Ok
    } else if v <= risk {
        Status::Warning
    } else {
        Status::Risk
    }
}

/// Runs every check over `snaps`, oldest first (at least one).
/// A source turned off on purpose (`--no-nvml`, `--no-docker`, `--no-ebpf`) is no finding.
fn disabled(state: &SourceState) -> bool {
    !state.up
        && state
            .detail
            .as_deref()
            .is_some_and(|d| d.ends_with("disabled"))
}

pub fn examine(snaps: &[Snapshot], c: &DoctorConfig) -> Report {
    let mut checks = Vec::new();
    let mut check = |check: &'static str,
                     subject: String,
                     status: Status,
                     value: String,
                     threshold: String,
                     action: &str| {
        checks.push(Check {
            check,
            subject,
            status,
            value,
            threshold,
            action: if status == Status::Ok {
                String::new()
            } else {
                action.to_owned()
            },
        })
    };
    let (Some(first), Some(last)) = (snaps.first(), snaps.last()) else {
        return Report {
            status: Status::Risk,
            window_seconds: 0.0,
            samples: 0,
            checks: Vec::new(),
        };
    };
    let window = (last.monotonic_ms.saturating_sub(first.monotonic_ms)) as f64 / 1000.0;

    // Where the agent runs: a namespace of its own hides part of the host.
    for spot in &last.host.blind_spots {
        check(
            "host_namespaces",
            "host".into(),
            match spot {
                BlindSpot::PrivatePidNamespace => Status::Risk,
                BlindSpot::PrivateCgroupNamespace => Status::Warning,
            },
            spot.consequence().into(),
            "the host's PID and cgroup namespaces".into(),
            spot.fix(),
        );
    }

    // Sources.
    if last.sources.nvml.up {
        let worst = snaps
            .iter()
            .filter_map(|s| s.nvml_query_seconds)
            .fold(0.0f64, f64::max);
        check(
            "nvml_latency",
            "host".into(),
            level(
                worst,
                c.nvml_latency_ok.as_secs_f64(),
                c.nvml_latency_risk.as_secs_f64(),
            ),
            format!("{:.0} ms", worst * 1000.0),
            format!(
                "ok < {} ms, risk > {} ms",
                c.nvml_latency_ok.as_millis(),
                c.nvml_latency_risk.as_millis()
            ),
            "The driver answers slowly: run nvidia-persistenced (or `nvidia-smi -pm 1`); if it \
             stays slow, reinstall the driver.",
        );
    } else if !disabled(&last.sources.nvml) {
        check(
            "nvml",
            "host".into(),
            Status::Risk,
            last.sources.nvml.detail.clone().unwrap_or_default(),
            "NVML loads".into(),
            "No GPU can be checked: install or load the NVIDIA driver (libnvidia-ml.so.1).",
        );
    }
    for (name, state) in [
        ("docker", &last.sources.docker),
        ("ebpf", &last.sources.ebpf),
    ] {
        if !state.up && !disabled(state) {
            check(
                if name == "docker" {
                    "docker"
                } else {
                    "stall_tracing"
                },
                "host".into(),
                Status::Warning,
                state.detail.clone().unwrap_or_else(|| "down".into()),
                "up".into(),
                if name == "docker" {
                    "Containers are named by cgroup only: check that dockerd runs and the socket \
                     is readable."
                } else {
                    "Loader stalls cannot be traced (verdicts fall back to GPU-side evidence): \
                     run as root or with CAP_BPF and CAP_PERFMON."
                },
            );
        }
    }

    // GPUs.
    for g in &last.gpus {
        let d = &g.device;
        let subject = format!("GPU {}", d.index);
        let series = || {
            snaps
                .iter()
                .filter_map(move |s| s.gpus.iter().find(|x| x.device.index == d.index))
        };
        if d.lost {
            check(
                "gpu_lost",
                subject.clone(),
                Status::Risk,
                "lost".into(),
                "present".into(),
                "The GPU fell off the bus: check `dmesg` for Xid 79, power and seating; reset \
                 or reboot before training.",
            );
            continue;
        }
        if let Some(t) = series().find_map(|x| x.device.temperature_celsius) {
            check(
                "start_temperature",
                subject.clone(),
                level(
                    t,
                    c.start_temperature_ok_celsius,
                    c.start_temperature_risk_celsius,
                ),
                format!("{t} °C"),
                format!(
                    "ok ≤ {} °C, risk > {} °C",
                    c.start_temperature_ok_celsius, c.start_temperature_risk_celsius
                ),
                "Hot before the job starts: check the server's fans and the rack's airflow; hold \
                 the launch.",
            );
        }
        if let Some(peak) = series().filter_map(|x| x.device.temperature_celsius).max() {
            check(
                "peak_temperature",
                subject.clone(),
                level(
                    peak,
                    c.peak_temperature_ok_celsius,
                    c.peak_temperature_risk_celsius,
                ),
                format!("{peak} °C"),
                format!(
                    "ok ≤ {} °C, risk > {} °C",
                    c.peak_temperature_ok_celsius, c.peak_temperature_risk_celsius
                ),
                "Lower the batch size, enable AMP (amp=True), or add DataLoader workers to \
                 spread the load; check cooling.",
            );
        }
        let shares: Vec<f64> = series()
            .filter_map(|x| {
                let (u, t) = (x.device.memory_used_bytes?, x.device.memory_total_bytes?);
                (t > 0).then(|| u as f64 * 100.0 / t as f64)
            })
            .collect();
        if let (Some(peak), Some(first_share), Some(last_share)) = (
            shares.iter().copied().reduce(f64::max),
            shares.first(),
            shares.last(),
        ) {
            let growing = last_share > first_share;
            let status = match level(peak, c.gpu_memory_ok_percent, c.gpu_memory_risk_percent) {
                Status::Risk if !growing => Status::Warning,
                s => s,
            };
            check(
                "gpu_memory_peak",
                subject.clone(),
                status,
                format!("{peak:.1}%{}", if growing { ", growing" } else { "" }),
                format!(
                    "ok ≤ {}%, risk > {}% and growing",
                    c.gpu_memory_ok_percent, c.gpu_memory_risk_percent
                ),
                "Close to out of memory: check the dataset cache, pin_memory and OpenCV \
                 threads; lower the batch or enable AMP.",
            );
        }
        let severe: Vec<&str> = d
            .clocks_event_reasons
            .iter()
            .copied()
            .filter(|r| {
                matches!(
                    *r,
                    "hw_slowdown"
                        | "hw_thermal_slowdown"
                        | "sw_thermal_slowdown"
                        | "hw_power_brake_slowdown"
                        | "sw_power_cap"
                )
            })
            .collect();
        let status = if severe.iter().any(|r| *r != "sw_power_cap") {
            Status::Risk
        } else if severe.is_empty() {
            Status::Ok
        } else {
            Status::Warning
        };
        check(
            "throttling",
            subject.clone(),
            status,
            if severe.is_empty() {
                "none".into()
            } else {
                severe.join(", ")
            },
            "no thermal or hardware slowdown".into(),
            "The GPU slows its clocks: thermal or hardware slowdown means cooling or power \
             trouble; a power cap alone means the job is power-bound.",
        );
        if let Some(n) = d.ecc_uncorrected_volatile {
            check(
                "ecc_errors",
                subject.clone(),
                if n > 0 { Status::Risk } else { Status::Ok },
                format!("{n} uncorrected"),
                "0".into(),
                "Uncorrected memory errors: drain the GPU, check `nvidia-smi -q -d ECC,PAGE_\
                 RETIREMENT`, and reset it.",
            );
        }
        let xids: Vec<String> = series()
            .flat_map(|x| x.device.xid_events.iter())
            .map(|x| format!("Xid {x} ({})", crate::sources::gpu::xid::describe(*x)))
            .collect();
        check(
            "xid_errors",
            subject.clone(),
            if xids.is_empty() {
                Status::Ok
            } else {
                Status::Risk
            },
            if xids.is_empty() {
                "none during the check".into()
            } else {
                xids.join(", ")
            },
            "none".into(),
            "The driver reports errors on this GPU: check `dmesg` for the Xid history and \
             drain the GPU if they are not one job's own faults (13, 31, 43).",
        );
        if let Some(on) = d.persistence_mode {
            check(
                "persistence_mode",
                subject.clone(),
                if on { Status::Ok } else { Status::Warning },
                if on { "on" } else { "off" }.into(),
                "on".into(),
                "Without persistence the driver reinitialises for each job (slow starts and \
                 NVML queries): enable nvidia-persistenced or `nvidia-smi -pm 1`.",
            );
        }
    }

    // Ghost processes, as the alert rule sees them.
    let mut ghosts = 0;
    let workloads = rules::workload_index(last);
    for g in &last.gpus {
        for p in &g.processes {
            let current = p
                .workload
                .as_ref()
                .and_then(|id| workloads.get(id).copied());
            let owner = current.map(ContainerRef::of);
            let subject = format!("GPU {} PID {}", g.device.index, p.reading.pid);
            match rules::ghost_outcome(last.sources.docker.up, g, p, current, owner.as_ref()) {
                Outcome::Breached(f) => {
                    ghosts += 1;
                    check(
                        "ghost_process",
                        subject,
                        Status::Risk,
                        format!("{:.0} MiB", f.value),
                        "no ghost processes".into(),
                        &format!("{} — {}", f.summary, f.action),
                    );
                }
                Outcome::Unknown => {
                    let why = current
                        .and_then(|w| w.container_unverified.as_deref())
                        .unwrap_or("its container cannot be told");
                    ghosts += 1;
                    check(
                        "ghost_process",
                        subject,
                        Status::Warning,
                        "unverified".into(),
                        "no ghost processes".into(),
                        &format!(
                            "Docker lists its container as running but could not describe it \
                             ({why}): not a ghost as far as Docker says; run the check again."
                        ),
                    );
                }
                Outcome::Clear => {}
            }
        }
    }
    if ghosts == 0 && last.sources.nvml.up {
        check(
            "ghost_process",
            "host".into(),
            Status::Ok,
            "none".into(),
            "no ghost processes".into(),
            "",
        );
    }

    // Containers: CPU memory, level and growth.
    let mut series: BTreeMap<String, (String, Series)> = BTreeMap::new();
    for s in snaps {
        for w in &s.workloads {
            if w.kind == WorkloadKind::Host || (w.container.is_none() && w.gpu.processes == 0) {
                continue;
            }
            if let Some(m) = w.memory {
                series
                    .entry(w.id.to_string())
                    .or_insert_with(|| (w.name.clone(), Series::default()))
                    .1
                    .push(
                        s.monotonic_ms as f64 / 1000.0,
                        m.usage_bytes as f64,
                        f64::INFINITY,
                    );
            }
        }
    }
    for (name, s) in series.values() {
        let Some(now) = s.last() else { continue };
        let rising = s.fit().is_some_and(|f| f.slope > 0.0 && f.r_squared >= 0.8);
        let status = match level(
            now,
            c.container_memory_ok.0 as f64,
            c.container_memory_risk.0 as f64,
        ) {
            Status::Ok => Status::Ok,
            Status::Risk if rising => Status::Risk,
            _ => Status::Warning,
        };
        check(
            "container_memory",
            name.clone(),
            status,
            format!(
                "{}{}",
                ByteSize(now as u64),
                if rising { ", rising" } else { "" }
            ),
            format!(
                "ok ≤ {}, risk > {} and rising",
                c.container_memory_ok, c.container_memory_risk
            ),
            "Host memory grows: check Dataset.__getitem__ for large objects kept per sample \
             and caches without bounds.",
        );
    }

    checks.extend(super::config_checks::over(snaps));
    let status = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    Report {
        status,
        window_seconds: window,
        samples: snaps.len(),
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, process, snapshot};
    use crate::model::MemoryUsage;

    fn statuses(r: &Report) -> BTreeMap<(&str, &str), Status> {
        r.checks
            .iter()
            .map(|c| ((c.check, c.subject.as_str()), c.status))
            .collect()
    }

    #[test]
    fn a_healthy_host_passes() {
        let mut g = gpu(0);
        g.device.temperature_celsius = Some(38);
        g.device.persistence_mode = Some(true);
        g.device.ecc_uncorrected_volatile = Some(0);
        let snaps: Vec<_> = (0..5)
            .map(|i| snapshot(i * 1000, vec![g.clone()], vec![]))
            .collect();
        let r = examine(&snaps, &DoctorConfig::default());
        assert_eq!(r.status, Status::Ok, "{:#?}", r.checks);
        assert!(r.checks.iter().any(|c| c.check == "ecc_errors"));
        assert!(r.checks.iter().all(|c| c.action.is_empty()));
    }

    /// `--no-nvml` (or `--no-docker`, `--no-ebpf`) is a choice, not a risk; NVML that fails
    /// to load is one; a private PID namespace is one too, and says how to fix it.
    #[test]
    fn sources_turned_off_are_no_finding_but_blind_spots_are() {
        let off = |nvml: SourceState| {
            let mut s = snapshot(0, vec![], vec![]);
            s.sources.nvml = nvml;
            s.sources.docker = SourceState::down("disabled");
            s.sources.ebpf = SourceState::down("disabled");
            let r = examine(&[s.clone(), s], &DoctorConfig::default());
            (
                r.status,
                r.checks.iter().map(|c| c.check).collect::<Vec<_>>(),
            )
        };
        assert_eq!(off(SourceState::down("disabled")), (Status::Ok, vec![]));
        assert_eq!(
            off(SourceState::down("libnvidia-ml.so.1: not found")),
            (Status::Risk, vec!["nvml"])
        );
        let mut s = snapshot(0, vec![gpu(0)], vec![]);
        s.host.blind_spots = vec![BlindSpot::PrivatePidNamespace];
        let r = examine(&[s.clone(), s], &DoctorConfig::default());
        let c = r
            .checks
            .iter()
            .find(|c| c.check == "host_namespaces")
            .unwrap();
        assert_eq!((r.status, c.status), (Status::Risk, Status::Risk));
        assert!(c.action.contains("--pid=host"), "{c:?}");
    }

    #[test]
    fn the_seeds_risks_are_risks() {
        let mut w = container("leaky");
        let snaps: Vec<_> = (0..6u64)
            .map(|i| {
                let mut g = gpu(0);
                g.device.temperature_celsius = Some(if i == 0 { 58 } else { 86 });
                g.device.memory_used_bytes = Some((75 + i) << 30); // 93.75 % → 100 %, growing
                g.device.clocks_event_reasons = vec!["hw_thermal_slowdown"];
                g.device.persistence_mode = Some(false);
                g.device.ecc_uncorrected_volatile = Some(2);
                if i == 2 {
                    g.device.xid_events = vec![79];
                }
                let mut dead = process(4242, None, 1 << 30);
                dead.vanished = true;
                g.processes.push(dead);
                w.memory = Some(MemoryUsage {
                    usage_bytes: (3 << 30) + i * (200 << 20),
                    limit_bytes: None,
                    page_cache_bytes: None,
                });
                let mut s = snapshot(i * 1000, vec![g], vec![w.clone()]);
                s.nvml_query_seconds = Some(if i == 3 { 0.7 } else { 0.002 });
                s
            })
            .collect();
        let r = examine(&snaps, &DoctorConfig::default());
        let s = statuses(&r);
        assert_eq!(r.status, Status::Risk);
        for key in [
            ("start_temperature", "GPU 0"),
            ("peak_temperature", "GPU 0"),
            ("gpu_memory_peak", "GPU 0"),
            ("throttling", "GPU 0"),
            ("ecc_errors", "GPU 0"),
            ("xid_errors", "GPU 0"),
            ("nvml_latency", "host"),
            ("ghost_process", "GPU 0 PID 4242"),
            ("container_memory", "leaky"),
        ] {
            assert_eq!(s.get(&key), Some(&Status::Risk), "{key:?}: {:#?}", r.checks);
        }
        assert_eq!(s[&("persistence_mode", "GPU 0")], Status::Warning);
    }

    #[test]
    fn high_but_flat_memory_is_a_warning() {
        let snaps: Vec<_> = (0..4)
            .map(|i| {
                let mut g = gpu(0);
                g.device.memory_used_bytes = Some(76 << 30); // 95 %, not growing
                snapshot(i * 1000, vec![g], vec![])
            })
            .collect();
        let r = examine(&snaps, &DoctorConfig::default());
        assert_eq!(statuses(&r)[&("gpu_memory_peak", "GPU 0")], Status::Warning);
    }
}
