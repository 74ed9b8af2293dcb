//! Tracepoint record fields the programs load directly, relocated at load time.
//!
//! A tracepoint program may load a field of its record only at a constant offset (the verifier
//! refuses a context pointer moved by a register), and the offsets move between kernels and
//! configurations. CO-RE would have the loader rewrite each such load for the running kernel,
//! but rustc's BPF target emits no CO-RE relocation records. So each field's load is compiled
//! at a marker offset of its own, far past any record, and userspace rewrites the offset of
//! every load at that marker to the field's offset on this kernel (from its tracefs format
//! file) before the object is loaded: what a CO-RE field-offset relocation does, with tracefs in
//! place of the kernel's BTF. A field whose offset the verifier would not take (unaligned for
//! its size, or outside [`RECORD_LOADABLE`]) keeps the probe-read helper; the
//! `DIRECT_RECORD_FIELDS` global says which are direct, and the verifier drops the other branch.

/// The fields, one slot each: the bit in `DIRECT_RECORD_FIELDS`, and the marker's index.
pub mod slot {
    /// `sched_switch.prev_pid` (pid_t).
    pub const SCHED_SWITCH_PREV_PID: u32 = 0;
    /// `sched_switch.prev_state` where it is a long.
    pub const SCHED_SWITCH_PREV_STATE_8: u32 = 1;
    /// `sched_switch.prev_state` where it is an int (older kernels).
    pub const SCHED_SWITCH_PREV_STATE_4: u32 = 2;
    /// `sys_exit_*.ret` (long), the same in every read-family exit.
    pub const SYS_EXIT_RET: u32 = 3;
    /// `block_rq_issue.dev` (dev_t).
    pub const BLOCK_ISSUE_DEV: u32 = 4;
    /// `block_rq_issue.sector` (sector_t).
    pub const BLOCK_ISSUE_SECTOR: u32 = 5;
    /// `block_rq_issue.bytes` (unsigned int).
    pub const BLOCK_ISSUE_BYTES: u32 = 6;
    /// `block_rq_complete.dev`.
    pub const BLOCK_COMPLETE_DEV: u32 = 7;
    /// `block_rq_complete.sector`.
    pub const BLOCK_COMPLETE_SECTOR: u32 = 8;
    /// How many.
    pub const COUNT: u32 = 9;
}

/// Each slot's load size in bytes, as the program loads it.
pub const SLOT_SIZES: [u32; slot::COUNT as usize] = [4, 8, 4, 8, 4, 8, 4, 4, 8];

/// The first marker: past the largest record a tracepoint program may read
/// (`PERF_MAX_TRACE_SIZE`, 2048 bytes) and any offset these programs load at otherwise, and
/// within an instruction's 16-bit signed offset. A slot's marker is 8-aligned, as every load
/// size wants.
pub const MARKER_BASE: i16 = 0x7000;

/// The offset a slot's load is compiled at.
pub const fn marker(slot: u32) -> i16 {
    MARKER_BASE + (slot as i16) * 8
}

/// Where in its record a tracepoint program may load: from byte 8 (the kernel puts a pointer to
/// the registers over the first 8 bytes, the common fields, before it runs the program) to
/// `PERF_MAX_TRACE_SIZE`, 2048 bytes; aligned for the load's size.
pub const RECORD_LOADABLE: core::ops::Range<u32> = 8..2048;
