//! Xid errors: the driver's error reports (Xid 79, GPU fell off the bus; 48, double-bit ECC; 94
//! and 95, contained and uncontained ECC; 13 and 31, faults in an application's kernels ...).
//! NVML delivers them through an event set; the GPU source registers every device once and
//! drains the set without waiting on each reading, so no thread blocks on it.
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlEventTypeXidCriticalError,
    nvmlReturn_enum_NVML_ERROR_TIMEOUT,
};
use std::ptr;

/// The event set and the devices registered in it.
pub struct XidWatch {
    set: nvmlEventSet_t,
    /// (handle, GPU index) of each registered device.
    devices: Vec<(nvmlDevice_t, u32)>,
}

// SAFETY: NVML handles are plain tokens, valid from any thread while the library is
// initialised; NVML's API is thread-safe.
unsafe impl Send for XidWatch {}

impl XidWatch {
    /// Creates the set and registers each `(handle, index)` for Xid events. Devices that cannot
    /// deliver them (NOT_SUPPORTED) are returned apart with the error, not registered.
    pub fn open(
        nvml: &Nvml,
        devices: &[(nvmlDevice_t, u32)],
    ) -> Result<(Self, Vec<(u32, NvmlError)>), NvmlError> {
        let lib = nvml.lib();
        let create = nvml_sym(lib.nvmlEventSetCreate.as_ref())?;
        let register = nvml_sym(lib.nvmlDeviceRegisterEvents.as_ref())?;
        let mut set: nvmlEventSet_t = ptr::null_mut();
        // SAFETY: `set` is a valid out-pointer.
        nvml_try(unsafe { create(&mut set) })?;
        let mut watch = Self {
            set,
            devices: Vec::new(),
        };
        let mut failed = Vec::new();
        for &(handle, index) in devices {
            // SAFETY: the handle comes from this library instance; the set was created above.
            match nvml_try(unsafe {
                register(handle, u64::from(nvmlEventTypeXidCriticalError), set)
            }) {
                Ok(()) => watch.devices.push((handle, index)),
                Err(e) => failed.push((index, e)),
            }
        }
        Ok((watch, failed))
    }

    /// Appends every pending event as `(GPU index, Xid)` without waiting.
    pub fn drain(&self, nvml: &Nvml, out: &mut Vec<(u32, u64)>) -> Result<(), NvmlError> {
        let wait = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
        loop {
            let mut data = nvmlEventData_t {
                device: ptr::null_mut(),
                eventType: 0,
                eventData: 0,
                gpuInstanceId: 0,
                computeInstanceId: 0,
            };
            // SAFETY: `data` is a valid out-pointer; a 0 ms timeout only polls.
            let r = unsafe { wait(self.set, &mut data, 0) };
            if r == nvmlReturn_enum_NVML_ERROR_TIMEOUT {
                return Ok(());
            }
            nvml_try(r)?;
            if data.eventType & u64::from(nvmlEventTypeXidCriticalError) != 0 {
                if let Some((_, index)) = self.devices.iter().find(|(h, _)| *h == data.device) {
                    out.push((*index, data.eventData));
                }
            }
        }
    }

    /// Frees the set; call before the library shuts down.
    pub fn close(self, nvml: &Nvml) {
        if let Ok(free) = nvml_sym(nvml.lib().nvmlEventSetFree.as_ref()) {
            // SAFETY: the set was created by this library and is freed once.
            unsafe { free(self.set) };
        }
    }
}
