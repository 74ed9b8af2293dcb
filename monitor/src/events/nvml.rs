//! NVML's failures.

internal_event! {
    /// An NVML call failed: on one GPU (`target` "GPU 0") or the library's own (`NVML`).
    NvmlCallFailed { target: String, call: String, error: String }
    |e| format!("{}: {}: {}", e.target, e.call, e.error)
}

impl NvmlCallFailed {
    pub fn on_gpu(index: u32, call: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self {
            target: format!("GPU {index}"),
            call: call.into(),
            error: error.to_string(),
        }
    }

    pub fn library(call: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self {
            target: "NVML".into(),
            call: call.into(),
            error: error.to_string(),
        }
    }
}
