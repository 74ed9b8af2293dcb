//! The scheduler family: `sched_switch` charges a tracked thread's time at each switch-out
//! (on CPU, waiting in the run queue, in D, in S), from the scheduler's own bookkeeping in the
//! task; `sched_process_exit` flushes an exiting thread's tally.
use crate::reads::flush_reads;
use crate::task::CurrentTask;
use crate::threads::{current_entry, current_thread, forget_current, thread_task};
use crate::{global, per_cpu, read_generation, record_field, run, CPU_CURRENT};
use aya_ebpf::{
    macros::{map, tracepoint},
    maps::LruPerCpuHashMap,
    programs::TracePointContext,
};
use monitor_common::{
    read_clock, record_fields::slot, thread_state, PendingTimes, TaskKey, TaskTimes, ThreadState,
    FLUSH_PENDING_NS, FLUSH_PENDING_SWITCHES, READ_UNTIMED, TASK_EXITING, TASK_MAP_ENTRIES,
    TASK_REPORT_MASK, TASK_UNINTERRUPTIBLE,
};

// Field offsets (and sizes), from /sys/kernel/tracing/events/sched/sched_switch/format.
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_SIZE: u32 = 8;
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_PID_OFFSET: u32 = 0;

#[map]
static TASK_TIMES: LruPerCpuHashMap<TaskKey, TaskTimes> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);

/// Charges a tracked thread's time up to its switch-out at `now`, which `task` (the thread,
/// current) is undergoing in `prev_state`: the episode off the CPU before its last switch-in,
/// split into its run-queue wait and the state it switched out in then, and the stint on the
/// CPU since. Records where it goes now, and flushes the tally into the per-task sums when it is
/// due (see [`ThreadState`]) or the thread is exiting (its entry then goes).
///
/// # Safety
/// `st` points to the current thread's live `THREADS` entry; only the CPU running the thread
/// writes it.
#[inline(always)]
unsafe fn switched_out(
    st: *mut ThreadState,
    task: &CurrentTask,
    now: u64,
    prev_state: u64,
) -> Result<(), u32> {
    // SAFETY: this fn's contract: `st` is the current thread's live entry.
    unsafe {
        let arrival = task.last_arrival();
        let run_delay = task.run_delay();
        let p = &mut (*st).pending;
        if (*st).out_ns != 0 {
            let off_cpu = arrival.saturating_sub((*st).out_ns);
            let runq = run_delay.saturating_sub((*st).run_delay_ns).min(off_cpu);
            p.runq_ns += runq;
            let rest = off_cpu - runq;
            // `& 3`: the states are 1..=3; the mask lets the verifier bound the field LLVM may
            // compute from the state instead of branching.
            match (*st).state & 3 {
                thread_state::BLOCKED => p.blocked_ns += rest,
                thread_state::SLEEP => p.sleep_ns += rest,
                _ => p.runq_ns += rest,
            }
        }
        // (A thread first seen mid-stint is charged the whole stint: it ran all of it.)
        p.on_cpu_ns += now.saturating_sub(arrival);
        p.switches += 1;
        let blocked = prev_state & TASK_UNINTERRUPTIBLE != 0;
        p.blocked_switches += u32::from(blocked);
        let held = p.on_cpu_ns + p.runq_ns + p.blocked_ns + p.sleep_ns;
        let exiting = prev_state & TASK_EXITING != 0;
        if exiting || held >= FLUSH_PENDING_NS || p.switches >= FLUSH_PENDING_SWITCHES {
            flush(st)?;
        }
        if exiting {
            forget_current(task);
            return Ok(());
        }
        (*st).out_ns = now;
        (*st).run_delay_ns = run_delay;
        (*st).state = if prev_state & TASK_REPORT_MASK == 0 {
            thread_state::RUNQ // preempted: still runnable
        } else if blocked {
            thread_state::BLOCKED
        } else {
            thread_state::SLEEP
        };
        Ok(())
    }
}

/// Adds the thread's tally to its task's per-CPU sums and clears it.
///
/// # Safety
/// As for [`switched_out`].
#[inline(always)]
unsafe fn flush(st: *mut ThreadState) -> Result<(), u32> {
    // SAFETY: this fn's contract: `st` is the current thread's live entry.
    unsafe {
        let key = thread_task(st);
        let t = per_cpu(&TASK_TIMES, &key)?;
        let p = (*st).pending;
        (*t).on_cpu_ns += p.on_cpu_ns;
        (*t).runq_ns += p.runq_ns;
        (*t).blocked_ns += p.blocked_ns;
        (*t).sleep_ns += p.sleep_ns;
        (*t).switches += u64::from(p.switches);
        (*t).blocked_switches += u64::from(p.blocked_switches);
        (*st).pending = PendingTimes::default();
        if (*st).reads.count > 0 {
            flush_reads(st, &key)?;
        }
        Ok(())
    }
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    run(|| try_sched_switch(&ctx))
}

fn try_sched_switch(ctx: &TracePointContext) -> Result<(), u32> {
    let slot = CPU_CURRENT.get_ptr_mut(0);
    // The outgoing task is current.
    let prev: i32 =
        record_field::<i32, { slot::SCHED_SWITCH_PREV_PID }>(ctx, &SCHED_SWITCH_PREV_PID_OFFSET)?;
    // The outgoing task is current: one pointer to it for its entry and its bookkeeping.
    let task = CurrentTask::get();
    if let Some(st) = current_thread(&task, prev as u32)? {
        let prev_state: u64 = if global(&SCHED_SWITCH_PREV_STATE_SIZE) == 8 {
            record_field::<u64, { slot::SCHED_SWITCH_PREV_STATE_8 }>(
                ctx,
                &SCHED_SWITCH_PREV_STATE_OFFSET,
            )?
        } else {
            u64::from(record_field::<u32, { slot::SCHED_SWITCH_PREV_STATE_4 }>(
                ctx,
                &SCHED_SWITCH_PREV_STATE_OFFSET,
            )?)
        };
        let now = task.rq_clock();
        // SAFETY: `st` is this thread's live entry, and the thread is current (see
        // `switched_out`).
        unsafe {
            // A read in flight leaves this CPU with the thread (`current_thread` claimed the
            // slot for it); one not timed is timed from here, on the run queue's clock: a read
            // that switches out always is (see `monitor_common::reads`). A second switch-out
            // in the same read finds the slot empty and keeps the first one's start.
            if let Some(c) = slot {
                let start = (*c).read_start_ns;
                if start != 0 {
                    (*st).read_generation = read_generation();
                    if start == READ_UNTIMED {
                        (*st).read_start_ns = now;
                        (*st).read_clock = read_clock::RUN_QUEUE;
                    } else {
                        (*st).read_start_ns = start;
                        (*st).read_clock = read_clock::MONOTONIC;
                    }
                }
            }
            switched_out(st, &task, now, prev_state)?;
        }
    }
    // The incoming thread: nothing to charge (its wait is charged at its own switch-out); this
    // CPU's slot describes no thread until that thread's first event claims it.
    if let Some(c) = slot {
        // SAFETY: see `cpu_current`.
        unsafe { (*c).tid = 0 };
    }
    Ok(())
}

#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    run(|| {
        // The exiting thread is current: its tally goes into the sums now. (Its last
        // switch-out, state X, flushes what little comes after and removes the entry.)
        let task = CurrentTask::get();
        match current_entry(&task, task.tid()) {
            // SAFETY: see `switched_out`.
            Some(st) => unsafe { flush(st) },
            None => Ok(()),
        }
    })
}
