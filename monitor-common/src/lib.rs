//! Types shared by the kernel programs (`monitor-ebpf`, `no_std`) and the userspace agent
//! (`gpuwatch`, with the `user` feature). Both sides compile this one definition, so a layout
//! change can never reach only one half. One file per probe family ([`sched`], [`reads`],
//! [`block`]) and the tracked thread they share ([`threads`]); what every family uses (the task
//! key, I/O statistics, map sizes, the kernel side's failure counters) is here.
#![no_std]

pub mod block;
pub mod cuda;
pub mod reads;
pub mod record_fields;
pub mod sched;
pub mod threads;

pub use block::{RequestKey, RequestStart};
pub use cuda::{CopyStats, CudaCall, CudaStats};
pub use reads::{read_clock, PendingReads, FLUSH_PENDING_READS, READ_SAMPLE_WEIGHT, READ_UNTIMED};
pub use sched::{
    thread_state, PendingTimes, TaskTimes, FLUSH_PENDING_NS, FLUSH_PENDING_SWITCHES, TASK_EXITING,
    TASK_REPORT_MASK, TASK_UNINTERRUPTIBLE,
};
pub use threads::{cpu_current, CpuCurrent, ThreadState};

/// Key of the per-task aggregation maps: the task's cgroup id on the unified (v2) hierarchy, its
/// thread-group id (the userspace PID), and which of its threads: the main one, or the others
/// together.
///
/// Cgroup and tgid are both kept: on a hybrid host `bpf_get_current_cgroup_id()` sees only the
/// unified hierarchy, so userspace can resolve the tgid through `/proc/<tgid>/cgroup` when the
/// id alone is ambiguous. The main thread is kept apart because a training loop runs there:
/// its waits are the trainer's own (for the next batch, say), not those of the dozens of
/// helper threads a PyTorch process also holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    /// [`task_thread::MAIN`] for the thread whose id is the tgid, [`task_thread::OTHERS`] for
    /// the rest (and for disk requests). A full `u32`, so the key has no uninitialised bytes
    /// (the kernel hashes all of them).
    pub thread: u32,
}

/// Values of [`TaskKey::thread`].
pub mod task_thread {
    pub const OTHERS: u32 = 0;
    pub const MAIN: u32 = 1;
}

/// Number of log2 latency buckets: bucket `i` counts latencies in [2^i, 2^(i+1)) µs, bucket 0
/// also everything under 1 µs, the last one everything above.
pub const LATENCY_BUCKETS: usize = 20;

/// Count, bytes and latency of a kind of operation (read syscalls, disk requests).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    pub count: u64,
    pub bytes: u64,
    pub total_ns: u64,
    pub hist: [u64; LATENCY_BUCKETS],
}

/// The log2-µs bucket of a latency: the largest `b` with `ns >= 1000 << b` (that is, with
/// `ns / 1000 >= 2^b`), found by binary lifting, with no loop (the verifier counts every
/// instruction) and no division (a 64-bit divide is among the dearest instructions a program
/// runs per read).
#[inline(always)]
pub fn latency_bucket(ns: u64) -> usize {
    const US: u64 = 1_000;
    let mut b = 0u32;
    if ns >= US << 16 {
        b = 16;
    }
    if ns >= US << (b + 8) {
        b += 8;
    }
    if ns >= US << (b + 4) {
        b += 4;
    }
    if ns >= US << (b + 2) {
        b += 2;
    }
    if ns >= US << (b + 1) {
        b += 1;
    }
    (b as usize).min(LATENCY_BUCKETS - 1)
}

/// Maximum number of (cgroup, tgid, thread kind) entries in each per-task map (LRU: the least
/// recently updated entry is evicted when full; userspace sees a counter go backwards and counts
/// it). Only watched workloads' tasks have entries, and exited ones are deleted each round. Each
/// round's batch read walks every hash bucket (one per entry, filled or not: ~4 ns each), and
/// the kernel preallocates entries × CPUs values, so this is no bigger than a busy host needs:
/// 8 containers × 64 processes × 2 kinds is 1,024.
pub const TASK_MAP_ENTRIES: u32 = 8_192;
/// Maximum number of block requests in flight tracked at once.
pub const REQUEST_MAP_ENTRIES: u32 = 16_384;
/// Maximum number of cgroups the kernel filter can watch.
pub const WATCHED_CGROUP_ENTRIES: u32 = 4_096;

/// Indices into the per-CPU `PROBE_STATS` array: the kernel side's own failure counters.
pub mod probe_stat {
    /// A map update failed (full non-LRU map, or a race).
    pub const MAP_UPDATE_FAILED: u32 = 0;
    /// Reading a tracepoint field failed.
    pub const FIELD_READ_FAILED: u32 = 1;
    /// A syscall exit or request completion without its start (started before tracing, or
    /// evicted from the LRU start map).
    pub const UNMATCHED_END: u32 = 2;
    /// Number of counters.
    pub const COUNT: u32 = 3;
}

#[cfg(feature = "user")]
mod user {
    /// `aya::Pod` for types that are plain old data: `#[repr(C)]` structs of integers with
    /// explicit padding, so every byte pattern the kernel writes is a valid value.
    macro_rules! plain_old_data {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: `$t` is a `#[repr(C)]` struct of integers with explicit padding.
            unsafe impl aya::Pod for $t {}
        )*};
    }
    plain_old_data!(
        super::TaskKey,
        super::TaskTimes,
        super::IoStats,
        super::CpuCurrent,
        super::RequestKey,
        super::RequestStart,
        super::CudaStats,
    );
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn a_thread_entry_stays_small() {
        // one of these per tracked thread, in the kernel's task-local storage
        assert_eq!(core::mem::size_of::<ThreadState>(), 128);
        assert_eq!(core::mem::size_of::<CpuCurrent>(), 24);
    }

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(999), 0);
        assert_eq!(latency_bucket(1_999), 0);
        assert_eq!(latency_bucket(2_000), 1);
        assert_eq!(latency_bucket(3_999), 1);
        assert_eq!(latency_bucket(4_000), 2);
        assert_eq!(latency_bucket(1_000_000), 9); // 1 ms: [512, 1024) µs
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        for i in 0..LATENCY_BUCKETS - 1 {
            assert_eq!(latency_bucket((1u64 << i) * 1_000), i, "{i}");
            if i > 0 {
                assert_eq!(latency_bucket((1u64 << i) * 1_000 - 1), i - 1, "{i}");
            }
        }
        // the same as log2 of whole microseconds, everywhere
        let mut x = 1u64;
        while x < u64::MAX / 3 {
            for ns in [x, x + 1, x * 2 - 1] {
                let us = ns / 1_000;
                let want = if us == 0 { 0 } else { us.ilog2() as usize };
                assert_eq!(latency_bucket(ns), want.min(LATENCY_BUCKETS - 1), "{ns}");
            }
            x = x * 3 / 2 + 1;
        }
    }
}
