//! The eBPF programs: the stall probes and the CUDA driver probes.

internal_event! {
    /// A probe's maps could not be read or written (`probe`: "stall" or "CUDA").
    ProbeMapReadFailed { probe: &'static str, error: String }
    |e| format!("{} probe maps: {}", e.probe, e.error)
}

internal_event! {
    /// More workloads to trace than the kernel filter holds.
    ProbeFilterFull { unwatched: usize, capacity: usize }
    |e| format!(
        "{} workloads not traced: the kernel filter holds {} cgroups",
        e.unwatched, e.capacity
    )
}

internal_event! {
    /// The read and block programs could not be attached or detached.
    ProbeIoAttachFailed { error: String }
    |e| e.error.clone()
}

internal_event! {
    /// A CUDA driver library could not be opened or probed.
    CudaProbeAttachFailed { library: String, error: String }
    |e| format!("{}: {}", e.library, e.error)
}

internal_event! {
    /// A GPU process maps more driver libraries, or a larger memory map, than the CUDA probes
    /// take on: what was left unprobed.
    CudaProbeLimit { pid: u32, detail: String }
    |e| format!("GPU process {}: {}", e.pid, e.detail)
}
