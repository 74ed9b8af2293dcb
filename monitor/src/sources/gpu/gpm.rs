//! SM activity through GPM (GPU Performance Monitoring, Hopper and newer).
//!
//! Utilisation says only that *a* kernel ran; GPM says how much of the GPU it used. A GPM sample
//! is a snapshot of the GPU's activity counters, and the metrics between two samples are
//! averages over the time between them: engine (graphics/compute) activity, the share of SMs
//! busy, warp occupancy, tensor-pipe and DRAM-bandwidth use. On the H200 a single-thread
//! spinning kernel read 99.5 % utilisation and 0.8 % SM activity; a large bf16 matmul 97 % and
//! 93 %.
//!
//! Cost on the H200 (driver 580.159.04): a sample 40–60 µs of CPU, one metrics computation
//! 1.3–1.4 ms whatever the number of metrics asked for. So the agent takes one sample per
//! series fetch, not per round, and reports activity over the span between fetches.
//!
//! The same request brings the PCIe traffic (MiB/s each way): on an H100 host a step copying
//! pageable memory read 5,070 MiB/s received, pinned copies overlapping compute 11,258, a
//! one-element-kernel loop 197, a matmul loop 15.5 (`tests/gpu/cuda_calls.py`).
use crate::model::{PcieSource, PcieTraffic, SmActivity};
use nvml_wrapper::error::{nvml_sym, NvmlError};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpmMetricId_t, nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY, nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t, nvmlReturn_enum_NVML_SUCCESS,
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION,
};

const METRICS: [nvmlGpmMetricId_t; 7] = [
    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC,
];

/// What one span of GPM brought.
pub struct GpmSpan {
    pub activity: SmActivity,
    pub pcie: Option<PcieTraffic>,
}

/// Two sample buffers used in turn, and the metrics request reused across spans.
pub struct Gpm {
    samples: [nvmlGpmSample_t; 2],
    /// When each buffer was filled (ms since the epoch); 0 when not yet.
    taken_ms: [u64; 2],
    newest: usize,
    request: Box<nvmlGpmMetricsGet_t>,
}

// SAFETY: the sample handles are owned by this value and only used through `&mut self`.
unsafe impl Send for Gpm {}

impl Gpm {
    /// GPM for one GPU, `Ok(None)` when the GPU does not support it.
    pub fn open(nvml: &Nvml, handle: nvmlDevice_t) -> Result<Option<Self>, NvmlError> {
        let lib = nvml.lib();
        let query = nvml_sym(lib.nvmlGpmQueryDeviceSupport.as_ref())?;
        let mut support = nvmlGpmSupport_t {
            version: NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice: 0,
        };
        // SAFETY: a valid handle and an initialised out-struct.
        check(unsafe { query(handle, &mut support) })?;
        if support.isSupportedDevice == 0 {
            return Ok(None);
        }
        let alloc = nvml_sym(lib.nvmlGpmSampleAlloc.as_ref())?;
        let mut samples = [std::ptr::null_mut(); 2];
        for s in &mut samples {
            // SAFETY: out-pointer to a handle.
            if let Err(e) = check(unsafe { alloc(s) }) {
                free(nvml, &samples);
                return Err(e);
            }
        }
        // SAFETY: the request is plain data; zero is a valid (empty) value.
        let request = Box::new(unsafe { std::mem::zeroed::<nvmlGpmMetricsGet_t>() });
        Ok(Some(Self {
            samples,
            taken_ms: [0; 2],
            newest: 0,
            request,
        }))
    }

    /// Takes a sample; returns the averages since the previous one (`None` for the first).
    pub fn sample(
        &mut self,
        nvml: &Nvml,
        handle: nvmlDevice_t,
        now_ms: u64,
    ) -> Result<Option<GpmSpan>, NvmlError> {
        let lib = nvml.lib();
        let get = nvml_sym(lib.nvmlGpmSampleGet.as_ref())?;
        let next = 1 - self.newest;
        // SAFETY: the handle and the sample buffer are live.
        check(unsafe { get(handle, self.samples[next]) })?;
        self.taken_ms[next] = now_ms;
        let previous = self.newest;
        self.newest = next;
        if self.taken_ms[previous] == 0 {
            return Ok(None);
        }
        let metrics = nvml_sym(lib.nvmlGpmMetricsGet.as_ref())?;
        let r = &mut *self.request;
        r.version = NVML_GPM_METRICS_GET_VERSION;
        r.numMetrics = METRICS.len() as u32;
        r.sample1 = self.samples[previous];
        r.sample2 = self.samples[next];
        for (slot, id) in r.metrics.iter_mut().zip(METRICS) {
            slot.metricId = id;
        }
        // SAFETY: a request naming two filled samples of this library.
        check(unsafe { metrics(r) })?;
        let raw = |i: usize| {
            let m = &r.metrics[i];
            (m.nvmlReturn == nvmlReturn_enum_NVML_SUCCESS && m.value.is_finite())
                .then_some(m.value.max(0.0))
        };
        let value = |i: usize| raw(i).map(|v| v.min(100.0));
        let (start_unix_ms, end_unix_ms) = (self.taken_ms[previous], now_ms);
        use crate::units::MIB_F64 as MIB;
        Ok(Some(GpmSpan {
            activity: SmActivity {
                start_unix_ms,
                end_unix_ms,
                engine_percent: value(0),
                sm_percent: value(1),
                sm_occupancy_percent: value(2),
                tensor_percent: value(3),
                dram_bandwidth_percent: value(4),
            },
            pcie: raw(5).zip(raw(6)).map(|(rx, tx)| PcieTraffic {
                start_unix_ms,
                end_unix_ms,
                rx_bytes_per_second: rx * MIB,
                tx_bytes_per_second: tx * MIB,
                source: PcieSource::Gpm,
            }),
        }))
    }

    /// Frees the sample buffers (before the library is shut down).
    pub fn close(self, nvml: &Nvml) {
        free(nvml, &self.samples);
    }
}

fn free(nvml: &Nvml, samples: &[nvmlGpmSample_t]) {
    if let Ok(f) = nvml_sym(nvml.lib().nvmlGpmSampleFree.as_ref()) {
        for s in samples.iter().filter(|s| !s.is_null()) {
            // SAFETY: allocated by this library and freed once.
            unsafe { f(*s) };
        }
    }
}

fn check(r: nvml_wrapper_sys::bindings::nvmlReturn_t) -> Result<(), NvmlError> {
    if r == nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(NvmlError::from(r))
    }
}
