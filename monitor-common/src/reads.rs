//! The reads family: the read-family syscalls (read, pread64, readv, preadv, preadv2) of tracked
//! threads, timed from entry to exit.
use crate::LATENCY_BUCKETS;

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
