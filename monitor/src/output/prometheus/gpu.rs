//! Per GPU: identity, the device's readings, the window's busy share and GPM activity, Xid
//! errors, processes and the memory no workload accounts for. Labels `gpu` and `uuid`.
use super::{bool_value, family, ratio_unit, with, Labels};
use crate::model::{DeviceReading, Gpu, Snapshot};
use crate::output::accounting::Accounting;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType::{Counter, Gauge};
use prometheus_client::registry::Unit;
use std::collections::BTreeMap;

fn labels(d: &DeviceReading) -> Labels {
    vec![
        ("gpu", d.index.to_string()),
        ("uuid", d.uuid.clone().unwrap_or_default()),
    ]
}

/// A reading of the device: name, help, unit, how to read it.
type DeviceGauge = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&DeviceReading) -> Option<f64>,
);

fn device_gauges() -> [DeviceGauge; 9] {
    [
        (
            "gpuwatch_gpu_utilization",
            "Share of the last sample period the GPU ran a kernel (NVML utilization.gpu).",
            ratio_unit(),
            |d| d.utilization_gpu_percent.map(|v| f64::from(v) / 100.0),
        ),
        (
            "gpuwatch_gpu_memory_utilization",
            "Share of the period device memory was read or written.",
            ratio_unit(),
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
    ]
}

/// A share of the completed window, 0–1: name, help, how to read it.
type WindowRatio = (&'static str, &'static str, fn(&Gpu) -> Option<f64>);

const WINDOW_RATIOS: [WindowRatio; 5] = [
    (
        "gpuwatch_gpu_busy",
        "Share of the last window a kernel ran on the GPU: the driver's utilisation series over \
         the window (the snapshot's busy.source says when it was another).",
        |g| g.busy.map(|b| b.fraction),
    ),
    (
        "gpuwatch_gpu_sm_activity",
        "GPM: share of the SMs busy, averaged over the span holding the last window.",
        |g| percent(g.sm_activity.and_then(|a| a.sm_percent)),
    ),
    (
        "gpuwatch_gpu_sm_occupancy",
        "GPM: share of the warp slots occupied, averaged over the span.",
        |g| percent(g.sm_activity.and_then(|a| a.sm_occupancy_percent)),
    ),
    (
        "gpuwatch_gpu_tensor_activity",
        "GPM: share of the time the tensor pipes worked, averaged over the span.",
        |g| percent(g.sm_activity.and_then(|a| a.tensor_percent)),
    ),
    (
        "gpuwatch_gpu_dram_bandwidth",
        "GPM: share of the DRAM bandwidth used, averaged over the span.",
        |g| percent(g.sm_activity.and_then(|a| a.dram_bandwidth_percent)),
    ),
];

/// A percent as a ratio.
fn percent(p: Option<f64>) -> Option<f64> {
    p.map(|p| p / 100.0)
}

pub(super) fn encode(
    enc: &mut DescriptorEncoder<'_>,
    s: &Snapshot,
    xid_totals: &BTreeMap<u32, u64>,
    accounting: &Accounting,
) -> Result<(), std::fmt::Error> {
    let devices: Vec<&DeviceReading> = s.gpus.iter().map(|g| &g.device).collect();
    let driver = s.host.nvml_driver_version.clone().unwrap_or_default();
    family(
        enc,
        "gpuwatch_gpu_info",
        "A GPU: its model and driver.",
        None,
        Gauge,
        devices.iter().map(|d| {
            let name = d.name.clone().unwrap_or_default();
            let extra = [("name", name), ("driver_version", driver.clone())];
            (with(labels(d), &extra), 1.0)
        }),
    )?;
    family(
        enc,
        "gpuwatch_gpu_lost",
        "1 when NVML reports the GPU lost (fallen off the bus).",
        None,
        Gauge,
        devices.iter().map(|d| (labels(d), bool_value(d.lost))),
    )?;
    for (name, help, unit, read) in device_gauges() {
        let samples = devices.iter().filter_map(|d| Some((labels(d), read(d)?)));
        family(enc, name, help, unit, Gauge, samples)?;
    }
    for (name, help, read) in WINDOW_RATIOS {
        let samples = s
            .gpus
            .iter()
            .filter_map(|g| Some((labels(&g.device), read(g)?)));
        family(enc, name, help, ratio_unit(), Gauge, samples)?;
    }
    family(
        enc,
        "gpuwatch_gpu_pcie_traffic_bytes_per_second",
        "PCIe traffic over the span holding the last window (direction: to_gpu, from_gpu; GPM, \
         or the driver's throughput counter on GPUs without it).",
        None,
        Gauge,
        s.gpus.iter().flat_map(|g| {
            g.pcie.into_iter().flat_map(move |p| {
                [
                    ("to_gpu", p.rx_bytes_per_second),
                    ("from_gpu", p.tx_bytes_per_second),
                ]
                .map(|(dir, v)| (with(labels(&g.device), &[("direction", dir.to_owned())]), v))
            })
        }),
    )?;
    family(
        enc,
        "gpuwatch_gpu_persistence_mode",
        "1 when persistence mode is on.",
        None,
        Gauge,
        devices
            .iter()
            .filter_map(|d| Some((labels(d), bool_value(d.persistence_mode?)))),
    )?;
    family(
        enc,
        "gpuwatch_gpu_clocks_event_reason",
        "1 per active clocks-event (throttle) reason.",
        None,
        Gauge,
        devices.iter().flat_map(|d| {
            d.clocks_event_reasons
                .iter()
                .map(|r| (with(labels(d), &[("reason", (*r).to_owned())]), 1.0))
        }),
    )?;
    family(
        enc,
        "gpuwatch_gpu_busy",
        "Seconds the GPU was busy (its utilisation series over each window) since the agent \
         started: increase() over a range is its busy GPU-hours times 3600.",
        Some(Unit::Seconds),
        Counter,
        devices
            .iter()
            .filter_map(|d| Some((labels(d), *accounting.gpu_busy_seconds.get(&d.index)?))),
    )?;
    family(
        enc,
        "gpuwatch_gpu_energy",
        "The GPU's energy since the agent started: its power reading times each window \
         (within 1 % of the driver's energy counter while the load is steady).",
        Some(Unit::Joules),
        Counter,
        devices
            .iter()
            .filter_map(|d| Some((labels(d), *accounting.gpu_energy_joules.get(&d.index)?))),
    )?;
    family(
        enc,
        "gpuwatch_gpu_xid_errors",
        "Xid errors the driver reported since the agent started.",
        None,
        Counter,
        devices.iter().map(|d| {
            let n = xid_totals.get(&d.index).copied().unwrap_or(0);
            (labels(d), n as f64)
        }),
    )?;
    family(
        enc,
        "gpuwatch_gpu_processes",
        "Processes holding a context on the GPU.",
        None,
        Gauge,
        s.gpus
            .iter()
            .map(|g| (labels(&g.device), g.processes.len() as f64)),
    )?;
    family(
        enc,
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
            (labels(&g.device), bytes as f64)
        }),
    )
}
