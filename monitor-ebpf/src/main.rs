//! gpuwatch's kernel programs. Tracepoints only: the target kernels have no kprobes or fentry.
//!
//! Each program is a thin `#[tracepoint]` fn that calls a `try_*` fn returning `Result`; failures
//! are counted in `PROBE_STATS`, never dropped silently.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::{HashMap, LruPerCpuHashMap, PerCpuArray},
    programs::TracePointContext,
};
use monitor_common::{
    probe_stat, SchedCounts, TaskKey, SCHED_MAP_ENTRIES, TASK_UNINTERRUPTIBLE,
    WATCHED_CGROUP_ENTRIES,
};

/// Offset of `prev_state` in `sched/sched_switch`'s record, read by userspace from the
/// tracepoint's format file at start-up (it moves between kernels). Zero means "unknown": the
/// program then counts switches but not blocked ones.
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_OFFSET: u32 = 0;
/// Size in bytes of `prev_state` (4 on old kernels, 8 since it became `long`).
#[unsafe(no_mangle)]
static SCHED_SWITCH_PREV_STATE_SIZE: u32 = 8;

/// Non-zero: count only tasks whose cgroup id is in `WATCHED_CGROUPS` (userspace fills it with
/// the workloads it reports), so the per-event cost stays flat however busy the host is.
#[unsafe(no_mangle)]
static FILTER_BY_CGROUP: u32 = 0;

#[map]
static WATCHED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(WATCHED_CGROUP_ENTRIES, 0);

#[map]
static SCHED_COUNTS: LruPerCpuHashMap<TaskKey, SchedCounts> =
    LruPerCpuHashMap::with_max_entries(SCHED_MAP_ENTRIES, 0);

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
fn read_global(value: &u32) -> u32 {
    // SAFETY: the loader may rewrite these read-only globals before load; a volatile read keeps
    // the compiler from folding in the compile-time default.
    unsafe { core::ptr::read_volatile(value) }
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    match try_sched_switch(&ctx) {
        Ok(()) => 0,
        Err(stat) => {
            count_stat(stat);
            0
        }
    }
}

fn try_sched_switch(ctx: &TracePointContext) -> Result<(), u32> {
    // At sched_switch the current task is `prev`, the one leaving the CPU.
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == 0 {
        return Ok(()); // the idle task
    }
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: lookup of a plain u8 value.
    if read_global(&FILTER_BY_CGROUP) != 0 && unsafe { WATCHED_CGROUPS.get(&cgroup_id) }.is_none() {
        return Ok(());
    }
    let key = TaskKey {
        cgroup_id,
        tgid,
        pad: 0,
    };

    let blocked = match read_global(&SCHED_SWITCH_PREV_STATE_OFFSET) {
        0 => false,
        offset => {
            let state = if read_global(&SCHED_SWITCH_PREV_STATE_SIZE) == 8 {
                // SAFETY: the offset comes from this kernel's format file.
                unsafe { ctx.read_at::<u64>(offset as usize) }
            } else {
                unsafe { ctx.read_at::<u32>(offset as usize) }.map(u64::from)
            };
            match state {
                Ok(state) => state & TASK_UNINTERRUPTIBLE != 0,
                Err(_) => {
                    count_stat(probe_stat::FIELD_READ_FAILED);
                    false
                }
            }
        }
    };

    if let Some(counts) = SCHED_COUNTS.get_ptr_mut(key) {
        // SAFETY: per-CPU value, written only by this CPU.
        unsafe {
            (*counts).switches += 1;
            (*counts).blocked_switches += u64::from(blocked);
        }
        return Ok(());
    }
    let counts = SchedCounts {
        switches: 1,
        blocked_switches: u64::from(blocked),
    };
    SCHED_COUNTS
        .insert(key, counts, 0)
        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
