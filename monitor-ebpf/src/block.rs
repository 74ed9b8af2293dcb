//! The block family: a request's issue is recorded with the issuing task (for synchronous and
//! direct I/O, the reader itself); its completion, usually in interrupt context, adds its
//! latency and bytes to that task's disk statistics.
use crate::{current_task, per_cpu, record_field, run};
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{LruHashMap, LruPerCpuHashMap},
    programs::TracePointContext,
};
use monitor_common::{
    latency_bucket, probe_stat, record_fields::slot, IoStats, RequestKey, RequestStart, TaskKey,
    REQUEST_MAP_ENTRIES, TASK_MAP_ENTRIES,
};

// From /sys/kernel/tracing/events/block/block_rq_{issue,complete}/format.
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

#[map]
static REQUESTS: LruHashMap<RequestKey, RequestStart> =
    LruHashMap::with_max_entries(REQUEST_MAP_ENTRIES, 0);
#[map]
static DISK_STATS: LruPerCpuHashMap<TaskKey, IoStats> =
    LruPerCpuHashMap::with_max_entries(TASK_MAP_ENTRIES, 0);
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
        sector: record_field::<u64, { slot::BLOCK_ISSUE_SECTOR }>(ctx, &BLOCK_ISSUE_SECTOR_OFFSET)?,
        dev: record_field::<u32, { slot::BLOCK_ISSUE_DEV }>(ctx, &BLOCK_ISSUE_DEV_OFFSET)?,
        pad: 0,
    };
    let bytes: u32 =
        record_field::<u32, { slot::BLOCK_ISSUE_BYTES }>(ctx, &BLOCK_ISSUE_BYTES_OFFSET)?;
    // SAFETY: a helper without arguments.
    let issued_ns = unsafe { bpf_ktime_get_ns() };
    let start = RequestStart {
        issued_ns,
        task,
        bytes: u64::from(bytes),
    };
    REQUESTS
        .insert(key, start, 0)
        .map_err(|_| probe_stat::MAP_UPDATE_FAILED)
}

#[tracepoint]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    run(|| try_block_rq_complete(&ctx))
}

fn try_block_rq_complete(ctx: &TracePointContext) -> Result<(), u32> {
    // Usually interrupt context: everything comes from the issue record.
    let key = RequestKey {
        sector: record_field::<u64, { slot::BLOCK_COMPLETE_SECTOR }>(
            ctx,
            &BLOCK_COMPLETE_SECTOR_OFFSET,
        )?,
        dev: record_field::<u32, { slot::BLOCK_COMPLETE_DEV }>(ctx, &BLOCK_COMPLETE_DEV_OFFSET)?,
        pad: 0,
    };
    // SAFETY: copied at once.
    let Some(start) = (unsafe { REQUESTS.get(key) }).copied() else {
        return Ok(()); // a request of an unwatched cgroup, or issued before tracing
    };
    let _ = REQUESTS.remove(key);
    // SAFETY: a helper without arguments.
    let dt = unsafe { bpf_ktime_get_ns() }.saturating_sub(start.issued_ns);
    add_io(&DISK_STATS, &start.task, dt, start.bytes)
}
