//! The GPU source: NVML through nvml-wrapper, one reading per sampling round.
//!
//! Runs on the sampler's own thread, never on a request path. Static facts (UUID, name) are read
//! once per device. The two per-round list calls (`GetComputeRunningProcesses_v3`,
//! `GetProcessUtilization`) go through the raw symbols with buffers reused across rounds, and
//! call NVML once when the buffer is large enough (nvml-wrapper sizes with a second call and
//! allocates each time; `GetProcessUtilization` alone costs 1.4–2 ms per call on an H200).
use super::xid::{self, XidWatch};
use crate::events::{EventCounters, InternalEvent};
use crate::gpu_activity::SampleIntegrator;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::os::raw::c_uint;
use std::path::PathBuf;
use std::sync::Arc;

/// Configuration of the GPU source.
#[derive(Clone, Debug, Default)]
pub struct GpuSourceConfig {
    /// The NVML library to load; `None` loads `libnvidia-ml.so` from the loader's search path.
    pub lib_path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum GpuSourceError {
    #[error("cannot load NVML from {lib}: {source}")]
    Init { lib: String, source: NvmlError },
    #[error("NVML loaded but cannot count GPUs: {0}")]
    Count(NvmlError),
}

/// One GPU's state in one round. Fields are `None` when the GPU does not support the query or the
/// query failed (the failure is in `errors`, keyed by field).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceReading {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    /// True when NVML reported the GPU lost (fallen off the bus).
    pub lost: bool,
    pub utilization_gpu_percent: Option<u32>,
    pub utilization_memory_percent: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_celsius: Option<u32>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    /// Active clocks-event (throttle) reasons, e.g. `sw_power_cap`, `hw_thermal_slowdown`.
    pub clocks_event_reasons: Vec<&'static str>,
    /// Volatile uncorrected ECC errors since the driver loaded (`None`: no ECC, or not read
    /// yet). Read every [`SLOW_FIELDS_EVERY`] rounds.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Persistence mode; read every [`SLOW_FIELDS_EVERY`] rounds.
    pub persistence_mode: Option<bool>,
    /// Xid errors the driver reported since the previous reading (see [`super::xid`]).
    pub xid_events: Vec<u64>,
    /// The driver's per-process sample period as observed (milliseconds).
    pub process_sample_period_ms: f64,
    #[serde(skip)]
    pub processes: Vec<ProcessReading>,
    pub errors: BTreeMap<&'static str, String>,
}

/// How a process uses a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    Compute,
    Graphics,
    ComputeAndGraphics,
}

/// One process on one GPU in one round.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessReading {
    pub pid: u32,
    pub kind: ProcessKind,
    /// GPU memory used by the process; `None` when NVML cannot tell (e.g. under some vGPUs).
    pub used_memory_bytes: Option<u64>,
    /// Mean SM utilisation over the samples since the previous round; `None` with no samples
    /// (NVML returns samples only for processes active since the last query).
    pub sm_util_percent: Option<f64>,
    pub mem_util_percent: Option<f64>,
    /// Number of NVML utilisation samples behind the two means.
    pub samples: u32,
    /// Seconds of full-GPU SM activity the samples stand for (`sm% × covered time`, see
    /// [`crate::gpu_activity`]); divided by the window, the process's GPU busy fraction.
    pub sm_busy_seconds: f64,
    /// NVML no longer lists the process (it exited during the window); its samples up to then
    /// are kept here.
    pub exited: bool,
}

struct DeviceCursor {
    index: u32,
    uuid: Option<String>,
    name: Option<String>,
    /// Timestamp (µs) of the newest utilisation sample seen; the next query asks for newer ones.
    last_seen_us: u64,
    compute: Vec<nvmlProcessInfo_t>,
    graphics: Vec<nvmlProcessInfo_t>,
    samples: Vec<nvmlProcessUtilizationSample_t>,
    integrator: SampleIntegrator,
    /// Samples pulled since the last reading, per PID (see [`GpuSource::poll_samples`]).
    pending: HashMap<u32, PendingSamples>,
    /// Fields that change rarely, and the readings left before they are read again.
    slow: SlowFields,
}

/// Slow-changing fields (ECC counts, persistence mode) are read once every this many rounds, not
/// every round: each call costs tens of microseconds on a real GPU.
pub const SLOW_FIELDS_EVERY: u32 = 30;

#[derive(Debug, Default)]
struct SlowFields {
    rounds_left: u32,
    ecc_uncorrected_volatile: Option<u64>,
    persistence_mode: Option<bool>,
}

/// Samples of one process accumulated between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PendingSamples {
    sm_sum: u64,
    mem_sum: u64,
    count: u32,
    busy_seconds: f64,
}

/// The open NVML library and a cursor per GPU.
pub struct GpuSource {
    nvml: Nvml,
    devices: Vec<DeviceCursor>,
    events: Arc<EventCounters>,
    pub driver_version: Option<String>,
    /// Xid events of every device that can report them; `None` when NVML cannot.
    xid: Option<XidWatch>,
}

impl Drop for GpuSource {
    fn drop(&mut self) {
        if let Some(x) = self.xid.take() {
            x.close(&self.nvml);
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
            let (uuid, name) = match nvml.device_by_index(index) {
                Ok(d) => (d.uuid().ok(), d.name().ok()),
                Err(e) => {
                    events.emit(
                        InternalEvent::NvmlCallFailed,
                        format_args!("GPU {index}: handle: {e}"),
                    );
                    (None, None)
                }
            };
            devices.push(DeviceCursor {
                index,
                uuid,
                name,
                last_seen_us: 0,
                compute: Vec::new(),
                graphics: Vec::new(),
                samples: Vec::new(),
                integrator: SampleIntegrator::default(),
                pending: HashMap::new(),
                slow: SlowFields::default(),
            });
        }
        let xid = open_xid_watch(&nvml, &devices, &events);
        Ok(Self {
            nvml,
            devices,
            events,
            driver_version,
            xid,
        })
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Pulls the per-process utilisation samples of every GPU into the pending accumulations,
    /// without a full reading. The driver keeps only a short history of samples, so a caller
    /// whose readings are further apart than about a second polls in between.
    pub fn poll_samples(&mut self) {
        for cursor in &mut self.devices {
            let Ok(device) = self.nvml.device_by_index(cursor.index) else {
                continue; // the next reading records the failure
            };
            // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
            let handle = unsafe { device.handle() };
            if let Err(e) = pull_samples(&self.nvml, handle, cursor) {
                self.events.emit(
                    InternalEvent::NvmlCallFailed,
                    format_args!("GPU {}: process_utilization: {e}", cursor.index),
                );
            }
        }
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
                self.events.emit(
                    InternalEvent::NvmlCallFailed,
                    format_args!("reading Xid events: {e}"),
                );
            }
            for (index, xid) in xids {
                tracing::warn!("GPU {index}: Xid {xid}: {}", xid::describe(xid));
                if let Some(r) = out.iter_mut().find(|r| r.index == index) {
                    r.xid_events.push(xid);
                }
            }
        }
        out
    }
}

/// Registers every reachable device for Xid events; NOT_SUPPORTED (some GPUs, vGPUs) is not a
/// failure, anything else is counted.
fn open_xid_watch(
    nvml: &Nvml,
    devices: &[DeviceCursor],
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
                    events.emit(
                        InternalEvent::NvmlCallFailed,
                        format_args!("GPU {index}: registering for Xid events: {e}"),
                    );
                }
            }
            Some(watch)
        }
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            events.emit(
                InternalEvent::NvmlCallFailed,
                format_args!("creating the Xid event set: {e}"),
            );
            None
        }
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
                self.events.emit(
                    InternalEvent::NvmlCallFailed,
                    format_args!("GPU {}: {field}: {e}", self.reading.index),
                );
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
        rec.reading.uuid = cursor.uuid.clone();
        rec.reading.name = cursor.name.clone();
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
    rec.reading.power_limit_watts = rec
        .take("power_limit", device.enforced_power_limit())
        .map(|mw| f64::from(mw) / 1000.0);
    rec.reading.sm_clock_mhz = rec.take("sm_clock", device.clock_info(Clock::SM));
    if let Some(r) = rec.take("clocks_event_reasons", device.current_throttle_reasons()) {
        rec.reading.clocks_event_reasons = reason_names(r);
    }
    if cursor.slow.rounds_left == 0 {
        cursor.slow.rounds_left = SLOW_FIELDS_EVERY;
        cursor.slow.ecc_uncorrected_volatile = rec.take(
            "ecc_errors",
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        );
        cursor.slow.persistence_mode = rec.take("persistence_mode", device.is_in_persistent_mode());
    }
    cursor.slow.rounds_left -= 1;
    rec.reading.ecc_uncorrected_volatile = cursor.slow.ecc_uncorrected_volatile;
    rec.reading.persistence_mode = cursor.slow.persistence_mode;

    // SAFETY: the handle belongs to `nvml`, which outlives this call.
    let handle = unsafe { device.handle() };
    let lib = nvml.lib();
    let compute = list_processes(
        lib.nvmlDeviceGetComputeRunningProcesses_v3.as_ref(),
        handle,
        &mut cursor.compute,
    );
    let n_compute = rec.take("compute_processes", compute).unwrap_or(0);
    let graphics = list_processes(
        lib.nvmlDeviceGetGraphicsRunningProcesses_v3.as_ref(),
        handle,
        &mut cursor.graphics,
    );
    let n_graphics = rec.take("graphics_processes", graphics).unwrap_or(0);
    let pulled = pull_samples(nvml, handle, cursor);
    rec.take("process_utilization", pulled);
    rec.reading.processes = merge_processes(
        &cursor.compute[..n_compute],
        &cursor.graphics[..n_graphics],
        &mut cursor.pending,
    );
    let live = &rec.reading.processes;
    cursor
        .integrator
        .retain(|pid| live.iter().any(|p| p.pid == pid));
    rec.reading.process_sample_period_ms = cursor.integrator.period_us() as f64 / 1000.0;
    reading
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

type ListFn =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;
type UtilFn = unsafe extern "C" fn(
    nvmlDevice_t,
    *mut nvmlProcessUtilizationSample_t,
    *mut c_uint,
    u64,
) -> nvmlReturn_t;

/// Calls an NVML "fill a buffer, or say how big it must be" function, growing `buf` as needed.
/// `buf` keeps its length (its capacity in elements) across rounds; returns how many are valid.
fn fill_buffer<T: Copy>(
    buf: &mut Vec<T>,
    zero: T,
    mut call: impl FnMut(*mut T, &mut c_uint) -> nvmlReturn_t,
) -> Result<usize, NvmlError> {
    for _ in 0..4 {
        let mut count = buf.len() as c_uint;
        let ptr = if buf.is_empty() {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr()
        };
        match call(ptr, &mut count) {
            r if r == nvmlReturn_enum_NVML_SUCCESS => return Ok((count as usize).min(buf.len())),
            r if r == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => {
                // Headroom for processes that start between the two calls.
                let want = (count as usize).max(buf.len() + 1) + 8;
                buf.resize(want, zero);
            }
            r => return Err(NvmlError::from(r)),
        }
    }
    Err(NvmlError::InsufficientSize(Some(buf.len())))
}

fn list_processes(
    sym: Result<&ListFn, &libloading::Error>,
    handle: nvmlDevice_t,
    buf: &mut Vec<nvmlProcessInfo_t>,
) -> Result<usize, NvmlError> {
    let sym = nvml_wrapper::error::nvml_sym(sym)?;
    let zero = nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    // SAFETY: `ptr` points to `count` writable elements (or is null with count 0).
    fill_buffer(buf, zero, |ptr, count| unsafe { sym(handle, count, ptr) })
}

/// Pulls the samples newer than the cursor's last-seen timestamp and adds them, integrated, to
/// the pending accumulations.
fn pull_samples(
    nvml: &Nvml,
    handle: nvmlDevice_t,
    cursor: &mut DeviceCursor,
) -> Result<(), NvmlError> {
    let n = process_samples(
        nvml.lib().nvmlDeviceGetProcessUtilization.as_ref(),
        handle,
        cursor,
    )?;
    let samples = &mut cursor.samples[..n];
    samples.sort_unstable_by_key(|s| s.timeStamp);
    for s in samples.iter() {
        let p = cursor.pending.entry(s.pid).or_default();
        p.sm_sum += u64::from(s.smUtil);
        p.mem_sum += u64::from(s.memUtil);
        p.count += 1;
        p.busy_seconds += cursor.integrator.add(s.pid, s.timeStamp, s.smUtil);
    }
    Ok(())
}

fn process_samples(
    sym: Result<&UtilFn, &libloading::Error>,
    handle: nvmlDevice_t,
    cursor: &mut DeviceCursor,
) -> Result<usize, NvmlError> {
    let sym = nvml_wrapper::error::nvml_sym(sym)?;
    let zero = nvmlProcessUtilizationSample_t {
        pid: 0,
        timeStamp: 0,
        smUtil: 0,
        memUtil: 0,
        encUtil: 0,
        decUtil: 0,
    };
    let last_seen = cursor.last_seen_us;
    // SAFETY: as above.
    let n = fill_buffer(&mut cursor.samples, zero, |ptr, count| unsafe {
        let r = sym(handle, ptr, count, last_seen);
        // NOT_FOUND means "no samples since last_seen", not a failure.
        if r == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
            *count = 0;
            nvmlReturn_enum_NVML_SUCCESS
        } else {
            r
        }
    })?;
    if let Some(newest) = cursor.samples[..n].iter().map(|s| s.timeStamp).max() {
        cursor.last_seen_us = cursor.last_seen_us.max(newest);
    }
    Ok(n)
}

/// Joins the compute and graphics lists and the pending samples into one entry per PID, and
/// empties `pending` (samples of a PID no longer listed are dropped with it).
fn merge_processes(
    compute: &[nvmlProcessInfo_t],
    graphics: &[nvmlProcessInfo_t],
    pending: &mut HashMap<u32, PendingSamples>,
) -> Vec<ProcessReading> {
    let memory =
        |p: &nvmlProcessInfo_t| (p.usedGpuMemory != VALUE_NOT_AVAILABLE).then_some(p.usedGpuMemory);
    let mut out: Vec<ProcessReading> = Vec::with_capacity(compute.len() + graphics.len());
    for (list, kind) in [
        (compute, ProcessKind::Compute),
        (graphics, ProcessKind::Graphics),
    ] {
        for p in list {
            if let Some(existing) = out.iter_mut().find(|e| e.pid == p.pid) {
                if existing.kind != kind {
                    existing.kind = ProcessKind::ComputeAndGraphics;
                }
                existing.used_memory_bytes = existing.used_memory_bytes.max(memory(p));
                continue;
            }
            out.push(ProcessReading {
                pid: p.pid,
                kind,
                used_memory_bytes: memory(p),
                sm_util_percent: None,
                mem_util_percent: None,
                samples: 0,
                sm_busy_seconds: 0.0,
                exited: false,
            });
        }
    }
    let listed = out.len();
    for (pid, s) in pending.iter() {
        if s.count > 0 && !out[..listed].iter().any(|p| p.pid == *pid) {
            // Samples of a process that left the GPU since: kept, not dropped.
            out.push(ProcessReading {
                pid: *pid,
                kind: ProcessKind::Compute,
                used_memory_bytes: None,
                sm_util_percent: None,
                mem_util_percent: None,
                samples: 0,
                sm_busy_seconds: 0.0,
                exited: true,
            });
        }
    }
    for p in &mut out {
        if let Some(s) = pending.get(&p.pid).filter(|s| s.count > 0) {
            p.sm_util_percent = Some(s.sm_sum as f64 / f64::from(s.count));
            p.mem_util_percent = Some(s.mem_sum as f64 / f64::from(s.count));
            p.samples = s.count;
            p.sm_busy_seconds = s.busy_seconds;
        }
    }
    pending.clear();
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

    fn sample(pid: u32, ts: u64, sm: u32) -> nvmlProcessUtilizationSample_t {
        nvmlProcessUtilizationSample_t {
            pid,
            timeStamp: ts,
            smUtil: sm,
            memUtil: sm / 2,
            encUtil: 0,
            decUtil: 0,
        }
    }

    #[test]
    fn merges_lists_and_averages_samples() {
        let mut integrator = SampleIntegrator::default();
        let mut pending: HashMap<u32, PendingSamples> = HashMap::new();
        for s in [
            sample(1, 200_000, 40),
            sample(1, 400_000, 60),
            sample(9, 5, 99),
        ] {
            let p = pending.entry(s.pid).or_default();
            p.sm_sum += u64::from(s.smUtil);
            p.mem_sum += u64::from(s.memUtil);
            p.count += 1;
            p.busy_seconds += integrator.add(s.pid, s.timeStamp, s.smUtil);
        }
        let out = merge_processes(
            &[info(1, 100), info(2, VALUE_NOT_AVAILABLE)],
            &[info(1, 120), info(3, 5)],
            &mut pending,
        );
        assert!(pending.is_empty(), "drained");
        assert_eq!(out.len(), 4);
        let gone = out
            .iter()
            .find(|p| p.pid == 9)
            .expect("an exited process keeps its samples");
        assert!(gone.exited && gone.samples == 1 && gone.used_memory_bytes.is_none());
        assert_eq!(out[0].kind, ProcessKind::ComputeAndGraphics);
        assert_eq!(out[0].used_memory_bytes, Some(120));
        assert_eq!(out[0].sm_util_percent, Some(50.0));
        assert_eq!(out[0].samples, 2);
        // first sample covers one default period (0.2 s at 40 %), the second 0.2 s at 60 %
        assert!(
            (out[0].sm_busy_seconds - 0.2).abs() < 1e-9,
            "{}",
            out[0].sm_busy_seconds
        );
        assert_eq!(out[1].used_memory_bytes, None);
        assert_eq!(
            out[1].sm_util_percent, None,
            "no sample means no activity, not zero"
        );
        assert_eq!(out[2].kind, ProcessKind::Graphics);
    }

    #[test]
    fn fill_buffer_grows_once_then_reuses() {
        let mut buf: Vec<u32> = Vec::new();
        let mut calls = 0;
        let fill = |ptr: *mut u32, count: &mut c_uint, calls: &mut u32| {
            *calls += 1;
            if (*count as usize) < 3 {
                *count = 3;
                return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for i in 0..3 {
                // SAFETY: the caller sized the buffer to at least 3.
                unsafe { *ptr.add(i) = i as u32 + 1 };
            }
            *count = 3;
            nvmlReturn_enum_NVML_SUCCESS
        };
        let n = fill_buffer(&mut buf, 0, |p, c| fill(p, c, &mut calls)).unwrap();
        assert_eq!((n, &buf[..n], calls), (3, &[1, 2, 3][..], 2));
        calls = 0;
        let n = fill_buffer(&mut buf, 0, |p, c| fill(p, c, &mut calls)).unwrap();
        assert_eq!((n, calls), (3, 1), "a warm buffer needs one NVML call");
    }
}
