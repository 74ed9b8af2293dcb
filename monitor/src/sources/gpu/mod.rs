//! The GPU source: NVML through nvml-wrapper, on the sampler's own thread, never on a request
//! path. Two kinds of call, by cost (H200 figures; docs/gpu-sampling.md has the table):
//!
//! - every round, the cheap state: utilisation as nvidia-smi reads it, memory, temperature,
//!   power, clocks and throttle reasons (each call 3–150 µs of CPU under load on the H200, the
//!   first after the thread slept dearest); the process lists (220–320 µs) only when the
//!   device's used memory changed, or every few rounds (see [`ListReuse`]);
//! - every series fetch (the sampler decides when), what costs milliseconds and keeps: the
//!   device's utilisation series (`GetSamples`, ~2 ms, 14 s of history), GPM's SM activity
//!   (~1.4 ms), and, only for GPUs that several workloads share and whose split the sampler
//!   cannot settle from CPU time, the driver's per-process split (`GetProcessUtilization`,
//!   ~2 ms). A GPU held by one workload needs no per-process call.
//!
//! Static facts (UUID, name) are read once per device; list calls reuse their buffers.
pub mod driver_list;
mod gpm;
mod raw;
pub mod series;
pub mod xid;

use crate::events::{EventCounters, NvmlCallFailed};
use crate::model::{
    DeviceReading, GpmState, PcieSource, PcieTraffic, ProcessKind, ProcessReading, SmActivity,
};
use driver_list::ListChange;
use gpm::Gpm;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t, nvmlSample_t,
};
use series::{UtilSeries, WindowBusy};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xid::XidWatch;

/// Configuration of the GPU source.
#[derive(Clone, Debug)]
pub struct GpuSourceConfig {
    /// The NVML library to load; `None` loads `libnvidia-ml.so` from the loader's search path.
    pub lib_path: Option<PathBuf>,
    /// The driver's list of its GPUs ([`driver_list`]), compared with the one at open to tell
    /// when NVML must be opened again.
    pub driver_list: PathBuf,
}

/// Where the driver lists its GPUs.
pub const DRIVER_LIST: &str = "/proc/driver/nvidia/gpus";

impl Default for GpuSourceConfig {
    fn default() -> Self {
        Self {
            lib_path: None,
            driver_list: PathBuf::from(DRIVER_LIST),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuSourceError {
    #[error("cannot load NVML from {lib}: {source}")]
    Init { lib: String, source: NvmlError },
    #[error("NVML loaded but cannot count GPUs: {0}")]
    Count(NvmlError),
}

/// The driver's per-process figures over one span: for each process it credited with sample
/// periods, its periods' utilisation summed over the number of periods in the span (each period
/// goes wholly to the busiest process; see docs/gpu-sampling.md).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSplit {
    /// The span (µs since the epoch): from the previous per-process query to this one.
    pub start_us: u64,
    pub end_us: u64,
    /// (pid, SM percent, memory percent).
    pub processes: Vec<(u32, u32, u32)>,
}

/// What one series fetch brought for one GPU, beyond the series itself.
#[derive(Clone, Debug, Default)]
pub struct DeviceFetch {
    pub index: u32,
    /// GPM's averages since the previous fetch (`None`: not supported, first fetch, or failed).
    pub sm_activity: Option<SmActivity>,
    /// PCIe traffic: GPM's over the same span, or the driver's counter where there is no GPM.
    pub pcie: Option<PcieTraffic>,
    /// The per-process split, for the GPUs it was asked for.
    pub split: Option<ProcessSplit>,
    /// Failed calls, by field (`utilization_samples`, `gpm`, `process_utilization`).
    pub errors: BTreeMap<&'static str, String>,
}

struct DeviceCursor {
    index: u32,
    uuid: Option<String>,
    name: Option<String>,
    minor_number: Option<u32>,
    compute: Vec<nvmlProcessInfo_t>,
    graphics: Vec<nvmlProcessInfo_t>,
    /// The process lists as last read, and what makes them still true (see [`ListReuse`]).
    lists: ListReuse,
    /// The device's utilisation series and the newest sample fetched.
    series: UtilSeries,
    series_buf: Vec<nvmlSample_t>,
    /// False once GetSamples answered NOT_SUPPORTED: the series is never fetched again.
    series_supported: bool,
    gpm: Option<Gpm>,
    gpm_state: GpmState,
    /// False once the PCIe counter answered NOT_SUPPORTED (it is read only without GPM).
    pcie_counter: bool,
    /// The per-process query's cursor (µs) and buffer.
    split_last_seen_us: u64,
    split_buf: Vec<nvmlProcessUtilizationSample_t>,
    /// Fields that change rarely, and the readings left before they are read again.
    slow: SlowFields,
    /// Calls that failed when the GPU was opened (its name, minor number, the Xid watch):
    /// shown in every reading's `errors` for as long as what they read stays unknown.
    open_errors: BTreeMap<&'static str, String>,
}

/// The process lists are read again at least once every this many rounds.
pub const LISTS_AT_MOST_EVERY: u32 = 10;

/// When a round may reuse the last process lists instead of asking the driver (the compute list
/// costs 220–320 µs of CPU on the H200 under load, the round's dearest call). A process cannot
/// start, end or change its allocation without the device's used memory changing, so the lists
/// still hold while that figure is exactly the same and no more than [`LISTS_AT_MOST_EVERY`]
/// rounds have passed. Any doubt reads them again: a failed call, a different figure, or a
/// listed process the sampler found gone ([`GpuSource::relist`]: it checks every listed PID's
/// liveness anyway).
#[derive(Debug, Default)]
struct ListReuse {
    /// Device memory used when the lists were read; `None`: read them.
    memory_used: Option<u64>,
    n_compute: usize,
    n_graphics: usize,
    rounds_left: u32,
    /// Lists read and reused since start (for the benchmark).
    read: u64,
    reused: u64,
}

impl ListReuse {
    fn still_true(&self, memory_used: Option<u64>) -> bool {
        self.rounds_left > 0 && memory_used.is_some() && self.memory_used == memory_used
    }
}

/// Slow-changing fields (ECC counts, persistence mode, the power limit) are read once every this
/// many rounds, not every round: each call costs tens of microseconds on a real GPU.
pub const SLOW_FIELDS_EVERY: u32 = 30;

#[derive(Debug, Default)]
struct SlowFields {
    rounds_left: u32,
    ecc_uncorrected_volatile: Option<u64>,
    persistence_mode: Option<bool>,
    /// Changes only when an operator sets it (`nvidia-smi -pl`).
    power_limit_watts: Option<f64>,
    /// The failures of the last slow read, shown until the next one.
    errors: BTreeMap<&'static str, String>,
}

/// The fields of [`SlowFields`], as named in a reading's `errors`.
const SLOW_FIELD_NAMES: [&str; 3] = ["ecc_errors", "persistence_mode", "power_limit"];

/// The open NVML library and a cursor per GPU.
pub struct GpuSource {
    nvml: Nvml,
    devices: Vec<DeviceCursor>,
    events: Arc<EventCounters>,
    pub driver_version: Option<String>,
    /// Xid events of every device that can report them; `None` when NVML cannot.
    xid: Option<XidWatch>,
    /// The driver's list of GPUs as it was when NVML was opened (`None`: unreadable then).
    driver_list: (PathBuf, Option<BTreeSet<String>>),
}

impl Drop for GpuSource {
    fn drop(&mut self) {
        if let Some(x) = self.xid.take() {
            x.close(&self.nvml);
        }
        for c in &mut self.devices {
            if let Some(g) = c.gpm.take() {
                g.close(&self.nvml);
            }
        }
    }
}

/// `NVML_VALUE_NOT_AVAILABLE` for 64-bit values.
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;

impl GpuSource {
    pub fn open(
        config: &GpuSourceConfig,
        events: Arc<EventCounters>,
    ) -> Result<Self, GpuSourceError> {
        let mut builder = Nvml::builder();
        if let Some(path) = &config.lib_path {
            builder.lib_path(path.as_os_str());
        }
        // Read before NVML enumerates: a GPU bound in between is then a change, seen later.
        let driver_list = read_driver_list(&config.driver_list);
        let lib = config
            .lib_path
            .as_ref()
            .map_or_else(|| "libnvidia-ml.so".to_owned(), |p| p.display().to_string());
        let nvml = builder
            .init()
            .map_err(|source| GpuSourceError::Init { lib, source })?;
        let count = nvml.device_count().map_err(GpuSourceError::Count)?;
        let driver_version = nvml.sys_driver_version().ok();
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut open_errors = BTreeMap::new();
            let (uuid, name, minor_number) = match nvml.device_by_index(index) {
                Ok(d) => {
                    let mut failed = OpenFailures {
                        index,
                        events: &events,
                        errors: &mut open_errors,
                    };
                    let name = failed.known("name", d.name());
                    let minor_number = failed.known("minor_number", d.minor_number());
                    (d.uuid().ok(), name, minor_number)
                }
                Err(e) => {
                    events.emit(NvmlCallFailed::on_gpu(index, "handle", &e));
                    (None, None, None)
                }
            };
            let (gpm, gpm_state) = open_gpm(&nvml, index);
            devices.push(DeviceCursor {
                index,
                uuid,
                name,
                minor_number,
                compute: Vec::new(),
                graphics: Vec::new(),
                lists: ListReuse::default(),
                series: UtilSeries::default(),
                series_buf: Vec::new(),
                series_supported: true,
                gpm,
                gpm_state,
                pcie_counter: true,
                split_last_seen_us: 0,
                split_buf: Vec::new(),
                slow: SlowFields::default(),
                open_errors,
            });
        }
        let xid = open_xid_watch(&nvml, &mut devices, &events);
        Ok(Self {
            nvml,
            devices,
            events,
            driver_version,
            xid,
            driver_list: (config.driver_list.clone(), driver_list),
        })
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// How the driver's list of GPUs differs from the one NVML was opened on; `None` when it
    /// is the same, or cannot be read now (a list that could not be read at open and can now
    /// is a change: NVML may have missed GPUs).
    pub fn driver_list_change(&self) -> Option<ListChange> {
        let (dir, then) = &self.driver_list;
        let now = read_driver_list(dir)?;
        ListChange::between(then.as_ref().unwrap_or(&BTreeSet::new()), &now)
    }

    /// Makes the next round read GPU `index`'s process lists from the driver: a process it
    /// listed is gone.
    pub fn relist(&mut self, index: u32) {
        if let Some(c) = self.devices.iter_mut().find(|c| c.index == index) {
            c.lists.rounds_left = 0;
        }
    }

    /// How many times the process lists were read from the driver, and reused, since start.
    pub fn list_reads(&self) -> (u64, u64) {
        self.devices
            .iter()
            .fold((0, 0), |(r, u), c| (r + c.lists.read, u + c.lists.reused))
    }

    /// The costly part, once per series fetch: every GPU's utilisation series since the last
    /// fetch, GPM's averages since then, and the per-process split for the GPUs listed in
    /// `split_for` (those several workloads share). Failures are counted and returned per GPU;
    /// they never stop the others.
    pub fn fetch(&mut self, now_ms: u64, split_for: &[u32]) -> Vec<DeviceFetch> {
        let (nvml, events) = (&self.nvml, &self.events);
        let mut out = Vec::with_capacity(self.devices.len());
        for cursor in &mut self.devices {
            let index = cursor.index;
            let mut fetch = DeviceFetch {
                index,
                ..Default::default()
            };
            let Ok(device) = nvml.device_by_index(index) else {
                out.push(fetch); // the round's reading records the failure
                continue;
            };
            // SAFETY: the handle belongs to `nvml`, which outlives this call.
            let handle = unsafe { device.handle() };
            let lib = nvml.lib();
            let fail = |field: &'static str, e: NvmlError, fetch: &mut DeviceFetch| {
                events.emit(NvmlCallFailed::on_gpu(index, field, &e));
                fetch.errors.insert(field, e.to_string());
            };
            if cursor.series_supported {
                let since = cursor.series.covered_through().unwrap_or(0);
                match raw::utilization_samples(
                    lib.nvmlDeviceGetSamples.as_ref(),
                    handle,
                    since,
                    &mut cursor.series_buf,
                ) {
                    Ok(samples) => cursor.series.extend(samples),
                    Err(NvmlError::NotSupported) => cursor.series_supported = false,
                    Err(e) => fail("utilization_samples", e, &mut fetch),
                }
            }
            if let Some(g) = cursor.gpm.as_mut() {
                match g.sample(nvml, handle, now_ms) {
                    Ok(span) => {
                        fetch.sm_activity = span.as_ref().map(|s| s.activity);
                        fetch.pcie = span.and_then(|s| s.pcie);
                    }
                    Err(e) => fail("gpm", e, &mut fetch),
                }
            } else if cursor.pcie_counter {
                match pcie_counter(&device, now_ms) {
                    Ok(p) => fetch.pcie = Some(p),
                    Err(NvmlError::NotSupported) => cursor.pcie_counter = false,
                    Err(e) => fail("pcie_throughput", e, &mut fetch),
                }
            }
            if split_for.contains(&cursor.index) {
                let start_us = cursor.split_last_seen_us;
                match raw::process_utilization(
                    lib.nvmlDeviceGetProcessUtilization.as_ref(),
                    handle,
                    start_us,
                    &mut cursor.split_buf,
                ) {
                    Ok(n) => {
                        let entries = &cursor.split_buf[..n];
                        let end_us = now_ms * 1000;
                        cursor.split_last_seen_us = entries
                            .iter()
                            .map(|s| s.timeStamp)
                            .max()
                            .unwrap_or(start_us)
                            .max(start_us);
                        fetch.split = Some(ProcessSplit {
                            start_us,
                            end_us,
                            processes: entries
                                .iter()
                                .map(|s| (s.pid, s.smUtil.min(100), s.memUtil.min(100)))
                                .collect(),
                        });
                    }
                    Err(e) => fail("process_utilization", e, &mut fetch),
                }
            } else {
                // The next split spans from now: a GPU that becomes shared is not charged with
                // periods from before.
                cursor.split_last_seen_us = now_ms * 1000;
            }
            out.push(fetch);
        }
        out
    }

    /// The busy share of GPU `index` over the window (a, b] (µs since the epoch), from its
    /// utilisation series; `None` when the series does not reach the window or is unavailable.
    pub fn busy(&self, index: u32, a_us: u64, b_us: u64) -> Option<WindowBusy> {
        self.cursor(index)?.series.busy(a_us, b_us)
    }

    /// How far GPU `index`'s series is known (µs since the epoch); `None` for a GPU without a
    /// series (not supported, lost, or nothing fetched yet).
    pub fn covered_through(&self, index: u32) -> Option<u64> {
        self.cursor(index)
            .filter(|c| c.series_supported)?
            .series
            .covered_through()
    }

    /// Whether GPU `index` can deliver a utilisation series at all.
    pub fn has_series(&self, index: u32) -> bool {
        self.cursor(index).is_some_and(|c| c.series_supported)
    }

    pub fn gpm_state(&self, index: u32) -> Option<&GpmState> {
        self.cursor(index).map(|c| &c.gpm_state)
    }

    /// Drops series samples older than `t_us`: no window still to be answered reaches back.
    pub fn forget_before(&mut self, t_us: u64) {
        for c in &mut self.devices {
            c.series.forget_before(t_us);
        }
    }

    fn cursor(&self, index: u32) -> Option<&DeviceCursor> {
        self.devices.iter().find(|c| c.index == index)
    }

    /// Reads every GPU once. Never fails as a whole: a failed query leaves its field empty and
    /// its error in the device's `errors`.
    pub fn collect(&mut self) -> Vec<DeviceReading> {
        let mut out = Vec::with_capacity(self.devices.len());
        for cursor in &mut self.devices {
            out.push(read_device(&self.nvml, cursor, &self.events));
        }
        if let Some(x) = &self.xid {
            let mut xids = Vec::new();
            if let Err(e) = x.drain(&self.nvml, &mut xids) {
                self.events
                    .emit(NvmlCallFailed::library("reading Xid events", &e));
                for r in &mut out {
                    r.errors
                        .insert(XID_FIELD, format!("reading Xid events: {e}"));
                }
            }
            for (index, xid) in xids {
                tracing::warn!("GPU {index}: Xid {xid}: {}", crate::model::xid_meaning(xid));
                if let Some(r) = out.iter_mut().find(|r| r.index == index) {
                    r.xid_events.push(xid);
                }
            }
        }
        out
    }
}

fn read_driver_list(dir: &Path) -> Option<BTreeSet<String>> {
    driver_list::read(dir)
        .inspect_err(|e| tracing::debug!("reading {}: {e}", dir.display()))
        .ok()
}

/// Calls made when a GPU is opened: a failure is counted and kept in its `errors`
/// (NotSupported is absence, not a failure).
struct OpenFailures<'a> {
    index: u32,
    events: &'a EventCounters,
    errors: &'a mut BTreeMap<&'static str, String>,
}

impl OpenFailures<'_> {
    fn known<T>(&mut self, field: &'static str, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => None,
            Err(e) => {
                self.events
                    .emit(NvmlCallFailed::on_gpu(self.index, field, &e));
                self.errors.insert(field, e.to_string());
                None
            }
        }
    }
}

/// The field a failed Xid watch is shown under in a reading's `errors`: without it, Xid
/// errors are not seen, and an empty `xid_events` would read as none.
const XID_FIELD: &str = "xid_events";

/// Registers every reachable device for Xid events; NOT_SUPPORTED (some GPUs, vGPUs) is not a
/// failure, anything else is counted and shown in the device's `errors`.
fn open_xid_watch(
    nvml: &Nvml,
    devices: &mut [DeviceCursor],
    events: &EventCounters,
) -> Option<XidWatch> {
    let handles: Vec<(nvmlDevice_t, u32)> = devices
        .iter()
        .filter_map(|c| {
            let d = nvml.device_by_index(c.index).ok()?;
            // SAFETY: the handle belongs to `nvml`, which the watch never outlives.
            Some((unsafe { d.handle() }, c.index))
        })
        .collect();
    match XidWatch::open(nvml, &handles) {
        Ok((watch, failed)) => {
            for (index, e) in failed {
                if !matches!(e, NvmlError::NotSupported) {
                    events.emit(NvmlCallFailed::on_gpu(
                        index,
                        "registering for Xid events",
                        &e,
                    ));
                    if let Some(c) = devices.iter_mut().find(|c| c.index == index) {
                        c.open_errors
                            .insert(XID_FIELD, format!("registering for Xid events: {e}"));
                    }
                }
            }
            Some(watch)
        }
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            events.emit(NvmlCallFailed::library("creating the Xid event set", &e));
            for c in devices.iter_mut() {
                c.open_errors
                    .insert(XID_FIELD, format!("creating the Xid event set: {e}"));
            }
            None
        }
    }
}

/// GPM for device `index`: available, not supported (no GPM before Hopper), or failed.
/// PCIe traffic from the driver's own counters, for a GPU without GPM: each call samples for
/// ~20 ms (measured on the H100 host: 20.6–20.9 ms of wall time, ~0.75 ms of CPU), so it is
/// read once per series fetch, each way. KB/s as NVML gives it (the H100's pageable-copy step
/// read 4.81 GB/s on it against GPM's 5.32 GB/s over the whole span).
fn pcie_counter(device: &nvml_wrapper::Device<'_>, now_ms: u64) -> Result<PcieTraffic, NvmlError> {
    use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
    let rx = device.pcie_throughput(PcieUtilCounter::Receive)?;
    let tx = device.pcie_throughput(PcieUtilCounter::Send)?;
    Ok(PcieTraffic {
        start_unix_ms: now_ms.saturating_sub(20),
        end_unix_ms: now_ms,
        rx_bytes_per_second: f64::from(rx) * 1000.0,
        tx_bytes_per_second: f64::from(tx) * 1000.0,
        source: PcieSource::ThroughputCounter,
    })
}

fn open_gpm(nvml: &Nvml, index: u32) -> (Option<Gpm>, GpmState) {
    let handle = match nvml.device_by_index(index) {
        // SAFETY: the handle belongs to `nvml`, which the cursor never outlives.
        Ok(d) => unsafe { d.handle() },
        Err(e) => return (None, GpmState::Failed(e.to_string())),
    };
    match Gpm::open(nvml, handle) {
        Ok(Some(g)) => (Some(g), GpmState::Available),
        Ok(None) | Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => {
            (None, GpmState::NotSupported)
        }
        Err(e) => (None, GpmState::Failed(e.to_string())),
    }
}

/// Records a query's outcome: the value, or `None` with the error noted (NotSupported is simply
/// absent: many GPUs lack some sensors, and that is no failure).
struct Recorder<'a> {
    reading: &'a mut DeviceReading,
    events: &'a EventCounters,
}

impl Recorder<'_> {
    fn take<T>(&mut self, field: &'static str, result: Result<T, NvmlError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => None,
            Err(e) => {
                if matches!(e, NvmlError::GpuLost) {
                    self.reading.lost = true;
                }
                self.events
                    .emit(NvmlCallFailed::on_gpu(self.reading.index, field, &e));
                self.reading.errors.insert(field, e.to_string());
                None
            }
        }
    }
}

fn read_device(nvml: &Nvml, cursor: &mut DeviceCursor, events: &EventCounters) -> DeviceReading {
    let mut reading = DeviceReading {
        index: cursor.index,
        uuid: cursor.uuid.clone(),
        name: cursor.name.clone(),
        minor_number: cursor.minor_number,
        ..Default::default()
    };
    let mut rec = Recorder {
        reading: &mut reading,
        events,
    };
    let Some(device) = rec.take("handle", nvml.device_by_index(cursor.index)) else {
        return reading;
    };
    if cursor.uuid.is_none() {
        // A GPU that failed at start may have come back.
        cursor.uuid = rec.take("uuid", device.uuid());
        cursor.name = device.name().ok();
        cursor.minor_number = device.minor_number().ok();
        rec.reading.uuid = cursor.uuid.clone();
        rec.reading.name = cursor.name.clone();
        rec.reading.minor_number = cursor.minor_number;
    }
    if let Some(u) = rec.take("utilization", device.utilization_rates()) {
        rec.reading.utilization_gpu_percent = Some(u.gpu);
        rec.reading.utilization_memory_percent = Some(u.memory);
    }
    if let Some(m) = rec.take("memory", device.memory_info()) {
        rec.reading.memory_used_bytes = Some(m.used);
        rec.reading.memory_total_bytes = Some(m.total);
    }
    rec.reading.temperature_celsius =
        rec.take("temperature", device.temperature(TemperatureSensor::Gpu));
    rec.reading.power_watts = rec
        .take("power", device.power_usage())
        .map(|mw| f64::from(mw) / 1000.0);

    rec.reading.sm_clock_mhz = rec.take("sm_clock", device.clock_info(Clock::SM));
    if let Some(r) = rec.take("clocks_event_reasons", device.current_throttle_reasons()) {
        rec.reading.clocks_event_reasons = reason_names(r);
    }
    if cursor.slow.rounds_left == 0 {
        cursor.slow.rounds_left = SLOW_FIELDS_EVERY;
        cursor.slow.ecc_uncorrected_volatile = rec.take(
            SLOW_FIELD_NAMES[0],
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        );
        cursor.slow.persistence_mode =
            rec.take(SLOW_FIELD_NAMES[1], device.is_in_persistent_mode());
        cursor.slow.power_limit_watts = rec
            .take(SLOW_FIELD_NAMES[2], device.enforced_power_limit())
            .map(|mw| f64::from(mw) / 1000.0);
        cursor.slow.errors = SLOW_FIELD_NAMES
            .iter()
            .filter_map(|f| Some((*f, rec.reading.errors.get(f)?.clone())))
            .collect();
    } else {
        rec.reading.errors.extend(cursor.slow.errors.clone());
    }
    cursor.slow.rounds_left -= 1;
    rec.reading.errors.extend(
        cursor
            .open_errors
            .iter()
            .filter(|(f, _)| match **f {
                "name" => cursor.name.is_none(),
                "minor_number" => cursor.minor_number.is_none(),
                _ => true,
            })
            .map(|(f, e)| (*f, e.clone())),
    );
    rec.reading.ecc_uncorrected_volatile = cursor.slow.ecc_uncorrected_volatile;
    rec.reading.persistence_mode = cursor.slow.persistence_mode;
    rec.reading.power_limit_watts = cursor.slow.power_limit_watts;

    // SAFETY: the handle belongs to `nvml`, which outlives this call.
    let handle = unsafe { device.handle() };
    let memory_used = rec.reading.memory_used_bytes;
    let lists = &mut cursor.lists;
    if lists.still_true(memory_used) {
        lists.rounds_left -= 1;
        lists.reused += 1;
    } else {
        let (n_compute, n_graphics) = read_lists(nvml.lib(), handle, cursor, &mut rec);
        let lists = &mut cursor.lists;
        *lists = ListReuse {
            memory_used: memory_used.filter(|_| rec.reading.errors.is_empty()),
            n_compute,
            n_graphics,
            rounds_left: LISTS_AT_MOST_EVERY - 1,
            read: lists.read + 1,
            reused: lists.reused,
        };
    }
    let lists = &cursor.lists;
    rec.reading.processes = merge_processes(
        &cursor.compute[..lists.n_compute],
        &cursor.graphics[..lists.n_graphics],
    );
    reading
}

/// Reads the compute and graphics lists; returns how many of each.
fn read_lists(
    lib: &nvml_wrapper_sys::bindings::NvmlLib,
    handle: nvmlDevice_t,
    cursor: &mut DeviceCursor,
    rec: &mut Recorder<'_>,
) -> (usize, usize) {
    let compute = raw::list_processes(
        lib.nvmlDeviceGetComputeRunningProcesses_v3.as_ref(),
        handle,
        &mut cursor.compute,
    );
    let n_compute = rec.take("compute_processes", compute).unwrap_or(0);
    let graphics = raw::list_processes(
        lib.nvmlDeviceGetGraphicsRunningProcesses_v3.as_ref(),
        handle,
        &mut cursor.graphics,
    );
    let n_graphics = rec.take("graphics_processes", graphics).unwrap_or(0);
    (n_compute, n_graphics)
}

fn reason_names(r: ThrottleReasons) -> Vec<&'static str> {
    const NAMES: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    NAMES
        .iter()
        .filter(|(f, _)| r.contains(*f))
        .map(|(_, n)| *n)
        .collect()
}

/// Joins the compute and graphics lists into one entry per PID (NVML lists a PID once per list).
fn merge_processes(
    compute: &[nvmlProcessInfo_t],
    graphics: &[nvmlProcessInfo_t],
) -> Vec<ProcessReading> {
    let memory =
        |p: &nvmlProcessInfo_t| (p.usedGpuMemory != VALUE_NOT_AVAILABLE).then_some(p.usedGpuMemory);
    let mut out: Vec<ProcessReading> = Vec::with_capacity(compute.len() + graphics.len());
    out.extend(compute.iter().map(|p| ProcessReading {
        pid: p.pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: memory(p),
    }));
    if graphics.is_empty() {
        return out;
    }
    let index: std::collections::HashMap<u32, usize> =
        out.iter().enumerate().map(|(i, p)| (p.pid, i)).collect();
    for p in graphics {
        match index.get(&p.pid) {
            Some(&i) => {
                let e = &mut out[i];
                e.kind = ProcessKind::ComputeAndGraphics;
                e.used_memory_bytes = e.used_memory_bytes.max(memory(p));
            }
            None => out.push(ProcessReading {
                pid: p.pid,
                kind: ProcessKind::Graphics,
                used_memory_bytes: memory(p),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, mem: u64) -> nvmlProcessInfo_t {
        nvmlProcessInfo_t {
            pid,
            usedGpuMemory: mem,
            gpuInstanceId: u32::MAX,
            computeInstanceId: u32::MAX,
        }
    }

    #[test]
    fn merges_compute_and_graphics_lists() {
        let out = merge_processes(
            &[info(1, 100), info(2, VALUE_NOT_AVAILABLE)],
            &[info(1, 120), info(3, 5)],
        );
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].kind, ProcessKind::ComputeAndGraphics);
        assert_eq!(out[0].used_memory_bytes, Some(120));
        assert_eq!(
            out[1].used_memory_bytes, None,
            "not available is unknown, not 0"
        );
        assert_eq!(out[2].kind, ProcessKind::Graphics);
    }
}
