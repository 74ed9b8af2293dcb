//! NVML's list calls through the raw symbols, with buffers kept across calls: a warm call is one
//! NVML call (nvml-wrapper sizes with a second call and allocates every time).
use nvml_wrapper::error::{nvml_sym, NvmlError};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t, nvmlSample_t,
    nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES, nvmlSamplingType_t, nvmlValueType_t,
    nvmlValue_t,
};
use std::os::raw::{c_uint, c_ulonglong};

pub type ListFn =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;
pub type ProcessUtilFn = unsafe extern "C" fn(
    nvmlDevice_t,
    *mut nvmlProcessUtilizationSample_t,
    *mut c_uint,
    c_ulonglong,
) -> nvmlReturn_t;
pub type SamplesFn = unsafe extern "C" fn(
    nvmlDevice_t,
    nvmlSamplingType_t,
    c_ulonglong,
    *mut nvmlValueType_t,
    *mut c_uint,
    *mut nvmlSample_t,
) -> nvmlReturn_t;

/// Calls an NVML "fill a buffer, or say how big it must be" function, growing `buf` as needed.
/// `buf` keeps its length (its capacity in elements) across calls; returns how many are valid.
/// NOT_FOUND ("nothing since `last_seen`") is an empty answer, not a failure.
pub fn fill_buffer<T: Copy>(
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
            r if r == nvmlReturn_enum_NVML_SUCCESS && !ptr.is_null() => {
                return Ok((count as usize).min(buf.len()))
            }
            r if r == nvmlReturn_enum_NVML_SUCCESS && count == 0 => return Ok(0),
            r if r == nvmlReturn_enum_NVML_ERROR_NOT_FOUND => return Ok(0),
            // A null buffer answered with the size needed (GetSamples does this with SUCCESS).
            r if r == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
                || r == nvmlReturn_enum_NVML_SUCCESS =>
            {
                // Headroom for entries that appear between the two calls.
                let want = (count as usize).max(buf.len() + 1) + 8;
                buf.resize(want, zero);
            }
            r => return Err(NvmlError::from(r)),
        }
    }
    Err(NvmlError::InsufficientSize(Some(buf.len())))
}

pub fn list_processes(
    sym: Result<&ListFn, &libloading::Error>,
    handle: nvmlDevice_t,
    buf: &mut Vec<nvmlProcessInfo_t>,
) -> Result<usize, NvmlError> {
    let sym = nvml_sym(sym)?;
    let zero = nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    // SAFETY: `ptr` points to `count` writable elements (or is null with count 0).
    fill_buffer(buf, zero, |ptr, count| unsafe { sym(handle, count, ptr) })
}

/// `nvmlDeviceGetProcessUtilization(last_seen)`: one entry per process the driver credited
/// with a sample period since `last_seen` (see docs/gpu-sampling.md). ~2 ms of CPU per call
/// on an H200.
pub fn process_utilization(
    sym: Result<&ProcessUtilFn, &libloading::Error>,
    handle: nvmlDevice_t,
    last_seen: u64,
    buf: &mut Vec<nvmlProcessUtilizationSample_t>,
) -> Result<usize, NvmlError> {
    let sym = nvml_sym(sym)?;
    let zero = nvmlProcessUtilizationSample_t {
        pid: 0,
        timeStamp: 0,
        smUtil: 0,
        memUtil: 0,
        encUtil: 0,
        decUtil: 0,
    };
    // SAFETY: as above.
    fill_buffer(buf, zero, |ptr, count| unsafe {
        sym(handle, ptr, count, last_seen)
    })
}

/// `nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_seen)`: the device's utilisation
/// records newer than `last_seen`, as (timestamp µs, percent). ~2 ms of CPU per call on an
/// H200, however many records it returns.
pub fn utilization_samples<'b>(
    sym: Result<&SamplesFn, &libloading::Error>,
    handle: nvmlDevice_t,
    last_seen: u64,
    buf: &'b mut Vec<nvmlSample_t>,
) -> Result<impl Iterator<Item = (u64, u32)> + 'b, NvmlError> {
    let sym = nvml_sym(sym)?;
    let zero = nvmlSample_t {
        timeStamp: 0,
        sampleValue: nvmlValue_t { ullVal: 0 },
    };
    let mut value_type: nvmlValueType_t = 0;
    // SAFETY: as above; `value_type` is a valid out-pointer.
    let n = fill_buffer(buf, zero, |ptr, count| unsafe {
        sym(
            handle,
            nvmlSamplingType_enum_NVML_GPU_UTILIZATION_SAMPLES,
            last_seen,
            &mut value_type,
            count,
            ptr,
        )
    })?;
    // SAFETY: GPU utilisation samples are unsigned ints (NVML_VALUE_TYPE_UNSIGNED_INT).
    Ok(buf[..n]
        .iter()
        .map(|s| (s.timeStamp, unsafe { s.sampleValue.uiVal })))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_null_buffer_answered_with_success_is_sized_and_not_found_is_empty() {
        // GetSamples answers a null buffer with SUCCESS and the count.
        let mut buf: Vec<u32> = Vec::new();
        let n = fill_buffer(&mut buf, 0, |p, c| {
            if p.is_null() {
                *c = 5;
                return nvmlReturn_enum_NVML_SUCCESS;
            }
            *c = 5;
            nvmlReturn_enum_NVML_SUCCESS
        })
        .unwrap();
        assert_eq!(n, 5);
        let n = fill_buffer(&mut buf, 0, |_, _| nvmlReturn_enum_NVML_ERROR_NOT_FOUND).unwrap();
        assert_eq!(n, 0);
        let e = fill_buffer(&mut buf, 0, |_, _| {
            nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST
        });
        assert!(matches!(e, Err(NvmlError::GpuLost)), "{e:?}");
    }
}
