//! The tracked thread every family charges: its `THREADS` entry (created at the thread's own
//! first event while its cgroup is watched), and this CPU's cache of what it knows about the
//! thread it runs, so an untracked thread's events cost no lookup after the first.
use crate::{current_task, CPU_CURRENT, WATCH_GENERATION};
use aya_ebpf::{macros::map, maps::LruHashMap};
use monitor_common::{
    cpu_current, probe_stat, task_thread, CpuCurrent, TaskKey, ThreadState, THREAD_MAP_ENTRIES,
};

#[map]
pub(crate) static THREADS: LruHashMap<u32, ThreadState> =
    LruHashMap::with_max_entries(THREAD_MAP_ENTRIES, 0);

/// The task a thread's tally and reads are summed into.
///
/// # Safety
/// `st` points to a live `THREADS` entry.
#[inline(always)]
pub(crate) unsafe fn thread_task(st: *const ThreadState) -> TaskKey {
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

/// The entry of thread `tid`, if it is tracked.
#[inline(always)]
pub(crate) fn thread(tid: u32) -> Option<*mut ThreadState> {
    THREADS.get_ptr_mut(&tid)
}

/// This CPU's cache slot, claimed for `tid` (the current thread) when it describes another one:
/// a switch-in the program did not see.
#[inline(always)]
pub(crate) fn cpu_current(tid: u32) -> Option<*mut CpuCurrent> {
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
pub(crate) fn may_be_tracked(known: u32) -> bool {
    known == cpu_current::UNKNOWN || known == cpu_current::TRACKED
}

/// The current thread `tid`'s entry, if it has one: no lookup when this CPU already knows it has
/// none.
#[inline(always)]
pub(crate) fn current_entry(tid: u32) -> Option<*mut ThreadState> {
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
pub(crate) fn current_thread(tid: u32) -> Result<Option<*mut ThreadState>, u32> {
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
