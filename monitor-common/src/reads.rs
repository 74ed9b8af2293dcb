//! The reads family: the read-family syscalls (read, pread64, readv, preadv, preadv2) of tracked
//! threads. Every read is counted, with its bytes. Its time, from entry to exit, costs two clock
//! reads (about 20 ns each in these VMs: as much as the rest of the two programs together), so
//! not every read is timed:
//!
//! - a read that switches out (blocks, or is preempted) is always timed, and weighs 1 in the
//!   sums and the histogram: from entry to exit when it was sampled, else from its first
//!   switch-out to its last switch-in, on the scheduler's own clock, which the switch program
//!   reads anyway (the time on the CPU before and after, a few µs, is not seen);
//! - of the reads that do not switch out, one in [`READ_SAMPLE_WEIGHT`], picked at random at
//!   entry, is timed and weighs [`READ_SAMPLE_WEIGHT`].
//!
//! So the time in reads and the histogram are estimates of every read's, exact for the slow
//! ones (every read of 16 ms or more blocks), and the histogram's total is close to the count.
use crate::LATENCY_BUCKETS;

/// One read in this many of those that do not switch out is timed, and weighs this much.
pub const READ_SAMPLE_WEIGHT: u32 = 8;

/// The start of a read in flight that is not timed (a timestamp is never 1).
pub const READ_UNTIMED: u64 = 1;

/// The clock of a tracked thread's `read_start_ns` (its `read_clock`).
pub mod read_clock {
    /// `bpf_ktime_get_ns`: a sampled read's entry.
    pub const MONOTONIC: u16 = 0;
    /// The run queue's clock at the read's first switch-out; the read ends at the thread's
    /// last switch-in (`sched_info.last_arrival`, the same clock).
    pub const RUN_QUEUE: u16 = 1;
}

/// A thread's finished reads, held in its entry like its times: a read costs no lookup of the
/// per-task read statistics until [`FLUSH_PENDING_READS`] of them are held (or the times flush).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingReads {
    pub bytes: u64,
    pub total_ns: u64,
    pub count: u32,
    /// Weighted reads per latency bucket; the flush at [`FLUSH_PENDING_READS`] comes before a
    /// u8 overflows (a u8 keeps the thread's entry at two cache lines).
    pub hist: [u8; LATENCY_BUCKETS],
}

/// A thread's reads go into the per-task statistics once it holds this many: few enough that
/// every one of them weighing [`READ_SAMPLE_WEIGHT`] in one bucket still fits a u8.
pub const FLUSH_PENDING_READS: u32 = 31;
const _: () = assert!(FLUSH_PENDING_READS * READ_SAMPLE_WEIGHT <= u8::MAX as u32);
