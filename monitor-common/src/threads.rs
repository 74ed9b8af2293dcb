//! The tracked thread every family charges: its entry in `THREADS`, and what each CPU knows
//! about the thread it runs.
use crate::reads::PendingReads;
use crate::sched::PendingTimes;

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
/// `TASK_TIMES` sums only once it holds [`FLUSH_PENDING_NS`](crate::FLUSH_PENDING_NS) of time or [`FLUSH_PENDING_SWITCHES`](crate::FLUSH_PENDING_SWITCHES)
/// switches, and when the thread exits. So a window read by userspace lags the truth by at most
/// that much per thread, and a blocked thread's wait shows once it has run again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadState {
    /// The thread.
    pub tid: u32,
    /// Where it went at its last switch-out: one of the `thread_state` constants.
    pub state: u32,
    /// The scheduler clock at its last switch-out; 0 when none was seen yet.
    pub out_ns: u64,
    /// Its run-queue wait so far (`sched_info.run_delay`) at that switch-out.
    pub run_delay_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    /// The clock of `read_start_ns`: one of the [`read_clock`](crate::reads::read_clock)
    /// constants.
    pub read_clock: u16,
    /// `READ_GENERATION` (its low 16 bits) when `read_start_ns` was moved here. Userspace bumps
    /// it when it attaches the read programs after a gap with their ends off, so a start left
    /// here by a read whose end went unseen never meets a later end. (It wraps at 65,536
    /// attaches: only a start left from exactly that many attaches ago would pass.)
    pub read_generation: u16,
    /// Start of the read-family syscall in flight, moved here at its switch-out; 0 when none.
    pub read_start_ns: u64,
    /// Charged since the last flush.
    pub pending: PendingTimes,
    /// Reads finished since the last flush.
    pub reads: PendingReads,
}

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
    /// This CPU's xorshift state, which picks the reads to time (never 0 once used).
    pub sample_state: u32,
    /// Start of the current thread's read in flight: 0 when none, [`READ_UNTIMED`] when it is
    /// not timed. `sys_enter_read` writes it here, with no lookup of the thread's entry; a
    /// switch-out in the middle of the read moves it into a tracked thread's entry (timed from
    /// then if it was not), where `sys_exit_read` finds it on whichever CPU the thread resumes.
    ///
    /// [`READ_UNTIMED`]: crate::READ_UNTIMED
    pub read_start_ns: u64,
}

pub mod cpu_current {
    /// Nothing known: look the thread up.
    pub const UNKNOWN: u32 = 0;
    /// The thread has no `THREADS` entry; its cgroup is not checked yet.
    pub const NOT_TRACKED: u32 = 1;
    /// The thread has no `THREADS` entry and its cgroup was not watched at `generation`.
    pub const UNWATCHED: u32 = 2;
    /// The thread has a `THREADS` entry.
    pub const TRACKED: u32 = 3;
}
