//! `gpuwatch doctor`: the pre-launch checklist of the monitoring articles, measured. A few
//! seconds of snapshots go in; a list of checks comes out, each with a status, the measured
//! value, the threshold and what to do. Any `risk` makes the command exit non-zero, so it can
//! gate a training launch. The checks are the catalogue's ([`super::conditions`]), registered
//! in [`CHECKS`].
use super::check::{Check, Checks, Examine, Status, Window};
use super::conditions::{
    container_config, container_memory, ddp_environment, ghost_process, gpu_ecc_errors, gpu_lost,
    gpu_memory_high, gpu_temperature_high, gpu_xid_errors, host_namespaces, launch_gpus,
    nvml_latency, persistence_mode, sources, start_temperature, throttling,
};
pub use super::doctor_config::DoctorConfig;
use crate::model::Snapshot;
use serde::Serialize;
use std::time::Duration;

/// Each condition's own levels, written beside its alert rule.
impl Default for DoctorConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(5),
            start_temperature_ok_celsius: start_temperature::DOCTOR.ok,
            start_temperature_risk_celsius: start_temperature::DOCTOR.risk,
            peak_temperature_ok_celsius: gpu_temperature_high::DOCTOR.ok,
            peak_temperature_risk_celsius: gpu_temperature_high::DOCTOR.risk,
            gpu_memory_ok_percent: gpu_memory_high::DOCTOR.ok,
            gpu_memory_risk_percent: gpu_memory_high::DOCTOR.risk,
            container_memory_ok: container_memory::DOCTOR.ok,
            container_memory_risk: container_memory::DOCTOR.risk,
            nvml_latency_ok: nvml_latency::DOCTOR.ok,
            nvml_latency_risk: nvml_latency::DOCTOR.risk,
        }
    }
}

/// Every doctor check with the names it reports under, in the order the report lists them:
/// where the agent runs and its sources, then each GPU, ghosts, then each container.
pub const CHECKS: &[(&[&str], Examine)] = &[
    (&[host_namespaces::NAME], host_namespaces::examine),
    (
        &[sources::NVML, sources::DOCKER, sources::STALL_TRACING],
        sources::examine,
    ),
    (&[nvml_latency::NAME], nvml_latency::examine),
    (&[gpu_lost::NAME], gpu_lost::examine),
    (
        &[start_temperature::NAME, start_temperature::IN_USE],
        start_temperature::examine,
    ),
    (&[gpu_temperature_high::NAME], gpu_temperature_high::examine),
    (&[gpu_memory_high::NAME], gpu_memory_high::examine),
    (&[throttling::NAME], throttling::examine),
    (&[gpu_ecc_errors::NAME], gpu_ecc_errors::examine),
    (&[gpu_xid_errors::NAME], gpu_xid_errors::examine),
    (&[persistence_mode::NAME], persistence_mode::examine),
    (&[ghost_process::NAME], ghost_process::examine),
    (&[container_memory::NAME], container_memory::examine),
    (&container_config::NAMES, container_config::examine),
    (
        &[
            ddp_environment::RANKS,
            ddp_environment::VISIBLE_DEVICES,
            ddp_environment::NCCL,
        ],
        ddp_environment::examine,
    ),
];

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The worst status of all checks.
    pub status: Status,
    pub window_seconds: f64,
    pub samples: usize,
    pub checks: Vec<Check>,
}

/// Runs every check over `snaps`, oldest first, the per-GPU ones on the GPUs `launch` names
/// (all without one). No snapshot at all is a risk: nothing could be checked.
pub fn examine(
    snaps: &[Snapshot],
    config: &DoctorConfig,
    launch: Option<&launch_gpus::LaunchGpus>,
) -> Report {
    let Some(mut window) = Window::new(snaps, config) else {
        return Report {
            status: Status::Risk,
            window_seconds: 0.0,
            samples: 0,
            checks: Vec::new(),
        };
    };
    let mut checks = Checks::default();
    if let Some(l) = launch {
        let gpus = &window.last().gpus;
        launch_gpus::examine(l, gpus, &mut checks);
        window = window.for_launch_on(l.resolve(gpus).0);
    }
    for (_, examine) in CHECKS {
        examine(&window, &mut checks);
    }
    let first = &snaps[0];
    let span = window
        .last()
        .monotonic_ms
        .saturating_sub(first.monotonic_ms);
    Report {
        status: checks
            .0
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok),
        window_seconds: span as f64 / 1000.0,
        samples: snaps.len(),
        checks: checks.0,
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, process, snapshot};
    use crate::model::{BlindSpot, MemoryUsage, SourceState};
    use std::collections::BTreeMap;

    fn statuses(r: &Report) -> BTreeMap<(&str, &str), Status> {
        r.checks
            .iter()
            .map(|c| ((c.check, c.subject.as_str()), c.status))
            .collect()
    }

    /// docs/config.md's tables list every doctor check and every alert rule, and every check
    /// reports under a name it is registered with.
    #[test]
    fn the_docs_list_every_check_and_rule() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md"),
        )
        .expect("docs/config.md");
        // The names in the first cell of each table row.
        let listed: Vec<&str> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| ")?.split('|').next())
            .flat_map(|cell| cell.split('`').skip(1).step_by(2))
            .collect();
        let names: Vec<&str> = CHECKS.iter().flat_map(|(n, _)| n.iter().copied()).collect();
        for name in names.iter().chain(crate::health::rules::RULE_NAMES) {
            assert!(listed.contains(name), "docs/config.md does not list {name}");
        }
        let r = examine(&sick_window(), &DoctorConfig::default(), None);
        assert!(r.checks.len() >= 10, "{:#?}", r.checks);
        for c in &r.checks {
            assert!(names.contains(&c.check), "{} is not registered", c.check);
        }
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
        let r = examine(&snaps, &DoctorConfig::default(), None);
        assert_eq!(r.status, Status::Ok, "{:#?}", r.checks);
        assert!(r.checks.iter().any(|c| c.check == "gpu_ecc_errors"));
        assert!(r.checks.iter().all(|c| c.action.is_empty()));
    }

    /// `--no-nvml` (or `--no-docker`, `--no-ebpf`) is a choice, not a risk; NVML that fails
    /// to load is one; a private PID namespace is one too, and says how to fix it.
    #[test]
    fn sources_turned_off_are_no_finding_but_blind_spots_are() {
        let off = |nvml: SourceState| {
            let mut s = snapshot(0, vec![], vec![]);
            s.sources.nvml = nvml;
            s.sources.docker = SourceState::disabled("disabled");
            s.sources.ebpf = SourceState::disabled("disabled");
            let r = examine(&[s.clone(), s], &DoctorConfig::default(), None);
            (
                r.status,
                r.checks.iter().map(|c| c.check).collect::<Vec<_>>(),
            )
        };
        assert_eq!(off(SourceState::disabled("disabled")), (Status::Ok, vec![]));
        assert_eq!(
            off(SourceState::down("libnvidia-ml.so.1: not found")),
            (Status::Risk, vec!["nvml"])
        );
        let mut s = snapshot(0, vec![gpu(0)], vec![]);
        s.host.blind_spots = vec![BlindSpot::PrivatePidNamespace];
        let r = examine(&[s.clone(), s], &DoctorConfig::default(), None);
        let c = r
            .checks
            .iter()
            .find(|c| c.check == "host_namespaces")
            .unwrap();
        assert_eq!((r.status, c.status), (Status::Risk, Status::Risk));
        assert!(c.action.contains("--pid=host"), "{c:?}");
    }

    /// Six seconds of the monitoring articles' risks: hot from the start, memory nearly full
    /// and growing, throttled, ECC errors, an Xid, a slow driver, a ghost, a leaky container.
    fn sick_window() -> Vec<Snapshot> {
        let mut w = container("leaky");
        (0..6u64)
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
                    own_bytes: None,
                });
                let mut s = snapshot(i * 1000, vec![g], vec![w.clone()]);
                s.nvml_query_seconds = Some(if i == 3 { 0.7 } else { 0.002 });
                s
            })
            .collect()
    }

    #[test]
    fn the_articles_risks_are_risks() {
        let snaps = sick_window();
        let r = examine(&snaps, &DoctorConfig::default(), None);
        let s = statuses(&r);
        assert_eq!(r.status, Status::Risk);
        for key in [
            ("start_temperature", "GPU 0"),
            ("gpu_temperature_high", "GPU 0"),
            ("gpu_memory_high", "GPU 0"),
            ("throttling", "GPU 0"),
            ("gpu_ecc_errors", "GPU 0"),
            ("gpu_xid_errors", "GPU 0"),
            ("nvml_latency", "host"),
            ("ghost_process", "GPU 0 PID 4242"),
            ("container_memory", "leaky"),
        ] {
            assert_eq!(s.get(&key), Some(&Status::Risk), "{key:?}: {:#?}", r.checks);
        }
        assert_eq!(s[&("persistence_mode", "GPU 0")], Status::Warning);
    }

    /// `--gpu 1`, a free GPU: another tenant's container on GPU 0 is not checked; `--gpu 0`:
    /// it is.
    #[test]
    fn a_launch_on_other_gpus_leaves_other_tenants_containers_out() {
        let snaps: Vec<_> = sick_window()
            .into_iter()
            .map(|mut s| {
                s.gpus.push(gpu(1));
                s.workloads[0].gpu.per_gpu = vec![crate::model::WorkloadGpuShare::new(
                    0,
                    Some("GPU-00000000".into()),
                )];
                s
            })
            .collect();
        let on = |list: &str| {
            let launch = launch_gpus::LaunchGpus::declared(Some(list), |_| None).unwrap();
            statuses(&examine(&snaps, &DoctorConfig::default(), Some(&launch)))
                .contains_key(&("container_memory", "leaky"))
        };
        assert!(!on("1"), "another tenant's container, on GPU 0");
        assert!(on("0"), "the container on the launch's GPU");
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
        let r = examine(&snaps, &DoctorConfig::default(), None);
        assert_eq!(statuses(&r)[&("gpu_memory_high", "GPU 0")], Status::Warning);
    }
}
