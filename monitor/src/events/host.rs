//! Reading the host's processes and cgroups.

internal_event! {
    /// A GPU process exited between NVML's list and its `/proc` read.
    GpuProcessVanished { gpu: u32, error: String }
    |e| format!("GPU {}: {}", e.gpu, e.error)
}

internal_event! {
    /// A process's `/proc` entry could not be read: `subject` says whose.
    ProcReadFailed { subject: String, error: String }
    |e| format!("{}: {}", e.subject, e.error)
}

internal_event! {
    /// A workload's cgroup counters could not be read.
    CgroupStatsFailed { workload: String, error: String }
    |e| format!("{}: {}", e.workload, e.error)
}

internal_event! {
    /// A cgroup path shaped like a container's that is not that container's cgroup.
    CgroupLookalike { path: String, claimed: String }
    |e| format!(
        "cgroup {} looks like {} but is not that container's cgroup: shown as its own workload",
        e.path, e.claimed
    )
}
