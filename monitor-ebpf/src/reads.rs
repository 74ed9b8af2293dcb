//! The reads family: the read-family syscalls of tracked threads, from entry to exit. The start
//! waits in this CPU's slot (or, if the thread is switched out mid-read, in its entry); a
//! finished read is tallied in the entry and flushed to the per-task statistics in batches.
use crate::threads::{cpu_current, current_thread, may_be_tracked, thread, thread_task};
use crate::{field_at, per_cpu, run};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::LruPerCpuHashMap,
    programs::TracePointContext,
};
use monitor_common::{
    cpu_current, latency_bucket, probe_stat, IoStats, PendingReads, TaskKey, ThreadState,
    FLUSH_PENDING_READS, TASK_MAP_ENTRIES,
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

#[tracepoint]
pub fn sys_enter_read(_ctx: TracePointContext) -> u32 {
    run(|| try_sys_enter_read())
}

fn try_sys_enter_read() -> Result<(), u32> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(c) = cpu_current(tid) else {
        return Ok(());
    };
    // SAFETY: see `cpu_current`. A tracked thread's read start goes into the slot, and only
    // there: no lookup of its entry.
    unsafe {
        if (*c).known == cpu_current::TRACKED || current_thread(tid)?.is_some() {
            (*c).read_start_ns = bpf_ktime_get_ns();
        }
    }
    Ok(())
}

#[tracepoint]
pub fn sys_exit_read(ctx: TracePointContext) -> u32 {
    run(|| try_sys_exit_read(&ctx))
}

fn try_sys_exit_read(ctx: &TracePointContext) -> Result<(), u32> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(c) = cpu_current(tid) else {
        return Ok(());
    };
    // SAFETY: see `cpu_current`.
    if !may_be_tracked(unsafe { (*c).known }) {
        return Ok(()); // not a watched thread
    }
    let entry = thread(tid);
    // SAFETY: see `cpu_current`.
    unsafe {
        (*c).known = if entry.is_some() {
            cpu_current::TRACKED
        } else {
            cpu_current::NOT_TRACKED
        };
    }
    let Some(st) = entry else {
        return Ok(());
    };
    // The start is in this CPU's slot, or, when the thread was switched out during the read, in
    // its entry. SAFETY: only this thread, running here, writes either; 0 marks none in flight.
    let start = unsafe {
        let in_slot = core::mem::replace(&mut (*c).read_start_ns, 0);
        let in_entry = core::mem::replace(&mut (*st).read_start_ns, 0);
        if in_slot != 0 {
            in_slot
        } else {
            in_entry
        }
    };
    if start == 0 {
        return Err(probe_stat::UNMATCHED_END);
    }
    let ret: i64 = field_at::<i64, 16>(ctx, &SYS_EXIT_RET_OFFSET)?;
    let dt = unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
    // SAFETY: see `switched_out`; `latency_bucket` is below LATENCY_BUCKETS.
    unsafe {
        let r = &mut (*st).reads;
        r.count += 1;
        r.bytes += if ret > 0 { ret as u64 } else { 0 };
        r.total_ns += dt;
        if let Some(h) = r.hist.get_mut(latency_bucket(dt)) {
            *h += 1;
        }
        if r.count >= FLUSH_PENDING_READS {
            flush_reads(st, &thread_task(st))?;
        }
    }
    Ok(())
}
