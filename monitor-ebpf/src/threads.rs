//! The tracked thread every family charges: its entry in task-local storage (created at the
//! thread's own first event while its cgroup is watched, freed by the kernel with the task),
//! and this CPU's cache of what it knows about the thread it runs, so an untracked thread's
//! events cost no lookup after the first. Every program looks up only the current task's entry,
//! which task-local storage finds through the task itself, with no hash.
use crate::task::CurrentTask;
use crate::{current_task, CPU_CURRENT, WATCH_GENERATION};
use aya_ebpf::{
    bindings::{bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, BPF_F_NO_PREALLOC},
    helpers::{bpf_task_storage_delete, bpf_task_storage_get},
    macros::btf_map,
};
use monitor_common::{cpu_current, probe_stat, task_thread, CpuCurrent, TaskKey, ThreadState};

/// A BTF map definition of task-local storage (aya-ebpf 0.2 has none), laid out as libbpf and
/// aya read one: each field's pointee type carries the map's type, key, value and flags.
#[repr(C)]
pub(crate) struct TaskStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholders the loader patches; never dereferenced from here.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current task's value; with `init`, created from it when absent.
    #[inline(always)]
    fn current(&self, task: &CurrentTask, init: Option<&T>) -> Option<*mut T> {
        let (value, flags) = match init {
            Some(v) => (v as *const T as *mut core::ffi::c_void, 1), // F_CREATE
            None => (core::ptr::null_mut(), 0),
        };
        // SAFETY: the map is this definition; the task is current, a trusted BTF pointer.
        let p = unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut core::ffi::c_void,
                task.as_ptr(),
                value,
                flags,
            )
        } as *mut T;
        (!p.is_null()).then_some(p)
    }

    /// Drops the current task's value.
    #[inline(always)]
    fn delete_current(&self, task: &CurrentTask) {
        // SAFETY: as for `current`.
        unsafe {
            bpf_task_storage_delete(self as *const Self as *mut core::ffi::c_void, task.as_ptr());
        }
    }
}

#[btf_map]
static THREADS: TaskStorage<ThreadState> = TaskStorage::new();

/// Drops the current thread's entry (it is exiting).
#[inline(always)]
pub(crate) fn forget_current(task: &CurrentTask) {
    THREADS.delete_current(task);
}

/// The task a thread's tally and reads are summed into.
///
/// # Safety
/// `st` points to a live `THREADS` entry.
#[inline(always)]
pub(crate) unsafe fn thread_task(st: *const ThreadState) -> TaskKey {
    // SAFETY: this fn's contract: `st` is a live entry.
    unsafe {
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
}

/// The current thread's entry, if it is tracked.
#[inline(always)]
fn thread(task: &CurrentTask) -> Option<*mut ThreadState> {
    THREADS.current(task, None)
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
pub(crate) fn current_entry(task: &CurrentTask, tid: u32) -> Option<*mut ThreadState> {
    if let Some(c) = cpu_current(tid) {
        // SAFETY: see `cpu_current`.
        if !may_be_tracked(unsafe { (*c).known }) {
            return None;
        }
    }
    thread(task)
}

/// The entry of the current thread `tid`: found by tid (a thread has one only if its cgroup was
/// watched when it was first seen), else created when its cgroup is watched now. What it learns
/// about an untracked thread goes into this CPU's cache, so that thread's next events skip the
/// lookups. The caller passes the tid because `sched_switch` has it in its record, for free.
#[inline(always)]
pub(crate) fn current_thread(
    task: &CurrentTask,
    tid: u32,
) -> Result<Option<*mut ThreadState>, u32> {
    if tid == 0 {
        return Ok(None); // the idle task
    }
    let cache = cpu_current(tid);
    // SAFETY: see `cpu_current`.
    let known = cache.map_or(cpu_current::UNKNOWN, |c| unsafe { (*c).known });
    if may_be_tracked(known) {
        if let Some(st) = thread(task) {
            if let Some(c) = cache {
                // SAFETY: see `cpu_current`.
                unsafe { (*c).known = cpu_current::TRACKED };
            }
            return Ok(Some(st));
        }
    }
    // Read before the cgroup check: a cgroup watched after this read bumps the generation.
    let generation = WATCH_GENERATION.get(0).copied().unwrap_or(0);
    if known == cpu_current::UNWATCHED
        // SAFETY: see `cpu_current`.
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
    let entry = THREADS
        .current(task, Some(&st))
        .ok_or(probe_stat::MAP_UPDATE_FAILED)?;
    if let Some(c) = cache {
        // SAFETY: see `cpu_current`.
        unsafe { (*c).known = cpu_current::TRACKED };
    }
    Ok(Some(entry))
}
