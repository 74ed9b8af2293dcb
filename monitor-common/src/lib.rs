//! Types shared by the kernel programs (`monitor-ebpf`, `no_std`) and the userspace agent
//! (`gpuwatch`, with the `user` feature). Both sides compile this one definition, so a layout
//! change can never reach only one half.
#![no_std]

/// Key of the per-task aggregation maps: the task's cgroup id on the unified (v2) hierarchy and
/// its thread-group id (the userspace PID).
///
/// Both are kept: on a hybrid host `bpf_get_current_cgroup_id()` sees only the unified hierarchy,
/// so userspace resolves the tgid through `/proc/<tgid>/cgroup` when the id alone is ambiguous.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    /// Explicit padding so the key has no uninitialised bytes (the kernel hashes all of them).
    pub pad: u32,
}

/// Scheduler counters for one [`TaskKey`], summed per CPU by the kernel program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedCounts {
    /// Times a thread of this task was switched off a CPU.
    pub switches: u64,
    /// Of those, switches out in uninterruptible sleep (TASK_UNINTERRUPTIBLE, "D": usually I/O).
    pub blocked_switches: u64,
}

/// Maximum number of (cgroup, tgid) entries in the scheduler map (an LRU map: the least recently
/// updated entry is evicted when full, which userspace detects as a counter going backwards).
pub const SCHED_MAP_ENTRIES: u32 = 16_384;

/// Maximum number of cgroups the kernel filter can watch.
pub const WATCHED_CGROUP_ENTRIES: u32 = 4_096;

/// Indices into the per-CPU `PROBE_STATS` array: the kernel side's own failure counters.
pub mod probe_stat {
    /// A map update failed (should not happen with LRU maps; counted, never silent).
    pub const MAP_UPDATE_FAILED: u32 = 0;
    /// Reading a tracepoint field failed.
    pub const FIELD_READ_FAILED: u32 = 1;
    /// Number of counters.
    pub const COUNT: u32 = 2;
}

/// `TASK_UNINTERRUPTIBLE` as reported in `sched_switch`'s `prev_state` (TASK_REPORT bits).
pub const TASK_UNINTERRUPTIBLE: u64 = 0x2;

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data `#[repr(C)]` structs of integers with explicit padding.
    unsafe impl aya::Pod for super::TaskKey {}
    unsafe impl aya::Pod for super::SchedCounts {}
}
