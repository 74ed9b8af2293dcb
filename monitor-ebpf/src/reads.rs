//! The reads family: the read-family syscalls of tracked threads, counted, and timed as
//! [`monitor_common::reads`] says (every read that switches out, one in eight of the others).
//! The start waits in this CPU's slot (or, if the thread is switched out mid-read, in its
//! entry); a finished read is tallied in the entry and flushed to the per-task statistics in
//! batches.
use crate::task::CurrentTask;
use crate::threads::{cpu_current, current_thread, may_be_tracked, thread_task};
use crate::{global, per_cpu, read_generation, record_field, run, TIME_EVERY_READ};
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::LruPerCpuHashMap,
    programs::TracePointContext,
};
use monitor_common::{
    latency_bucket, probe_stat, read_clock, record_fields::slot, CpuCurrent, IoStats, PendingReads,
    TaskKey, ThreadState, FLUSH_PENDING_READS, READ_SAMPLE_WEIGHT, READ_UNTIMED, TASK_MAP_ENTRIES,
};

// From /sys/kernel/tracing/events/syscalls/sys_exit_read/format (the same in every read exit).
#[unsafe(no_mangle)]
static SYS_EXIT_RET_OFFSET: u32 = 0;
#[map]
static READ_STATS: LruPerCpuHashMap<TaskKey, IoStats> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);
/// Adds the thread's pending reads to its task's per-CPU read statistics and clears them.
///
/// # Safety
/// As for [`switched_out`].
#[inline(always)]
pub(crate) unsafe fn flush_reads(st: *mut ThreadState, key: &TaskKey) -> Result<(), u32> {
    // SAFETY: this fn's contract: `st` is the current thread's live entry.
    unsafe {
        let s = per_cpu(&READ_STATS, key)?;
        let r = &mut (*st).reads;
        (*s).count += u64::from(r.count);
        (*s).bytes += r.bytes;
        (*s).total_ns += r.total_ns;
        for (h, p) in (*s).hist.iter_mut().zip(r.hist.iter()) {
            *h += u64::from(*p);
        }
        *r = PendingReads::default();
        Ok(())
    }
}

#[tracepoint]
pub fn sys_enter_read(_ctx: TracePointContext) -> u32 {
    run(try_sys_enter_read)
}

/// Marks a read in flight in this CPU's slot, timed or not (see [`monitor_common::reads`]):
/// no lookup of the thread's entry (the exit, or a switch-out, finds whether it is tracked),
/// and a clock read only for the reads sampled.
fn try_sys_enter_read() -> Result<(), u32> {
    let tid = CurrentTask::get().tid();
    let Some(c) = cpu_current(tid) else {
        return Ok(());
    };
    // SAFETY: see `cpu_current`.
    unsafe {
        if may_be_tracked((*c).known) {
            (*c).read_start_ns = if sampled(c, tid) {
                bpf_ktime_get_ns()
            } else {
                READ_UNTIMED
            };
        }
    }
    Ok(())
}

/// Whether to time this read: one in [`READ_SAMPLE_WEIGHT`], from this CPU's xorshift32 (no
/// helper call; a fixed stride would alias with a loader's own pattern of reads).
///
/// # Safety
/// As for `cpu_current`'s slot.
#[inline(always)]
unsafe fn sampled(c: *mut CpuCurrent, tid: u32) -> bool {
    // SAFETY: this fn's contract: `c` is this CPU's live slot.
    unsafe {
        if global(&TIME_EVERY_READ) != 0 {
            return true;
        }
        let mut x = (*c).sample_state;
        if x == 0 {
            x = tid | 1;
        }
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (*c).sample_state = x;
        x.is_multiple_of(READ_SAMPLE_WEIGHT)
    }
}

/// What a sampled read that did not switch out weighs.
#[inline(always)]
fn sample_weight() -> u32 {
    if global(&TIME_EVERY_READ) != 0 {
        1
    } else {
        READ_SAMPLE_WEIGHT
    }
}

#[tracepoint]
pub fn sys_exit_read(ctx: TracePointContext) -> u32 {
    run(|| try_sys_exit_read(&ctx))
}

fn try_sys_exit_read(ctx: &TracePointContext) -> Result<(), u32> {
    let task = CurrentTask::get();
    let tid = task.tid();
    let Some(c) = cpu_current(tid) else {
        return Ok(());
    };
    // SAFETY: see `cpu_current`.
    if !may_be_tracked(unsafe { (*c).known }) {
        return Ok(()); // not a watched thread
    }
    // SAFETY: see `cpu_current`.
    let in_slot = unsafe { core::mem::replace(&mut (*c).read_start_ns, 0) };
    let Some(st) = current_thread(&task, tid)? else {
        return Ok(());
    };
    // The start is in this CPU's slot (the read did not switch out), or, when the thread was
    // switched out during the read, in its entry. SAFETY: only this thread, running here,
    // writes either; 0 marks none in flight.
    let in_entry = unsafe { core::mem::replace(&mut (*st).read_start_ns, 0) };
    // How long it took, and what it weighs (see `monitor_common::reads`).
    // A start in the entry from before the read programs' last gap belongs to a read whose end
    // went unseen: this end has none.
    // SAFETY: as above.
    let stale = in_slot == 0 && unsafe { (*st).read_generation } != read_generation();
    let (dt, weight) = match (in_slot, in_entry) {
        (0, 0) => return Err(probe_stat::UNMATCHED_END),
        (0, _) if stale => return Err(probe_stat::UNMATCHED_END),
        // SAFETY: as above.
        (0, s) if unsafe { (*st).read_clock } == read_clock::RUN_QUEUE => {
            (task.last_arrival().saturating_sub(s), 1)
        }
        // SAFETY: helper without preconditions.
        (0, s) => (unsafe { bpf_ktime_get_ns() }.saturating_sub(s), 1),
        (READ_UNTIMED, _) => (0, 0),
        // SAFETY: as above.
        (s, _) => (
            unsafe { bpf_ktime_get_ns() }.saturating_sub(s),
            sample_weight(),
        ),
    };
    let ret: i64 = record_field::<i64, { slot::SYS_EXIT_RET }>(ctx, &SYS_EXIT_RET_OFFSET)?;
    // SAFETY: see `switched_out`; `latency_bucket` is below LATENCY_BUCKETS.
    unsafe {
        let r = &mut (*st).reads;
        r.count += 1;
        r.bytes += if ret > 0 { ret as u64 } else { 0 };
        if weight > 0 {
            r.total_ns += dt * u64::from(weight);
            if let Some(h) = r.hist.get_mut(latency_bucket(dt)) {
                *h += weight as u8;
            }
        }
        if r.count >= FLUSH_PENDING_READS {
            flush_reads(st, &thread_task(st))?;
        }
    }
    Ok(())
}
