//! The CUDA family: uprobes on the driver library's launch, copy and synchronise entry points
//! (see [`monitor_common::cuda`] for which, and why launches are only counted).
//!
//! - [`cuda_launch`] (entry): counts a kernel or graph launch.
//! - [`cuda_call`] (entry) and [`cuda_return`] (return) time a copy or a synchronisation: the
//!   entry leaves its start in the thread's [`CudaCall`], the return charges the task's
//!   [`CudaStats`]. A probed call made inside another (the driver calling its own exported
//!   entry point) is told apart by the stack pointer, so only the outer call is timed.
//!
//! The attach cookie says what each entry point is (`monitor_common::cuda::call_kind`).
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::bpf_get_attach_cookie,
    },
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, LruPerCpuHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use monitor_common::cuda::{
    call_kind, cuda_stat, CudaCall, CudaStats, COPY_WAIT_MIN_BYTES, CUDA_TASK_ENTRIES,
    CUDA_THREAD_ENTRIES,
};
use monitor_common::{task_thread, TaskKey};

#[map]
static CUDA_CALLS: LruHashMap<u32, CudaCall> = LruHashMap::with_max_entries(CUDA_THREAD_ENTRIES, 0);
#[map]
static CUDA_STATS: LruPerCpuHashMap<TaskKey, CudaStats> =
    LruPerCpuHashMap::with_max_entries(CUDA_TASK_ENTRIES, 0);
#[map]
static CUDA_PROBE_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(cuda_stat::COUNT, 0);

/// How far the stack pointer moves between a call's entry and its return: on x86-64 the
/// return pops the return address the call pushed; on arm64 the call leaves it in a register.
#[cfg(bpf_target_arch = "x86_64")]
const RETURN_SP_DELTA: u64 = 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
const RETURN_SP_DELTA: u64 = 0;

/// The stack pointer of a probe's registers.
#[inline(always)]
fn stack_pointer(regs: *const aya_ebpf::bindings::pt_regs) -> u64 {
    // SAFETY: the program's context is the probed thread's saved registers.
    #[cfg(bpf_target_arch = "x86_64")]
    return unsafe { (*regs).rsp };
    #[cfg(bpf_target_arch = "aarch64")]
    return unsafe { (*regs).sp };
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    {
        let _ = regs;
        0
    }
}

#[inline(always)]
fn count_stat(index: u32) {
    if let Some(slot) = CUDA_PROBE_STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn run(body: impl FnOnce() -> Result<(), u32>) -> u32 {
    if let Err(stat) = body() {
        count_stat(stat);
    }
    0
}

/// The calling thread's task key and thread id.
#[inline(always)]
fn current() -> (TaskKey, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let thread = if tid == tgid {
        task_thread::MAIN
    } else {
        task_thread::OTHERS
    };
    (
        TaskKey {
            cgroup_id,
            tgid,
            thread,
        },
        tid,
    )
}

/// The task's statistics on this CPU, created zeroed if absent.
#[inline(always)]
fn stats(key: &TaskKey) -> Result<*mut CudaStats, u32> {
    if let Some(v) = CUDA_STATS.get_ptr_mut(key) {
        return Ok(v);
    }
    CUDA_STATS
        .insert(key, CudaStats::default(), 0)
        .map_err(|_| cuda_stat::MAP_UPDATE_FAILED)?;
    CUDA_STATS
        .get_ptr_mut(key)
        .ok_or(cuda_stat::MAP_UPDATE_FAILED)
}

#[inline(always)]
fn cookie<C: EbpfContext>(ctx: &C) -> u64 {
    // SAFETY: the helper reads the cookie of the probe this program runs for.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

#[uprobe(multi)]
pub fn cuda_launch(ctx: ProbeContext) -> u32 {
    run(|| try_cuda_launch(&ctx))
}

fn try_cuda_launch(ctx: &ProbeContext) -> Result<(), u32> {
    let (key, tid) = current();
    let s = stats(&key)?;
    // SAFETY: a per-CPU value of this task, written only by this CPU.
    unsafe {
        if cookie(ctx) == call_kind::GRAPH_LAUNCH {
            (*s).graph_launches += 1;
        } else {
            (*s).launches += 1;
        }
    }
    // A synchronisation after this waits for the kernel, not for an earlier copy, and a run
    // of copies ends. (The thread's entry is made here if its first call is a launch: a copy
    // after it must know a kernel was launched.)
    match CUDA_CALLS.get_ptr_mut(tid) {
        // SAFETY: the thread's own entry; only this thread's probes write it.
        Some(c) => unsafe {
            (*c).after_copy = 0;
            (*c).launched = 1;
            (*c).run_end_ns = 0;
        },
        None => {
            let call = CudaCall {
                launched: 1,
                ..CudaCall::default()
            };
            CUDA_CALLS
                .insert(tid, call, 0)
                .map_err(|_| cuda_stat::MAP_UPDATE_FAILED)?;
        }
    }
    Ok(())
}

#[uprobe(multi)]
pub fn cuda_call(ctx: ProbeContext) -> u32 {
    run(|| try_cuda_call(&ctx))
}

fn try_cuda_call(ctx: &ProbeContext) -> Result<(), u32> {
    let kind = cookie(ctx);
    let (_, tid) = current();
    let sp = stack_pointer(ctx.regs);
    let copy = call_kind::copy_index(kind).is_some();
    let bytes = if copy {
        ctx.arg::<u64>(2).unwrap_or(0)
    } else {
        0
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    match CUDA_CALLS.get_ptr_mut(tid) {
        Some(c) => {
            // SAFETY: the thread's own entry; only this thread's probes write it.
            unsafe {
                // A timed call in flight whose frame is above this one: this call is inside it.
                // (One at or below this frame returned unseen, and is replaced.)
                if (*c).start_ns != 0 && (*c).sp > sp {
                    return Ok(());
                }
                (*c).start_ns = now;
                (*c).sp = sp;
                (*c).kind = kind;
                (*c).bytes = bytes;
                // A copy in a run of copies: the loop's time since the run's last call.
                (*c).between_ns = if copy && (*c).run_end_ns != 0 {
                    now.saturating_sub((*c).run_end_ns)
                } else {
                    0
                };
            }
        }
        None => {
            let call = CudaCall {
                start_ns: now,
                sp,
                kind,
                bytes,
                ..CudaCall::default()
            };
            CUDA_CALLS
                .insert(tid, call, 0)
                .map_err(|_| cuda_stat::MAP_UPDATE_FAILED)?;
        }
    }
    Ok(())
}

#[uretprobe(multi)]
pub fn cuda_return(ctx: RetProbeContext) -> u32 {
    run(|| try_cuda_return(&ctx))
}

fn try_cuda_return(ctx: &RetProbeContext) -> Result<(), u32> {
    let (key, tid) = current();
    let c = CUDA_CALLS
        .get_ptr_mut(tid)
        .ok_or(cuda_stat::UNMATCHED_RETURN)?;
    // SAFETY: the thread's own entry; only this thread's probes write it.
    let (start, kind, bytes) = unsafe {
        if (*c).start_ns == 0 {
            return Err(cuda_stat::UNMATCHED_RETURN);
        }
        if stack_pointer(ctx.regs) != (*c).sp.wrapping_add(RETURN_SP_DELTA) {
            return Ok(()); // the return of a call inside the one timed
        }
        let taken = ((*c).start_ns, (*c).kind, (*c).bytes);
        (*c).start_ns = 0;
        taken
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let ns = now.saturating_sub(start);
    let s = stats(&key)?;
    // SAFETY: a per-CPU value of this task, written only by this CPU; the thread's own entry.
    unsafe {
        if let Some(i) = call_kind::copy_index(kind) {
            if let Some(copy) = (*s).copies.get_mut(i) {
                copy.count += 1;
                copy.bytes += bytes;
                copy.call_ns += ns;
                copy.between_ns += (*c).between_ns;
            }
            (*c).after_copy = if bytes >= COPY_WAIT_MIN_BYTES || (*c).launched == 0 {
                kind
            } else {
                0
            };
            (*c).run_end_ns = now;
        } else if kind == call_kind::SYNC {
            match call_kind::copy_index((*c).after_copy) {
                Some(i) => {
                    if let Some(copy) = (*s).copies.get_mut(i) {
                        copy.wait_ns += ns;
                    }
                    // the run of copies goes on past the wait for them
                    (*c).run_end_ns = now;
                }
                None => {
                    (*s).syncs += 1;
                    (*s).sync_ns += ns;
                    (*c).run_end_ns = 0;
                }
            }
            (*c).after_copy = 0;
            (*c).launched = 0;
        }
        (*c).between_ns = 0;
    }
    Ok(())
}
