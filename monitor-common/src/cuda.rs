//! The CUDA family: uprobes on the driver library's own entry points (`libcuda.so`), which every
//! CUDA program calls whatever its framework, and which the NVIDIA container toolkit mounts into
//! each container from the host (one attachment by inode covers them all).
//!
//! Which entry points a PyTorch job calls, measured on an H100 host (driver 580.159.04, with
//! tracefs uprobes on every exported launch, copy and synchronise symbol;
//! `tests/gpu/cuda_calls.py`, `tests/fixtures/cuda-calls-h100/`):
//! - `tensor.to("cuda")`: `cuMemcpyHtoDAsync_v2` (the byte count in its third argument), then
//!   `cuStreamSynchronize` unless `non_blocking=True`; `.cpu()` the same with
//!   `cuMemcpyDtoHAsync_v2`; `.clone()` on the GPU `cuMemcpyDtoDAsync_v2`.
//! - `.item()`: a kernel launch, a 4-byte `cuMemcpyDtoHAsync_v2`, `cuStreamSynchronize`.
//! - kernels: `cuLaunchKernel` (PyTorch's own), `cuLaunchKernelEx` (cuBLAS); graph replay
//!   `cuGraphLaunch`; `torch.cuda.synchronize()` `cuCtxSynchronize_v2`; an event's wait
//!   `cuEventSynchronize`.
//!
//! What a hit costs the calling thread there, from a one-element-kernel loop that launches as
//! fast as its thread can: 133 k launches/s without probes, 119–127 k with an entry probe
//! (0.5–0.9 µs a hit), 95 k with an entry and a return probe (~3 µs). So launches are only
//! counted (an entry probe), and only the rare copies and synchronisations are timed (entry
//! and return).
//!
//! The attach cookie of each probe says what the call is ([`call_kind`]).

/// What a probed entry point does: its attach cookie.
pub mod call_kind {
    /// A kernel launch (counted only).
    pub const LAUNCH: u64 = 1;
    /// A CUDA graph's launch (counted only).
    pub const GRAPH_LAUNCH: u64 = 2;
    /// Host-to-device copy (timed; bytes from the third argument).
    pub const COPY_H2D: u64 = 3;
    /// Device-to-host copy.
    pub const COPY_D2H: u64 = 4;
    /// Device-to-device copy.
    pub const COPY_D2D: u64 = 5;
    /// A copy whose direction the call does not say (`cuMemcpy`, `cuMemcpyAsync`: unified
    /// addressing).
    pub const COPY_OTHER: u64 = 6;
    /// A synchronisation: stream, context or event (timed).
    pub const SYNC: u64 = 7;
    /// The copy kinds, in the order of [`super::CudaStats::copies`].
    pub const COPIES: [u64; 4] = [COPY_H2D, COPY_D2H, COPY_D2D, COPY_OTHER];

    /// The index into [`super::CudaStats::copies`] of a copy kind, `None` for the others.
    #[inline(always)]
    pub fn copy_index(kind: u64) -> Option<usize> {
        match kind {
            COPY_H2D => Some(0),
            COPY_D2H => Some(1),
            COPY_D2D => Some(2),
            COPY_OTHER => Some(3),
            _ => None,
        }
    }
}

/// A synchronisation that follows a copy on the same thread, with no launch between, waits for
/// that copy when the copy is of at least this many bytes, or when no kernel was launched since
/// the thread's last synchronisation: its time counts as the copy's wait, not as a
/// synchronisation. (A blocking `tensor.to("cuda")` is a copy and then a stream synchronise; a
/// `.item()`'s 4-byte copy follows a launch, and its synchronise waits for the kernels.)
pub const COPY_WAIT_MIN_BYTES: u64 = 1 << 20;

/// One kind of copy: how many, how many bytes, the time the calling threads spent in the copy
/// calls, in the synchronisations that waited for them right after, and between a copy and the
/// call before it in a run of copies (the loop's own time issuing them: 256 `tensor.to()` of
/// 256 KiB a step spent a sixth of their time there on the H100 host).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub count: u64,
    pub bytes: u64,
    pub call_ns: u64,
    pub wait_ns: u64,
    pub between_ns: u64,
}

/// A task's CUDA calls (per CPU in the kernel, summed by userspace), keyed by
/// [`TaskKey`](crate::TaskKey) as the other families are: its main thread apart.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaStats {
    pub launches: u64,
    pub graph_launches: u64,
    /// Host-to-device, device-to-host, device-to-device, direction unknown.
    pub copies: [CopyStats; 4],
    pub syncs: u64,
    pub sync_ns: u64,
}

/// A thread's timed call in flight (entry to return), and what it did last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCall {
    /// When the call was entered (0: none in flight).
    pub start_ns: u64,
    /// The stack pointer at entry: the return of this call sees it 8 bytes higher (the return
    /// address popped), which tells it from a nested probed call's return.
    pub sp: u64,
    /// Its [`call_kind`].
    pub kind: u64,
    /// The bytes a copy moves.
    pub bytes: u64,
    /// The copy kind of the thread's last copy, until a launch or a synchronisation follows it,
    /// when a synchronisation then waits for it: the copy is of at least
    /// [`COPY_WAIT_MIN_BYTES`], or no kernel was launched since the last synchronisation (the
    /// stream holds only copies); 0 otherwise.
    pub after_copy: u64,
    /// 1 once the thread launched a kernel since its last synchronisation.
    pub launched: u64,
    /// When the last call of the thread's run of copies returned (a copy, or the
    /// synchronisation that waited for it); 0 when no run is going on (a launch or another
    /// synchronisation came since).
    pub run_end_ns: u64,
    /// The gap before the copy in flight, since the run's last call: charged at its return.
    pub between_ns: u64,
}

/// Entries of the per-thread map of calls in flight, and of the per-task statistics.
pub const CUDA_THREAD_ENTRIES: u32 = 16_384;
pub const CUDA_TASK_ENTRIES: u32 = 8_192;

/// Indices into the CUDA programs' per-CPU failure counters.
pub mod cuda_stat {
    /// A map update failed.
    pub const MAP_UPDATE_FAILED: u32 = 0;
    /// A return without its entry (entered before the probes were attached, or evicted).
    pub const UNMATCHED_RETURN: u32 = 1;
    pub const COUNT: u32 = 2;
}
