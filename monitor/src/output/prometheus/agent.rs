//! The agent itself: whether each source delivers, the build, the process every exporter
//! reports, the last round's timing and the agent's own failures.
use super::{bool_value, family, Labels};
use crate::model::Snapshot;
use crate::output::process_metrics::{self, REVISION};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType::{Counter, Gauge};
use prometheus_client::registry::Unit;

/// `hung`: the source the round in progress has waited on past the stall limit.
pub(super) fn encode(
    enc: &mut DescriptorEncoder<'_>,
    s: &Snapshot,
    hung: Option<&str>,
) -> Result<(), std::fmt::Error> {
    family(
        enc,
        "gpuwatch_up",
        "Whether a source delivers (1) or is down, disabled or hung in the round in progress (0).",
        None,
        Gauge,
        [
            ("nvml", &s.sources.nvml),
            ("docker", &s.sources.docker),
            ("ebpf", &s.sources.ebpf),
        ]
        .map(|(name, st)| {
            let up = st.up && hung != Some(name);
            (vec![("source", name.to_owned())], bool_value(up))
        }),
    )?;
    encode_process(enc)?;
    let one = |v: f64| [(Labels::new(), v)];
    family(
        enc,
        "gpuwatch_collection_duration",
        "Wall time of the last sampling round.",
        Some(Unit::Seconds),
        Gauge,
        one(s.collection_seconds),
    )?;
    let cpu = &s.sampling_cpu_seconds;
    family(
        enc,
        "gpuwatch_sampling_cpu",
        "The sampling thread's CPU time since start, by the step of a round it was spent in.",
        Some(Unit::Seconds),
        Counter,
        [
            ("nvml_readings", cpu.nvml_readings),
            ("nvml_series", cpu.nvml_series),
            ("host_readings", cpu.host_readings),
            ("process_readings", cpu.process_readings),
            ("cgroup_readings", cpu.cgroup_readings),
            ("probe_readings", cpu.probe_readings),
            ("publishing", cpu.publishing),
            ("other", cpu.other),
        ]
        .map(|(step, v)| (vec![("step", step.to_owned())], v)),
    )?;
    family(
        enc,
        "gpuwatch_last_collection_timestamp",
        "When the last sampling round ended, as a Unix time.",
        Some(Unit::Seconds),
        Gauge,
        one(s.taken_at_unix_ms as f64 / 1000.0),
    )?;
    family(
        enc,
        "gpuwatch_nvml_query_duration",
        "Wall time of the last round's NVML queries.",
        Some(Unit::Seconds),
        Gauge,
        s.nvml_query_seconds.map(|v| (Labels::new(), v)),
    )?;
    family(
        enc,
        "gpuwatch_internal_events",
        "The agent's own failures, by name (docs/snapshot-schema.md lists them).",
        None,
        Counter,
        s.internal_events
            .iter()
            .map(|(name, n)| (vec![("event", (*name).to_owned())], *n as f64)),
    )
}

/// The build, and the agent's own process as every exporter reports it.
fn encode_process(enc: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
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
    let families = [
        (
            "process_cpu",
            "User and system CPU time of the agent.",
            Some(Unit::Seconds),
            Counter,
            p.cpu_seconds_total,
        ),
        (
            "process_resident_memory",
            "Resident memory of the agent.",
            Some(Unit::Bytes),
            Gauge,
            p.resident_memory_bytes,
        ),
        (
            "process_start_time",
            "When the agent started, since the Unix epoch.",
            Some(Unit::Seconds),
            Gauge,
            p.start_time_seconds,
        ),
        (
            "process_open_fds",
            "Open file descriptors of the agent.",
            None,
            Gauge,
            p.open_fds,
        ),
        (
            "process_max_fds",
            "The agent's open-file limit.",
            None,
            Gauge,
            p.max_fds,
        ),
    ];
    for (name, help, unit, kind, v) in families {
        family(enc, name, help, unit, kind, [(Labels::new(), v)])?;
    }
    Ok(())
}
