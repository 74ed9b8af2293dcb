//! gpuwatch's kernel programs. Tracepoints only: the target kernels have no kprobes or fentry.
//!
//! - Thread-state time per (cgroup, tgid): `sched_switch` alone. The outgoing task is current;
//!   its `prev_state` says where it goes (run queue, D or S), and the scheduler's own bookkeeping,
//!   read from the task, says how long it ran and how long it waited in the run queue before
//!   (see [`ThreadState`]). So neither wake-ups nor switch-ins need a program.
//! - Blocking reads: `sys_enter_*` / `sys_exit_*` of read, pread64, readv, preadv, preadv2.
//! - Disk: `block_rq_issue` / `block_rq_complete`, attributed to the issuing task.
//!
//! Each program is a thin `#[tracepoint]` fn that calls a `try_*` fn; failures are counted in
//! `PROBE_STATS`, never dropped silently. Field offsets come from this kernel's format files
//! (userspace overrides the globals below before load). Everything is aggregated in the kernel;
//! userspace reads cumulative counters. Offsets into the kernel's own structures come from its
//! BTF, and those reads are plain loads through `bpf_get_current_task_btf`.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task_btf,
        bpf_ktime_get_ns,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray},
    programs::TracePointContext,
    EbpfContext,
};
use monitor_common::{
    cpu_current, latency_bucket, probe_stat, task_thread, thread_state, CpuCurrent, IoStats,
    PendingReads, PendingTimes, RequestKey, RequestStart, TaskKey, TaskTimes, ThreadState,
    FLUSH_PENDING_NS, FLUSH_PENDING_READS, FLUSH_PENDING_SWITCHES, REQUEST_MAP_ENTRIES,
    TASK_EXITING, TASK_MAP_ENTRIES, TASK_REPORT_MASK, TASK_UNINTERRUPTIBLE, THREAD_MAP_ENTRIES,
    WATCHED_CGROUP_ENTRIES,
};

// Field offsets (and sizes), from /sys/kernel/tracing/events/<cat>/<event>/format.
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_SIZE: u32 = 8;
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_PID_OFFSET: u32 = 0;
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

// Byte offsets into the kernel's structures, from its BTF.
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

/// Non-zero: track only tasks whose cgroup id is in `WATCHED_CGROUPS` (userspace fills it with
/// the workloads it reports), so the per-event cost stays flat however busy the host is.
#[unsafe(no_mangle)]
static FILTER_BY_CGROUP: u32 = 0;

/// Non-zero: every program returns at once. Benchmarks load this to measure what the tracepoints
/// themselves cost, below any program. (A read-only global: the verifier drops the dead branch.)
#[unsafe(no_mangle)]
static EMPTY_PROGRAMS: u32 = 0;

#[map]
static WATCHED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(WATCHED_CGROUP_ENTRIES, 0);
/// Bumped by userspace after it adds cgroups to `WATCHED_CGROUPS` (see [`CpuCurrent`]).
#[map]
static WATCH_GENERATION: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static CPU_CURRENT: PerCpuArray<CpuCurrent> = PerCpuArray::with_max_entries(1, 0);
#[map]
static THREADS: LruHashMap<u32, ThreadState> = LruHashMap::with_max_entries(THREAD_MAP_ENTRIES, 0);
#[map]
static TASK_TIMES: LruPerCpuHashMap<TaskKey, TaskTimes> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);
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

/// Reads a field straight from the record when this kernel put it at offset `A` (the layout of
/// current kernels): a load at a constant offset from the context, which the verifier accepts
/// and which costs one instruction. Any other offset goes through the probe-read helper.
#[inline(always)]
fn field_at<T: Copy, const A: usize>(ctx: &TracePointContext, offset: &u32) -> Result<T, u32> {
    if global(offset) as usize == A {
        // SAFETY: the format file says the field is at `A` with T's size; the record holds it.
        // A volatile, aligned load of exactly T, at a constant offset from the context.
        return Ok(unsafe {
            core::ptr::read_volatile((ctx.as_ptr() as *const u8).add(A) as *const T)
        });
    }
    field(ctx, offset)
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
            thread: task_thread::OTHERS,
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

/// The current task, as the kernel's own `task_struct`: the scheduler fields gpuwatch reads are
/// plain loads (the verifier checks each offset against the kernel's BTF).
struct CurrentTask(*const u8);

impl CurrentTask {
    #[inline(always)]
    fn get() -> Self {
        // SAFETY: helper without preconditions; it returns the current task, never null.
        Self(unsafe { bpf_get_current_task_btf() } as *const u8)
    }

    /// The u64 at `offset` from `base`.
    ///
    /// # Safety
    /// `base` is a kernel object pointer from BTF, and `offset` a u64 member's offset in it;
    /// the verifier holds the program to that, and a faulting load reads 0.
    #[inline(always)]
    unsafe fn u64_at(base: *const u8, offset: &u32) -> u64 {
        core::ptr::read_volatile(base.add(global(offset) as usize) as *const u64)
    }

    /// Its run-queue wait so far, ns.
    #[inline(always)]
    fn run_delay(&self) -> u64 {
        // SAFETY: see `u64_at`; the offset comes from BTF.
        unsafe { Self::u64_at(self.0, &TASK_RUN_DELAY_OFFSET) }
    }

    /// Its run queue's clock at its last switch-in.
    #[inline(always)]
    fn last_arrival(&self) -> u64 {
        // SAFETY: as above.
        unsafe { Self::u64_at(self.0, &TASK_LAST_ARRIVAL_OFFSET) }
    }

    /// Its run queue's clock, which the scheduler updates before a switch: at `sched_switch`,
    /// the time of the switch, on the same clock as `last_arrival`.
    #[inline(always)]
    fn rq_clock(&self) -> u64 {
        // SAFETY: as above, through two pointers the kernel keeps valid while the task runs.
        unsafe {
            let cfs_rq = Self::u64_at(self.0, &TASK_CFS_RQ_OFFSET) as *const u8;
            let rq = Self::u64_at(cfs_rq, &CFS_RQ_RQ_OFFSET) as *const u8;
            Self::u64_at(rq, &RQ_CLOCK_OFFSET)
        }
    }
}

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
        let _ = THREADS.remove(&(*st).tid);
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

/// The task a thread's tally and reads are summed into.
///
/// # Safety
/// `st` points to a live `THREADS` entry.
#[inline(always)]
unsafe fn thread_task(st: *const ThreadState) -> TaskKey {
    TaskKey {
        cgroup_id: (*st).cgroup_id,
        tgid: (*st).tgid,
        thread: if (*st).tid == (*st).tgid {
            task_thread::MAIN
        } else {
            task_thread::OTHERS
        },
    }
}

/// Adds the thread's tally to its task's per-CPU sums and clears it.
///
/// # Safety
/// As for [`switched_out`].
#[inline(always)]
unsafe fn flush(st: *mut ThreadState) -> Result<(), u32> {
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

/// Adds the thread's pending reads to its task's per-CPU read statistics and clears them.
///
/// # Safety
/// As for [`switched_out`].
#[inline(always)]
unsafe fn flush_reads(st: *mut ThreadState, key: &TaskKey) -> Result<(), u32> {
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

/// The entry of thread `tid`, if it is tracked.
#[inline(always)]
fn thread(tid: u32) -> Option<*mut ThreadState> {
    THREADS.get_ptr_mut(&tid)
}

/// This CPU's cache slot, claimed for `tid` (the current thread) when it describes another one:
/// a switch-in the program did not see.
#[inline(always)]
fn cpu_current(tid: u32) -> Option<*mut CpuCurrent> {
    let c = CPU_CURRENT.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot; only programs running on this CPU, one at a time, touch it.
    unsafe {
        if (*c).tid != tid {
            (*c).tid = tid;
            (*c).known = cpu_current::UNKNOWN;
            (*c).read_start_ns = 0;
        }
    }
    Some(c)
}

/// Whether the slot's thread may have an entry (to be looked up).
#[inline(always)]
fn may_be_tracked(known: u32) -> bool {
    known == cpu_current::UNKNOWN || known == cpu_current::TRACKED
}

/// The current thread `tid`'s entry, if it has one: no lookup when this CPU already knows it has
/// none.
#[inline(always)]
fn current_entry(tid: u32) -> Option<*mut ThreadState> {
    if let Some(c) = cpu_current(tid) {
        // SAFETY: see `cpu_current`.
        if !may_be_tracked(unsafe { (*c).known }) {
            return None;
        }
    }
    thread(tid)
}

/// The entry of the current thread `tid`: found by tid (a thread has one only if its cgroup was
/// watched when it was first seen), else created when its cgroup is watched now. What it learns
/// about an untracked thread goes into this CPU's cache, so that thread's next events skip the
/// lookups. The caller passes the tid because `sched_switch` has it in its record, for free.
#[inline(always)]
fn current_thread(tid: u32) -> Result<Option<*mut ThreadState>, u32> {
    if tid == 0 {
        return Ok(None); // the idle task
    }
    let cache = cpu_current(tid);
    // SAFETY: see `cpu_current`.
    let known = cache.map_or(cpu_current::UNKNOWN, |c| unsafe { (*c).known });
    if may_be_tracked(known) {
        if let Some(st) = THREADS.get_ptr_mut(&tid) {
            if let Some(c) = cache {
                // SAFETY: see `cpu_current`.
                unsafe { (*c).known = cpu_current::TRACKED };
            }
            return Ok(Some(st));
        }
    }
    // Read before the cgroup check: a cgroup watched after this read bumps the generation.
    let generation = WATCH_GENERATION.get(0).copied().unwrap_or(0);
    // SAFETY: see `cpu_current`.
    if known == cpu_current::UNWATCHED
        && cache.is_some_and(|c| unsafe { (*c).generation } == generation)
    {
        return Ok(None);
    }
    // no entry; the cgroup is still to be checked
    let Some((key, _)) = current_task() else {
        if let Some(c) = cache {
            // SAFETY: see `cpu_current`.
            unsafe {
                (*c).known = cpu_current::UNWATCHED;
                (*c).generation = generation;
            }
        }
        return Ok(None);
    };
    let st = ThreadState {
        tid,
        cgroup_id: key.cgroup_id,
        tgid: key.tgid,
        ..ThreadState::default()
    };
    THREADS
        .insert(&tid, &st, 0)
        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)?;
    if let Some(c) = cache {
        // SAFETY: see `cpu_current`.
        unsafe { (*c).known = cpu_current::TRACKED };
    }
    Ok(THREADS.get_ptr_mut(&tid))
}

/// Runs a program's body, unless this is the empty-programs load, and counts its failure.
#[inline(always)]
fn run(body: impl FnOnce() -> Result<(), u32>) -> u32 {
    if global(&EMPTY_PROGRAMS) != 0 {
        return 0;
    }
    if let Err(stat) = body() {
        count_stat(stat);
    }
    0
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    run(|| try_sched_switch(&ctx))
}

fn try_sched_switch(ctx: &TracePointContext) -> Result<(), u32> {
    let slot = CPU_CURRENT.get_ptr_mut(0);
    // The outgoing task is current.
    let prev: i32 = field_at::<i32, 24>(ctx, &SCHED_SWITCH_PREV_PID_OFFSET)?;
    if let Some(st) = current_thread(prev as u32)? {
        let prev_state: u64 = if global(&SCHED_SWITCH_PREV_STATE_SIZE) == 8 {
            field_at::<u64, 32>(ctx, &SCHED_SWITCH_PREV_STATE_OFFSET)?
        } else {
            u64::from(field::<u32>(ctx, &SCHED_SWITCH_PREV_STATE_OFFSET)?)
        };
        let task = CurrentTask::get();
        let now = task.rq_clock();
        // SAFETY: `st` is this thread's live entry, and the thread is current (see
        // `switched_out`).
        unsafe {
            // A read in flight leaves this CPU with the thread (`current_thread` claimed the
            // slot for it).
            if let Some(c) = slot {
                if (*c).read_start_ns != 0 {
                    (*st).read_start_ns = (*c).read_start_ns;
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
        match current_entry(bpf_get_current_pid_tgid() as u32) {
            // SAFETY: see `switched_out`.
            Some(st) => unsafe { flush(st) },
            None => Ok(()),
        }
    })
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
    run(|| try_block_rq_issue(&ctx))
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
    run(|| try_block_rq_complete(&ctx))
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
