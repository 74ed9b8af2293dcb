//! The current task, as the kernel's own `task_struct`: what the programs read of it (its tid,
//! the scheduler's bookkeeping) are plain loads at offsets from this kernel's BTF, and the same
//! pointer finds its task-local storage. A program takes it once (one helper call) and passes it
//! on; each further helper call is a call and a return the program pays on every event.
use crate::global;
use aya_ebpf::{bindings::task_struct, helpers::bpf_get_current_task_btf};

// Byte offsets into the kernel's structures, from its BTF.
/// `task_struct.pid`: the thread's id.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;
/// `task_struct.sched_info.run_delay`: the task's run-queue wait so far.
#[unsafe(no_mangle)]
static TASK_RUN_DELAY_OFFSET: u32 = 0;
/// `task_struct.sched_info.last_arrival`: the run-queue clock at its last switch-in.
#[unsafe(no_mangle)]
static TASK_LAST_ARRIVAL_OFFSET: u32 = 0;
/// `task_struct.se.cfs_rq`, `cfs_rq.rq`, `rq.clock`: the way to its run queue's clock.
#[unsafe(no_mangle)]
static TASK_CFS_RQ_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFS_RQ_RQ_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static RQ_CLOCK_OFFSET: u32 = 0;

/// The current task (the verifier checks each load's offset against the kernel's BTF).
pub(crate) struct CurrentTask(*const u8);

impl CurrentTask {
    #[inline(always)]
    pub(crate) fn get() -> Self {
        // SAFETY: helper without preconditions; it returns the current task, never null.
        Self(unsafe { bpf_get_current_task_btf() } as *const u8)
    }

    /// The task, for helpers that take a `task_struct`.
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *mut task_struct {
        self.0 as *mut task_struct
    }

    /// The `T` at `offset` from `base`.
    ///
    /// # Safety
    /// `base` is a kernel object pointer from BTF, and `offset` the offset of a member of `T`'s
    /// size in it; the verifier holds the program to that, and a faulting load reads 0.
    #[inline(always)]
    unsafe fn at<T>(base: *const u8, offset: &u32) -> T {
        // SAFETY: this fn's contract: a BTF member of `T`'s size in a kernel object.
        unsafe { core::ptr::read_volatile(base.add(global(offset) as usize) as *const T) }
    }

    /// Its thread id (the low half of `bpf_get_current_pid_tgid`), with no helper call.
    #[inline(always)]
    pub(crate) fn tid(&self) -> u32 {
        // SAFETY: see `at`; the offset comes from BTF, `pid` is a 32-bit `pid_t`.
        unsafe { Self::at::<u32>(self.0, &TASK_PID_OFFSET) }
    }

    /// Its run-queue wait so far, ns.
    #[inline(always)]
    pub(crate) fn run_delay(&self) -> u64 {
        // SAFETY: as above, a u64.
        unsafe { Self::at::<u64>(self.0, &TASK_RUN_DELAY_OFFSET) }
    }

    /// Its run queue's clock at its last switch-in.
    #[inline(always)]
    pub(crate) fn last_arrival(&self) -> u64 {
        // SAFETY: as above.
        unsafe { Self::at::<u64>(self.0, &TASK_LAST_ARRIVAL_OFFSET) }
    }

    /// Its run queue's clock, which the scheduler updates before a switch: at `sched_switch`,
    /// the time of the switch, on the same clock as `last_arrival`.
    #[inline(always)]
    pub(crate) fn rq_clock(&self) -> u64 {
        // SAFETY: as above, through two pointers the kernel keeps valid while the task runs.
        unsafe {
            let cfs_rq = Self::at::<u64>(self.0, &TASK_CFS_RQ_OFFSET) as *const u8;
            let rq = Self::at::<u64>(cfs_rq, &CFS_RQ_RQ_OFFSET) as *const u8;
            Self::at::<u64>(rq, &RQ_CLOCK_OFFSET)
        }
    }
}
