//! gpuwatch's kernel programs. Tracepoints only: the target kernels have no kprobes or fentry.
//!
//! - Thread-state time per (cgroup, tgid): `sched_switch` (the outgoing task is current; its
//!   `prev_state` says where it goes: run queue, D or S), `sched_wakeup` / `sched_wakeup_new`
//!   (keyed by the *woken* pid: current is the waker), switch-in via `next_pid`.
//! - Blocking reads: `sys_enter_*` / `sys_exit_*` of read, pread64, readv, preadv, preadv2.
//! - Disk: `block_rq_issue` / `block_rq_complete`, attributed to the issuing task.
//!
//! Each program is a thin `#[tracepoint]` fn that calls a `try_*` fn; failures are counted in
//! `PROBE_STATS`, never dropped silently. Field offsets come from this kernel's format files
//! (userspace overrides the globals below before load). Everything is aggregated in the kernel;
//! userspace reads cumulative counters.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray},
    programs::TracePointContext,
};
use monitor_common::{
    latency_bucket, probe_stat, thread_state, IoStats, RequestKey, RequestStart, TaskKey,
    TaskTimes, ThreadState, REQUEST_MAP_ENTRIES, TASK_EXITING, TASK_MAP_ENTRIES, TASK_REPORT_MASK,
    TASK_UNINTERRUPTIBLE, THREAD_MAP_ENTRIES, WATCHED_CGROUP_ENTRIES,
};

// Field offsets (and sizes), from /sys/kernel/tracing/events/<cat>/<event>/format.
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_SIZE: u32 = 8;
#[unsafe(no_mangle)]
static SCHED_SWITCH_NEXT_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SCHED_WAKEUP_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SYS_EXIT_RET_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static BLOCK_ISSUE_DEV_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static BLOCK_ISSUE_SECTOR_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static BLOCK_ISSUE_BYTES_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static BLOCK_COMPLETE_DEV_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static BLOCK_COMPLETE_SECTOR_OFFSET: u32 = 0;

/// Non-zero: track only tasks whose cgroup id is in `WATCHED_CGROUPS` (userspace fills it with
/// the workloads it reports), so the per-event cost stays flat however busy the host is.
#[unsafe(no_mangle)]
static FILTER_BY_CGROUP: u32 = 0;

#[map]
static WATCHED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(WATCHED_CGROUP_ENTRIES, 0);
#[map]
static THREADS: LruHashMap<u32, ThreadState> = LruHashMap::with_max_entries(THREAD_MAP_ENTRIES, 0);
#[map]
static TASK_TIMES: LruPerCpuHashMap<TaskKey, TaskTimes> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);
#[map]
static READ_START: LruHashMap<u32, u64> = LruHashMap::with_max_entries(THREAD_MAP_ENTRIES, 0);
#[map]
static READ_STATS: LruPerCpuHashMap<TaskKey, IoStats> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);
#[map]
static REQUESTS: LruHashMap<RequestKey, RequestStart> =
    LruHashMap::with_max_entries(REQUEST_MAP_ENTRIES, 0);
#[map]
static DISK_STATS: LruPerCpuHashMap<TaskKey, IoStats> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);
#[map]
static PROBE_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(probe_stat::COUNT, 0);

#[inline(always)]
fn count_stat(index: u32) {
    if let Some(slot) = PROBE_STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn global(value: &u32) -> u32 {
    // SAFETY: the loader rewrites these read-only globals before load; a volatile read keeps the
    // compiler from folding in the compile-time default.
    unsafe { core::ptr::read_volatile(value) }
}

#[inline(always)]
fn field<T>(ctx: &TracePointContext, offset: &u32) -> Result<T, u32> {
    // SAFETY: offsets come from this kernel's format files; the helper checks the read.
    unsafe { ctx.read_at::<T>(global(offset) as usize) }.map_err(|_| probe_stat::FIELD_READ_FAILED)
}

/// The current task's key, or `None` when the filter is on and its cgroup is not watched.
#[inline(always)]
fn current_task() -> Option<(TaskKey, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == 0 {
        return None; // the idle task
    }
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: lookup of a plain u8 value.
    if global(&FILTER_BY_CGROUP) != 0 && unsafe { WATCHED_CGROUPS.get(&cgroup_id) }.is_none() {
        return None;
    }
    Some((
        TaskKey {
            cgroup_id,
            tgid,
            pad: 0,
        },
        pid_tgid as u32,
    ))
}

/// The per-CPU value for `key`, created zeroed if absent.
#[inline(always)]
fn per_cpu<V: Default>(map: &LruPerCpuHashMap<TaskKey, V>, key: &TaskKey) -> Result<*mut V, u32> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Ok(v);
    }
    map.insert(key, V::default(), 0)
        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)?;
    map.get_ptr_mut(key).ok_or(probe_stat::MAP_UPDATE_FAILED)
}

/// Charges the interval a tracked thread spent in its recorded state, up to `now`.
#[inline(always)]
fn charge(st: &ThreadState, now: u64, extra_switch: bool, blocked_switch: bool) -> Result<(), u32> {
    let key = TaskKey {
        cgroup_id: st.cgroup_id,
        tgid: st.tgid,
        pad: 0,
    };
    let t = per_cpu(&TASK_TIMES, &key)?;
    let dt = now.saturating_sub(st.since_ns);
    // SAFETY: per-CPU value, written only by this CPU.
    unsafe {
        match st.state {
            thread_state::ON_CPU => (*t).on_cpu_ns += dt,
            thread_state::RUNQ => (*t).runq_ns += dt,
            thread_state::BLOCKED => (*t).blocked_ns += dt,
            _ => (*t).sleep_ns += dt,
        }
        (*t).switches += u64::from(extra_switch);
        (*t).blocked_switches += u64::from(blocked_switch);
    }
    Ok(())
}

fn finish(r: Result<(), u32>) -> u32 {
    if let Err(stat) = r {
        count_stat(stat);
    }
    0
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    finish(try_sched_switch(&ctx))
}

fn try_sched_switch(ctx: &TracePointContext) -> Result<(), u32> {
    let now = unsafe { bpf_ktime_get_ns() };
    // The outgoing task is current.
    if let Some((key, tid)) = current_task() {
        let prev_state: u64 = if global(&SCHED_SWITCH_PREV_STATE_SIZE) == 8 {
            field::<u64>(ctx, &SCHED_SWITCH_PREV_STATE_OFFSET)?
        } else {
            u64::from(field::<u32>(ctx, &SCHED_SWITCH_PREV_STATE_OFFSET)?)
        };
        let blocked = prev_state & TASK_UNINTERRUPTIBLE != 0;
        let state = if prev_state & TASK_REPORT_MASK == 0 {
            thread_state::RUNQ // preempted: still runnable
        } else if blocked {
            thread_state::BLOCKED
        } else {
            thread_state::SLEEP
        };
        // Update the thread's entry in place when it has one: replacing an element of an LRU
        // hash allocates, and this runs on every context switch.
        match THREADS.get_ptr_mut(&tid) {
            Some(st) => {
                // SAFETY: the entry stays valid for this program's run; only the CPU running the
                // thread updates it here.
                let copy = unsafe { *st };
                let on_cpu = if copy.state == thread_state::ON_CPU {
                    copy
                } else {
                    // its switch-in was missed: charge no on-CPU time
                    ThreadState {
                        since_ns: now,
                        ..copy
                    }
                };
                charge(&on_cpu, now, true, blocked)?;
                if prev_state & TASK_EXITING != 0 {
                    let _ = THREADS.remove(&tid);
                } else {
                    unsafe {
                        (*st).since_ns = now;
                        (*st).state = state;
                        (*st).cgroup_id = key.cgroup_id;
                    }
                }
            }
            None => {
                let st = ThreadState {
                    since_ns: now,
                    cgroup_id: key.cgroup_id,
                    tgid: key.tgid,
                    state: thread_state::ON_CPU,
                };
                charge(&st, now, true, blocked)?;
                if prev_state & TASK_EXITING == 0 {
                    let st = ThreadState { state, ..st };
                    THREADS
                        .insert(&tid, &st, 0)
                        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)?;
                }
            }
        }
    }
    // The incoming task: close whatever it was waiting in (normally the run queue).
    let next: i32 = field(ctx, &SCHED_SWITCH_NEXT_PID_OFFSET)?;
    let next = next as u32;
    if let Some(st) = THREADS.get_ptr_mut(&next) {
        // SAFETY: the entry stays valid for this program's run; concurrent updates of one
        // thread's entry cannot happen (a thread is switched in on one CPU at a time).
        let copy = unsafe { *st };
        charge(&copy, now, false, false)?;
        unsafe {
            (*st).state = thread_state::ON_CPU;
            (*st).since_ns = now;
        }
    }
    Ok(())
}

#[tracepoint]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    finish(try_sched_wakeup(&ctx))
}

fn try_sched_wakeup(ctx: &TracePointContext) -> Result<(), u32> {
    // Current is the waker: the woken thread comes from the record.
    let pid: i32 = field(ctx, &SCHED_WAKEUP_PID_OFFSET)?;
    let pid = pid as u32;
    let Some(st) = THREADS.get_ptr_mut(&pid) else {
        return Ok(());
    };
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: see try_sched_switch.
    let copy = unsafe { *st };
    if copy.state == thread_state::BLOCKED || copy.state == thread_state::SLEEP {
        charge(&copy, now, false, false)?;
        unsafe {
            (*st).state = thread_state::RUNQ;
            (*st).since_ns = now;
        }
    }
    Ok(())
}

#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    // The exiting thread is current; its last switch-out (state X) removes its entry too.
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = READ_START.remove(&tid);
    0
}

#[tracepoint]
pub fn sys_enter_read(_ctx: TracePointContext) -> u32 {
    finish(try_sys_enter_read())
}

fn try_sys_enter_read() -> Result<(), u32> {
    let Some((_, tid)) = current_task() else {
        return Ok(());
    };
    let now = unsafe { bpf_ktime_get_ns() };
    // In place when the thread has read before (the common case): replacing an element of an
    // LRU hash allocates.
    if let Some(start) = READ_START.get_ptr_mut(&tid) {
        // SAFETY: only this thread, on this CPU, writes its slot.
        unsafe { *start = now };
        return Ok(());
    }
    READ_START
        .insert(&tid, &now, 0)
        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)
}

#[tracepoint]
pub fn sys_exit_read(ctx: TracePointContext) -> u32 {
    finish(try_sys_exit_read(&ctx))
}

fn try_sys_exit_read(ctx: &TracePointContext) -> Result<(), u32> {
    let Some((key, tid)) = current_task() else {
        return Ok(());
    };
    let Some(slot) = READ_START.get_ptr_mut(&tid) else {
        return Err(probe_stat::UNMATCHED_END);
    };
    // SAFETY: only this thread writes its slot. 0 marks "no read in flight"; the entry stays for
    // the thread's next read and goes at its exit.
    let start = unsafe { core::mem::replace(&mut *slot, 0) };
    if start == 0 {
        return Err(probe_stat::UNMATCHED_END);
    }
    let ret: i64 = field(ctx, &SYS_EXIT_RET_OFFSET)?;
    let dt = unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
    add_io(&READ_STATS, &key, dt, if ret > 0 { ret as u64 } else { 0 })
}

#[inline(always)]
fn add_io(
    map: &LruPerCpuHashMap<TaskKey, IoStats>,
    key: &TaskKey,
    dt: u64,
    bytes: u64,
) -> Result<(), u32> {
    let s = per_cpu(map, key)?;
    let b = latency_bucket(dt);
    // SAFETY: per-CPU value, written only by this CPU; `b` is below LATENCY_BUCKETS.
    unsafe {
        (*s).count += 1;
        (*s).bytes += bytes;
        (*s).total_ns += dt;
        if let Some(h) = (*s).hist.get_mut(b) {
            *h += 1;
        }
    }
    Ok(())
}

#[tracepoint]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    finish(try_block_rq_issue(&ctx))
}

fn try_block_rq_issue(ctx: &TracePointContext) -> Result<(), u32> {
    // Attributed to the issuing task (for synchronous and direct I/O, the reader itself).
    let Some((task, _)) = current_task() else {
        return Ok(());
    };
    let key = RequestKey {
        sector: field(ctx, &BLOCK_ISSUE_SECTOR_OFFSET)?,
        dev: field(ctx, &BLOCK_ISSUE_DEV_OFFSET)?,
        pad: 0,
    };
    let bytes: u32 = field(ctx, &BLOCK_ISSUE_BYTES_OFFSET)?;
    let start = RequestStart {
        issued_ns: unsafe { bpf_ktime_get_ns() },
        task,
        bytes: u64::from(bytes),
    };
    REQUESTS
        .insert(&key, &start, 0)
        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)
}

#[tracepoint]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    finish(try_block_rq_complete(&ctx))
}

fn try_block_rq_complete(ctx: &TracePointContext) -> Result<(), u32> {
    // Usually interrupt context: everything comes from the issue record.
    let key = RequestKey {
        sector: field(ctx, &BLOCK_COMPLETE_SECTOR_OFFSET)?,
        dev: field(ctx, &BLOCK_COMPLETE_DEV_OFFSET)?,
        pad: 0,
    };
    // SAFETY: copied at once.
    let Some(start) = (unsafe { REQUESTS.get(&key) }).copied() else {
        return Ok(()); // a request of an unwatched cgroup, or issued before tracing
    };
    let _ = REQUESTS.remove(&key);
    let dt = unsafe { bpf_ktime_get_ns() }.saturating_sub(start.issued_ns);
    add_io(&DISK_STATS, &start.task, dt, start.bytes)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
