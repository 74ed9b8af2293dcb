//! gpuwatch's kernel programs. Tracepoints only: the target kernels have no kprobes or fentry.
//!
//! - Thread-state time per (cgroup, tgid): `sched_switch` alone. The outgoing task is current;
//!   its `prev_state` says where it goes (run queue, D or S), and the scheduler's own bookkeeping,
//!   read from the task, says how long it ran and how long it waited in the run queue before
//!   (see [`ThreadState`]). So neither wake-ups nor switch-ins need a program.
//! - Blocking reads: `sys_enter_*` / `sys_exit_*` of read, pread64, readv, preadv, preadv2.
//! - Disk: `block_rq_issue` / `block_rq_complete`, attributed to the issuing task.
//!
//! One file per probe family, as [`monitor_common`] has one per family for the types both halves
//! compile: [`sched`], [`reads`], [`block`], and [`threads`] for the tracked thread they share,
//! [`task`] for the current task they read it through.
//! Here: what every family uses (the cgroup filter, the per-CPU cache, the failure counters,
//! field reads).
//!
//! Each program is a thin `#[tracepoint]` fn that calls a `try_*` fn; failures are counted in
//! `PROBE_STATS`, never dropped silently. Field offsets come from this kernel's format files
//! (userspace overrides the globals below before load). Everything is aggregated in the kernel;
//! userspace reads cumulative counters. Offsets into the kernel's own structures come from its
//! BTF, and those reads are plain loads through `bpf_get_current_task_btf`.
#![no_std]
#![no_main]

mod block;
mod reads;
mod sched;
mod task;
mod threads;

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid},
    macros::map,
    maps::{Array, HashMap, LruPerCpuHashMap, PerCpuArray},
    programs::TracePointContext,
    EbpfContext,
};
use monitor_common::{
    probe_stat, record_fields, task_thread, CpuCurrent, TaskKey, WATCHED_CGROUP_ENTRIES,
};

/// Non-zero: track only tasks whose cgroup id is in `WATCHED_CGROUPS` (userspace fills it with
/// the workloads it reports), so the per-event cost stays flat however busy the host is.
#[unsafe(no_mangle)]
static FILTER_BY_CGROUP: u32 = 0;

/// Non-zero: every program returns at once. Benchmarks load this to measure what the tracepoints
/// themselves cost, below any program. (A read-only global: the verifier drops the dead branch.)
#[unsafe(no_mangle)]
static EMPTY_PROGRAMS: u32 = 0;

/// Bit `slot` set: that record field's loads were relocated to its offset on this kernel (see
/// `monitor_common::record_fields`).
#[unsafe(no_mangle)]
static DIRECT_RECORD_FIELDS: u32 = 0;

/// Non-zero: every read is timed, weighing 1, instead of the sample `monitor_common::reads`
/// describes. Benchmarks load this to check the sample's estimates against.
#[unsafe(no_mangle)]
static TIME_EVERY_READ: u32 = 0;

#[map]
static WATCHED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(WATCHED_CGROUP_ENTRIES, 0);
/// Bumped by userspace after it adds cgroups to `WATCHED_CGROUPS` (see [`CpuCurrent`]).
#[map]
static WATCH_GENERATION: Array<u32> = Array::with_max_entries(1, 0);
/// Bumped by userspace when it attaches the read programs after a gap (see
/// `ThreadState::read_generation`).
#[map]
static READ_GENERATION: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static CPU_CURRENT: PerCpuArray<CpuCurrent> = PerCpuArray::with_max_entries(1, 0);
#[map]
static PROBE_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(probe_stat::COUNT, 0);

#[inline(always)]
fn count_stat(index: u32) {
    if let Some(slot) = PROBE_STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *slot += 1 };
    }
}

/// The read programs' attach generation, as a thread's entry keeps it.
#[inline(always)]
fn read_generation() -> u16 {
    READ_GENERATION.get(0).copied().unwrap_or(0) as u16
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

/// Loads the record field of `SLOT` (see `monitor_common::record_fields`): straight from the
/// record, at the offset userspace wrote into this load before loading, when it could (one
/// instruction); else through the probe-read helper at `offset`.
#[inline(always)]
fn record_field<T: Copy, const SLOT: u32>(ctx: &TracePointContext, offset: &u32) -> Result<T, u32> {
    if global(&DIRECT_RECORD_FIELDS) & (1 << SLOT) != 0 {
        // SAFETY: userspace rewrote this load's marker offset to the field's, which the format
        // file gives with T's size and which is aligned for it; the record holds it. A
        // volatile load of exactly T, at a constant offset from the context.
        return Ok(unsafe {
            core::ptr::read_volatile(
                (ctx.as_ptr() as *const u8).add(record_fields::marker(SLOT) as usize) as *const T,
            )
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
    if global(&FILTER_BY_CGROUP) != 0 && unsafe { WATCHED_CGROUPS.get(cgroup_id) }.is_none() {
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
