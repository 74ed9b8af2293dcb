//! A stand-in `libnvidia-ml.so` for tests and for reproducing a case without a GPU.
//!
//! The real nvml-wrapper loads it through its normal library-path mechanism
//! (`gpuwatch --nvml-lib target/debug/libnvidia_ml_fake.so`). What it reports comes from the
//! JSON scenario named by `FAKE_NVML_SCENARIO`, re-read whenever the file changes, so a test can
//! script a timeline by rewriting it. Every exported function follows the NVML contract the agent
//! relies on: buffer sizing with INSUFFICIENT_SIZE, NOT_FOUND for "no samples since", the
//! `_v2`/`_v3` struct layouts (taken from nvml-wrapper-sys, so they match the real ones), and
//! injectable errors, delays and CPU costs per function. What the utilisation queries return is
//! the measured H200 driver's behaviour ([`timeline`], [`driver`]).
#![allow(non_snake_case, non_upper_case_globals, clippy::missing_safety_doc)]

pub mod driver;
pub mod scenario;
pub mod timeline;

use nvml_wrapper_sys::bindings::*;
use scenario::{Kind, Scenario};
use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const SCENARIO_ENV: &str = "FAKE_NVML_SCENARIO";

struct Loaded {
    path: PathBuf,
    modified: Option<SystemTime>,
    len: u64,
    /// When the file was last looked at: at most every 10 ms (a real driver reads no file
    /// per call; thousands of calls a second would make the fake's own cost the benchmark's).
    checked: std::time::Instant,
    scenario: Scenario,
}

const RECHECK: Duration = Duration::from_millis(10);

static STATE: Mutex<Option<Loaded>> = Mutex::new(None);

/// Loads or reloads the scenario; a broken file is reported once on stderr and leaves the last
/// good scenario in force (an empty one at first).
pub(crate) fn with_scenario<T>(f: impl FnOnce(&Scenario) -> T) -> T {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::var_os(SCENARIO_ENV).map(PathBuf::from);
    let fresh = state
        .as_ref()
        .is_some_and(|l| l.checked.elapsed() < RECHECK && Some(&l.path) == path.as_ref());
    if let Some(path) = path.filter(|_| !fresh) {
        if let Some(l) = state.as_mut() {
            l.checked = std::time::Instant::now();
        }
        let meta = std::fs::metadata(&path).ok();
        let modified = meta.as_ref().and_then(|m| m.modified().ok());
        let len = meta.as_ref().map_or(0, |m| m.len());
        let stale = state
            .as_ref()
            .is_none_or(|l| l.path != path || l.modified != modified || l.len != len);
        if stale {
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Scenario>(&t).map_err(|e| e.to_string()));
            match parsed {
                Ok(mut scenario) => {
                    if let Some(old) = state.as_ref().filter(|l| l.path == path) {
                        scenario.keep_what_only_a_reset_undoes(&old.scenario);
                    }
                    *state = Some(Loaded {
                        path,
                        modified,
                        len,
                        checked: std::time::Instant::now(),
                        scenario,
                    })
                }
                Err(e) => {
                    eprintln!("fake-nvml: scenario {}: {e}", path.display());
                    if state.is_none() {
                        *state = Some(Loaded {
                            path,
                            modified,
                            len,
                            checked: std::time::Instant::now(),
                            scenario: Scenario::default(),
                        });
                    }
                }
            }
        }
    }
    match state.as_ref() {
        Some(l) => f(&l.scenario),
        None => f(&Scenario::default()),
    }
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_micros() as u64)
}

fn error_code(name: &str) -> nvmlReturn_t {
    match name.trim_start_matches("NVML_ERROR_") {
        "UNINITIALIZED" => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        "INVALID_ARGUMENT" => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        "NOT_SUPPORTED" => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        "NO_PERMISSION" => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        "NOT_FOUND" => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        "INSUFFICIENT_POWER" => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
        "DRIVER_NOT_LOADED" => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        "TIMEOUT" => nvmlReturn_enum_NVML_ERROR_TIMEOUT,
        "IRQ_ISSUE" => nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE,
        "LIBRARY_NOT_FOUND" => nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
        "GPU_IS_LOST" => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        "RESET_REQUIRED" => nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
        "NO_DATA" => nvmlReturn_enum_NVML_ERROR_NO_DATA,
        "MEMORY" => nvmlReturn_enum_NVML_ERROR_MEMORY,
        _ => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

const OK: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;

/// The injected delay and CPU cost of `func`, read under the scenario lock.
fn delay_and_cost(func: &str) -> (Option<u64>, Option<u64>) {
    with_scenario(|s| {
        (
            s.delays_ms.get(func).copied(),
            s.call_cost_us.get(func).copied(),
        )
    })
}

/// Sleeps the injected delay (with no lock held: other calls go on, as with a driver where one
/// call hangs) and burns the injected CPU cost.
fn pay(func: &str) {
    let (delay, cost) = delay_and_cost(func);
    if let Some(ms) = delay {
        std::thread::sleep(Duration::from_millis(ms));
    }
    if let Some(us) = cost {
        let until = std::time::Instant::now() + Duration::from_micros(us);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

/// `nvmlInit*` calls not yet matched by `nvmlShutdown`. As measured on the H200
/// (tests/gpu/nvml_rediscovery.py, 2026-12-03): between the last shutdown and the next init
/// every call answers UNINITIALIZED, and the process holds none of the driver's device files.
static INITS: AtomicU32 = AtomicU32::new(0);

fn initialised() -> bool {
    INITS.load(Ordering::SeqCst) > 0
}

/// Runs a function with no device argument.
fn global(func: &str, f: impl FnOnce(&Scenario) -> nvmlReturn_t) -> nvmlReturn_t {
    if !initialised() {
        return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    pay(func);
    with_scenario(|s| match s.errors.get(func) {
        Some(e) => error_code(e),
        None => f(s),
    })
}

/// Runs a function on a device handle (handles are `index + 1`).
fn device(
    func: &str,
    handle: nvmlDevice_t,
    f: impl FnOnce(&scenario::Device) -> nvmlReturn_t,
) -> nvmlReturn_t {
    if !initialised() {
        return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    pay(func);
    with_scenario(|s| {
        let Some(d) = (handle as usize)
            .checked_sub(1)
            .and_then(|i| s.devices.get(i))
        else {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        };
        if d.lost {
            return nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
        }
        match d.errors.get(func).or_else(|| s.errors.get(func)) {
            Some(e) => error_code(e),
            None => f(d),
        }
    })
}

/// Runs `f` on the simulated driver's state of the device behind `handle`.
fn driver_state<T>(handle: nvmlDevice_t, f: impl FnOnce(&driver::DeviceState) -> T) -> T {
    let history = with_scenario(|s| s.history_records);
    driver::with_device((handle as usize).saturating_sub(1), history, f)
}

unsafe fn write_str(dst: *mut c_char, len: c_uint, s: &str) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        if dst.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        let bytes = s.as_bytes();
        if bytes.len() + 1 > len as usize {
            return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), dst, bytes.len());
        *dst.add(bytes.len()) = 0;
        OK
    }
}

unsafe fn put<T>(dst: *mut T, v: T) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        if dst.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        *dst = v;
        OK
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    let r = with_scenario(|s| s.init_error.as_deref().map_or(OK, error_code));
    if r == OK {
        INITS.fetch_add(1, Ordering::SeqCst);
        driver::start();
    }
    r
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    // Counted, as NVML documents: only the last shutdown closes it; more shutdowns than inits
    // are no error.
    let _ = INITS.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    OK
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        OK => c"Success",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        global("nvmlSystemGetDriverVersion", |s| {
            write_str(version, len, &s.driver_version)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        global("nvmlSystemGetNVMLVersion", |_| {
            write_str(version, len, "13.580.159.04")
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        global("nvmlDeviceGetCount_v2", |s| {
            put(count, s.devices.len() as c_uint)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    handle: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        global("nvmlDeviceGetHandleByIndex_v2", |s| {
            match s.devices.get(index as usize) {
                None => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
                Some(d) if d.lost => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
                Some(_) => put(handle, (index as usize + 1) as nvmlDevice_t),
            }
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    handle: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetIndex", handle, |_| {
            put(index, (handle as usize - 1) as c_uint)
        })
    }
}

/// The minor number of the device's `/dev/nvidiaN` node: the scenario's `minor_number`, else
/// the index. The driver numbers nodes in its probe order, which matches NVML's PCI-order index
/// on single-GPU hosts (the H200 host: one GPU, `/dev/nvidia0`) and on most multi-GPU ones.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    handle: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetMinorNumber", handle, |d| {
            put(
                minor,
                d.minor_number.unwrap_or((handle as usize - 1) as c_uint),
            )
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    handle: nvmlDevice_t,
    uuid: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetUUID", handle, |d| {
            write_str(uuid, len, &d.uuid)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    handle: nvmlDevice_t,
    name: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetName", handle, |d| {
            write_str(name, len, &d.name)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    handle: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        // The real reading is a short window's: polled in step with a periodic load it aliases
        // (8 % and 64 % in two runs at a 39 % load). The fake returns the latest period's figure.
        let latest = driver_state(handle, |st| st.timeline.latest().map(|r| r.device_percent));
        device("nvmlDeviceGetUtilizationRates", handle, |d| {
            put(
                u,
                nvmlUtilization_t {
                    gpu: d.utilization_gpu.or(latest).unwrap_or(0),
                    memory: d.utilization_memory,
                },
            )
        })
    }
}

/// The PCIe rates of the live processes at the driver's latest reading, in KB/s as NVML gives
/// them. The real call samples for ~20 ms (20.6-20.9 ms of wall time on the H100 host; put
/// that in `delays_ms` to copy it) and read 4.81 GB/s of a pageable-copy step.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    handle: nvmlDevice_t,
    counter: nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        let (rx, tx) = driver_state(handle, |st| st.pcie_now);
        device("nvmlDeviceGetPcieThroughput", handle, |_| {
            let mib_s = match counter {
                nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => rx,
                nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => tx,
                _ => return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
            };
            put(value, (mib_s * 1_048_576.0 / 1000.0) as c_uint)
        })
    }
}

/// The driver's own memory on a GPU, whoever runs: 480 MiB on an idle H100 (driver
/// 580.159.04, `tests/gpu/nvml_fidelity.py`, 2026-12-06: used 480.0 MiB with no process).
const DRIVER_MEMORY: u64 = 480 << 20;
/// What the driver keeps per process beyond the process's own figure: the same H100 showed
/// 488.8 MiB beside one PyTorch process and 494.4 beside two (+8.8, +5.6).
const DRIVER_MEMORY_PER_PROCESS: u64 = 7 << 20;

fn memory_used(d: &scenario::Device) -> u64 {
    d.memory_used_bytes.unwrap_or_else(|| {
        let held: Vec<u64> = d
            .processes
            .iter()
            .filter_map(|p| p.used_memory_bytes)
            .collect();
        DRIVER_MEMORY + DRIVER_MEMORY_PER_PROCESS * held.len() as u64 + held.iter().sum::<u64>()
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    handle: nvmlDevice_t,
    m: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetMemoryInfo_v2", handle, |d| {
            if m.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            let used = memory_used(d).min(d.memory_total_bytes);
            let version = (*m).version;
            *m = nvmlMemory_v2_t {
                version,
                total: d.memory_total_bytes,
                reserved: 0,
                free: d.memory_total_bytes - used,
                used,
            };
            OK
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    handle: nvmlDevice_t,
    m: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetMemoryInfo", handle, |d| {
            let used = memory_used(d).min(d.memory_total_bytes);
            put(
                m,
                nvmlMemory_t {
                    total: d.memory_total_bytes,
                    free: d.memory_total_bytes - used,
                    used,
                },
            )
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    handle: nvmlDevice_t,
    _sensor: c_uint,
    t: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetTemperature", handle, |d| {
            put(t, d.temperature)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    handle: nvmlDevice_t,
    p: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe { device("nvmlDeviceGetPowerUsage", handle, |d| put(p, d.power_mw)) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    handle: nvmlDevice_t,
    p: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetEnforcedPowerLimit", handle, |d| {
            put(p, d.power_limit_mw)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    handle: nvmlDevice_t,
    p: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetPowerManagementLimit", handle, |d| {
            put(p, d.power_limit_mw)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    handle: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetTotalEccErrors", handle, |d| {
            // NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
            let n = if error_type == 1 && counter_type == 0 {
                d.ecc_uncorrected_volatile
            } else {
                0
            };
            put(count, n)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    handle: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetPersistenceMode", handle, |d| {
            put(mode, c_uint::from(d.persistence_mode))
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    handle: nvmlDevice_t,
    _clock: c_uint,
    c: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe { device("nvmlDeviceGetClockInfo", handle, |d| put(c, d.sm_clock_mhz)) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    handle: nvmlDevice_t,
    r: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetCurrentClocksThrottleReasons", handle, |d| {
            put(r, d.clocks_event_reasons)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    handle: nvmlDevice_t,
    r: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetCurrentClocksEventReasons", handle, |d| {
            put(r, d.clocks_event_reasons)
        })
    }
}

/// The NVML list contract: with too small a buffer (or none), set `count` to the size needed
/// and return INSUFFICIENT_SIZE (SUCCESS when the list is empty).
unsafe fn fill<T>(items: &[T], count: *mut c_uint, out: *mut T) -> nvmlReturn_t
where
    T: Copy,
{
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        if count.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        let cap = *count as usize;
        *count = items.len() as c_uint;
        if items.is_empty() {
            return OK;
        }
        if out.is_null() || cap < items.len() {
            return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
        }
        std::ptr::copy_nonoverlapping(items.as_ptr(), out, items.len());
        OK
    }
}

unsafe fn running(
    d: &scenario::Device,
    graphics: bool,
    count: *mut c_uint,
    out: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        let items: Vec<nvmlProcessInfo_t> = d
            .processes
            .iter()
            .filter(|p| p.kind == Kind::Both || (p.kind == Kind::Graphics) == graphics)
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory_bytes.unwrap_or(u64::MAX),
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            })
            .collect();
        fill(&items, count, out)
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    out: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetComputeRunningProcesses_v3", handle, |d| {
            running(d, false, count, out)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    handle: nvmlDevice_t,
    count: *mut c_uint,
    out: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, |d| {
            running(d, true, count, out)
        })
    }
}

/// `nvmlDeviceGetSamples`, for `NVML_GPU_UTILIZATION_SAMPLES` (1) only: every record newer than
/// `last_seen`. A null buffer asks for the count (SUCCESS, as pynvml relies on); a small one is
/// INSUFFICIENT_SIZE with the count needed; none newer is NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    handle: nvmlDevice_t,
    kind: nvmlSamplingType_t,
    last_seen: c_ulonglong,
    value_type: *mut nvmlValueType_t,
    count: *mut c_uint,
    out: *mut nvmlSample_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        let samples = driver_state(handle, |st| st.timeline.device_samples(last_seen));
        device("nvmlDeviceGetSamples", handle, |_| {
            if count.is_null() || value_type.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            if kind != nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES {
                return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
            }
            *value_type = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
            if samples.is_empty() {
                *count = 0;
                return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
            }
            let cap = *count as usize;
            *count = samples.len() as c_uint;
            if out.is_null() {
                return OK;
            }
            if cap < samples.len() {
                return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (i, (ts, v)) in samples.iter().enumerate() {
                *out.add(i) = nvmlSample_t {
                    timeStamp: *ts,
                    sampleValue: nvmlValue_t { uiVal: *v },
                };
            }
            OK
        })
    }
}

/// `nvmlDeviceGetProcessUtilization`: one entry per process credited with a record since
/// `last_seen` ([`timeline::Timeline::process_samples`]). As measured, the buffer must hold the
/// driver's whole history (72 entries asked for with a null buffer, INSUFFICIENT_SIZE for 64
/// even when one entry would come back); none newer is NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    handle: nvmlDevice_t,
    out: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        let history = with_scenario(|s| s.history_records);
        let samples = driver_state(handle, |st| st.timeline.process_samples(last_seen));
        device("nvmlDeviceGetProcessUtilization", handle, |_| {
            if count.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            if out.is_null() || (*count as usize) < history {
                *count = history as c_uint;
                return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
            }
            if samples.is_empty() {
                *count = 0;
                return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
            }
            *count = samples.len() as c_uint;
            for (i, (pid, ts, sm, mem)) in samples.iter().enumerate() {
                *out.add(i) = nvmlProcessUtilizationSample_t {
                    pid: *pid,
                    timeStamp: *ts,
                    smUtil: *sm,
                    memUtil: *mem,
                    encUtil: 0,
                    decUtil: 0,
                };
            }
            OK
        })
    }
}

// GPM: a sample is a copy of the device's activity integrals at the time it was taken; the
// metrics between two samples are the integrals' growth over the time between them.

struct GpmSample {
    counters: Option<driver::GpmCounters>,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    handle: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        device("nvmlGpmQueryDeviceSupport", handle, |d| {
            if support.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            (*support).isSupportedDevice = c_uint::from(d.gpm_supported);
            OK
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        global("nvmlGpmSampleAlloc", |_| {
            let boxed = Box::new(GpmSample { counters: None });
            put(sample, Box::into_raw(boxed) as nvmlGpmSample_t)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        if !sample.is_null() {
            drop(Box::from_raw(sample as *mut GpmSample));
        }
        OK
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    handle: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        let mut counters = driver_state(handle, |st| st.gpm);
        if counters.ts_us == 0 {
            // Before the driver thread's first reading: nothing integrated yet, as of now.
            counters.ts_us = now_us();
        }
        device("nvmlGpmSampleGet", handle, |d| {
            if sample.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            if !d.gpm_supported {
                return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
            }
            (*(sample as *mut GpmSample)).counters = Some(counters);
            OK
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(m: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        global("nvmlGpmMetricsGet", |_| {
            if m.is_null() || (*m).sample1.is_null() || (*m).sample2.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            let (Some(a), Some(b)) = (
                (*((*m).sample1 as *const GpmSample)).counters,
                (*((*m).sample2 as *const GpmSample)).counters,
            ) else {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            };
            let dt = b.ts_us.saturating_sub(a.ts_us).max(1) as f64;
            let request = &mut *m;
            let n = (request.numMetrics as usize).min(request.metrics.len());
            for metric in &mut request.metrics[..n] {
                let delta = match metric.metricId {
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => Some(b.engine - a.engine),
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => Some(b.sm - a.sm),
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => {
                        Some(b.occupancy - a.occupancy)
                    }
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => Some(b.tensor - a.tensor),
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => Some(b.dram - a.dram),
                    // MiB/s, not percentages
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => {
                        Some(b.pcie_rx - a.pcie_rx)
                    }
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC => {
                        Some(b.pcie_tx - a.pcie_tx)
                    }
                    _ => None,
                };
                let percent = !matches!(
                    metric.metricId,
                    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC
                        | nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC
                );
                match delta {
                    Some(v) => {
                        metric.nvmlReturn = OK;
                        metric.value = if percent {
                            (v / dt).clamp(0.0, 100.0)
                        } else {
                            (v / dt).max(0.0)
                        };
                    }
                    None => metric.nvmlReturn = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
                }
            }
            OK
        })
    }
}

// Xid events: each device's `xid_events` are delivered once each, in order, to the event set
// the device was registered in; a scenario that appends to the list delivers the new ones.

/// Registered device indices, and how many of each one's `xid_events` were delivered.
static XID: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe { global("nvmlEventSetCreate", |_| put(set, 1usize as nvmlEventSet_t)) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    handle: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    if set.is_null() || event_types & c_ulonglong::from(nvmlEventTypeXidCriticalError) == 0 {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    device("nvmlDeviceRegisterEvents", handle, |d| {
        let index = handle as usize - 1;
        let mut xid = XID.lock().unwrap_or_else(|p| p.into_inner());
        if !xid.iter().any(|(i, _)| *i == index) {
            // Events from before registration are not delivered, as with the real driver.
            xid.push((index, d.xid_events.len()));
        }
        OK
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    _timeout_ms: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract, which the caller keeps: each pointer is null or valid for
    // its type (buffers for the length or count passed beside them).
    unsafe {
        if set.is_null() || data.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        global("nvmlEventSetWait_v2", |s| {
            let mut xid = XID.lock().unwrap_or_else(|p| p.into_inner());
            for (index, delivered) in xid.iter_mut() {
                let Some(d) = s.devices.get(*index) else {
                    continue;
                };
                if let Some(&code) = d.xid_events.get(*delivered) {
                    *delivered += 1;
                    *data = nvmlEventData_t {
                        device: (*index + 1) as nvmlDevice_t,
                        eventType: c_ulonglong::from(nvmlEventTypeXidCriticalError),
                        eventData: code,
                        gpuInstanceId: 0,
                        computeInstanceId: 0,
                    };
                    return OK;
                }
            }
            nvmlReturn_enum_NVML_ERROR_TIMEOUT
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(_set: nvmlEventSet_t) -> nvmlReturn_t {
    OK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_follows_the_sizing_contract() {
        let items = [1u32, 2, 3];
        let mut count: c_uint = 0;
        // SAFETY: a live count, and a null buffer, which the contract allows.
        let sized = unsafe { fill(&items, &mut count, std::ptr::null_mut()) };
        assert_eq!(sized, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(count, 3);
        let mut buf = [0u32; 4];
        count = 4;
        // SAFETY: `buf` holds the `count` items it is said to.
        let filled = unsafe { fill(&items, &mut count, buf.as_mut_ptr()) };
        assert_eq!(filled, OK);
        assert_eq!((count, &buf[..3]), (3, &items[..]));
        let mut count: c_uint = 0;
        // SAFETY: as the first call.
        let none = unsafe { fill::<u32>(&[], &mut count, std::ptr::null_mut()) };
        assert_eq!(none, OK);
    }
}
