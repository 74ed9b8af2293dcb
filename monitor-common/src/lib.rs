//! Types shared by the kernel programs (`monitor-ebpf`, `no_std`) and the userspace agent
//! (`gpuwatch`, with the `user` feature). Both sides compile this one definition, so a layout
//! change can never reach only one half.
#![no_std]

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

/// Thread-state time of one task (all its threads), summed per CPU. Intervals are charged when
/// they end (at the next switch or wakeup of the thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskTimes {
    /// Running on a CPU.
    pub on_cpu_ns: u64,
    /// Runnable, waiting in a run queue (preempted, or woken and not yet running).
    pub runq_ns: u64,
    /// Uninterruptible sleep (D): disk and other I/O waits.
    pub blocked_ns: u64,
    /// Interruptible sleep (S): waiting for an event, a lock, a queue, a timer.
    pub sleep_ns: u64,
    /// Times a thread was switched off a CPU.
    pub switches: u64,
    /// Of those, switches out into D state.
    pub blocked_switches: u64,
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

/// Where the kernel keeps a tracked thread between events: where it went at its last switch-out,
/// the read in flight, and what was charged to it since its last flush into the per-task sums.
///
/// The time comes from the scheduler's own bookkeeping, read at each switch-out from the task
/// itself: its run queue's clock (now), when it was last switched in (`sched_info.last_arrival`),
/// and its run-queue wait so far (`sched_info.run_delay`). So the stint that ends is on-CPU time,
/// and the episode before it splits into the run-queue wait (the growth of `run_delay`) and the
/// rest, in the state the thread switched out in (D or S). No wake-up or switch-in program is
/// needed, and a switch reads no clock.
///
/// Charging the thread's own entry costs no second map lookup; the tally goes into the per-CPU
/// `TASK_TIMES` sums only once it holds [`FLUSH_PENDING_NS`] of time or [`FLUSH_PENDING_SWITCHES`]
/// switches, and when the thread exits. So a window read by userspace lags the truth by at most
/// that much per thread, and a blocked thread's wait shows once it has run again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadState {
    /// The thread (its key in `THREADS`, kept to remove the entry through a pointer).
    pub tid: u32,
    /// Where it went at its last switch-out: one of the `thread_state` constants.
    pub state: u32,
    /// The scheduler clock at its last switch-out; 0 when none was seen yet.
    pub out_ns: u64,
    /// Its run-queue wait so far (`sched_info.run_delay`) at that switch-out.
    pub run_delay_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub pad: u32,
    /// Start of the read-family syscall in flight; 0 when none.
    pub read_start_ns: u64,
    /// Charged since the last flush.
    pub pending: PendingTimes,
    /// Reads finished since the last flush.
    pub reads: PendingReads,
}

/// A thread's times since its last flush (a [`TaskTimes`] with counters that cannot overflow
/// before the flush at [`FLUSH_PENDING_SWITCHES`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingTimes {
    pub on_cpu_ns: u64,
    pub runq_ns: u64,
    pub blocked_ns: u64,
    pub sleep_ns: u64,
    pub switches: u32,
    pub blocked_switches: u32,
}

/// A thread's finished reads, held in its entry like its times: a read costs no lookup of the
/// per-task read statistics until [`FLUSH_PENDING_READS`] of them are held (or the times flush).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingReads {
    pub bytes: u64,
    pub total_ns: u64,
    pub count: u32,
    /// Per latency bucket; the flush at [`FLUSH_PENDING_READS`] comes before a u8 overflows.
    pub hist: [u8; LATENCY_BUCKETS],
}

/// A thread's reads go into the per-task statistics once it holds this many (below 256, the
/// capacity of a [`PendingReads`] bucket).
pub const FLUSH_PENDING_READS: u32 = 64;
const _: () = assert!(FLUSH_PENDING_READS <= u8::MAX as u32);

/// What a CPU knows about the thread it runs, so that the events of a thread gpuwatch does not
/// track cost no hash lookup after its first: claimed for `tid` by the first event of the current
/// thread after a switch (every switch clears it), valid while `tid` is the current thread of that
/// CPU. Only the current thread can gain a `THREADS` entry (it is created
/// at one of its own events), so "no entry" stays true until the cache says otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCurrent {
    pub tid: u32,
    /// One of the `cpu_current` constants.
    pub known: u32,
    /// For `UNWATCHED`: the value of `WATCH_GENERATION` when the cgroup was checked. Userspace
    /// bumps it after adding cgroups to the watch list, so a stale "unwatched" is checked again.
    pub generation: u32,
    pub pad: u32,
    /// Start of the tracked thread's read in flight, 0 when none: `sys_enter_read` writes it
    /// here, with no lookup of the thread's entry; a switch-out in the middle of the read moves
    /// it into the entry, where `sys_exit_read` finds it on whichever CPU the thread resumes.
    pub read_start_ns: u64,
}

pub mod cpu_current {
    /// Nothing known: look the thread up.
    pub const UNKNOWN: u32 = 0;
    /// The thread has no `THREADS` entry; its cgroup is not checked yet.
    pub const NOT_TRACKED: u32 = 1;
    /// The thread has no `THREADS` entry and its cgroup was not watched at `generation`.
    pub const UNWATCHED: u32 = 2;
    /// The thread has a `THREADS` entry (unless the LRU evicted it since).
    pub const TRACKED: u32 = 3;
}

/// A thread's tally goes into the per-task sums once it holds this much time...
pub const FLUSH_PENDING_NS: u64 = 4_000_000;
/// ... or this many switches.
pub const FLUSH_PENDING_SWITCHES: u32 = 64;

/// Where a thread went at its switch-out.
pub mod thread_state {
    /// Preempted: still runnable, waiting in the run queue.
    pub const RUNQ: u32 = 1;
    /// Uninterruptible sleep (D): normally I/O.
    pub const BLOCKED: u32 = 2;
    /// Interruptible sleep (S): waiting for an event, a lock, a timer.
    pub const SLEEP: u32 = 3;
}

/// A block request in flight, keyed by device and sector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestKey {
    pub sector: u64,
    pub dev: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestStart {
    pub issued_ns: u64,
    pub task: TaskKey,
    pub bytes: u64,
}

/// Maximum number of (cgroup, tgid, thread kind) entries in each per-task map (LRU: the least
/// recently updated entry is evicted when full; userspace sees a counter go backwards and counts
/// it). Only watched workloads' tasks have entries, and exited ones are deleted each round. Each
/// round's batch read walks every hash bucket (one per entry, filled or not: ~4 ns each), and
/// the kernel preallocates entries × CPUs values, so this is no bigger than a busy host needs:
/// 8 containers × 64 processes × 2 kinds is 1,024.
pub const TASK_MAP_ENTRIES: u32 = 8_192;
/// Maximum number of threads tracked at once (threads of watched workloads only; an entry is
/// 128 bytes, preallocated).
pub const THREAD_MAP_ENTRIES: u32 = 65_536;
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

/// `prev_state` bits in `sched_switch` (TASK_REPORT): uninterruptible.
pub const TASK_UNINTERRUPTIBLE: u64 = 0x2;
/// The task is exiting (EXIT_DEAD, EXIT_ZOMBIE as reported).
pub const TASK_EXITING: u64 = 0x10 | 0x20;
/// The report mask: a `prev_state` with none of these bits is runnable (preempted).
pub const TASK_REPORT_MASK: u64 = 0xff;

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data `#[repr(C)]` structs of integers with explicit padding.
    unsafe impl aya::Pod for super::TaskKey {}
    unsafe impl aya::Pod for super::TaskTimes {}
    unsafe impl aya::Pod for super::IoStats {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn a_thread_entry_stays_small() {
        // THREAD_MAP_ENTRIES of these are preallocated in the kernel
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
