//! The scheduler family: thread-state time per task, charged at `sched_switch`.

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

/// `prev_state` bits in `sched_switch` (TASK_REPORT): uninterruptible.
pub const TASK_UNINTERRUPTIBLE: u64 = 0x2;
/// The task is exiting (EXIT_DEAD, EXIT_ZOMBIE as reported).
pub const TASK_EXITING: u64 = 0x10 | 0x20;
/// The report mask: a `prev_state` with none of these bits is runnable (preempted).
pub const TASK_REPORT_MASK: u64 = 0xff;
