//! The stall probes: `monitor-ebpf`'s tracepoint programs and their maps.
//!
//! Loads the programs with field offsets read from this kernel's format files and offsets into
//! its scheduler structures read from its BTF, attaches them,
//! points the in-kernel cgroup filter at the workloads userspace reports, and reads the
//! cumulative per-(cgroup, tgid) counters each round: thread-state times, read-syscall latency,
//! disk-request latency. Parts whose tracepoints this kernel lacks are left out and named in
//! [`StallProbe::missing`]; only the scheduler part is required.
mod io_links;
pub mod kernel_btf;
mod loader;
pub mod map_sizing;
mod record_fields;
pub mod tracefs;

use crate::caps;
use crate::model::IoTracing;
use crate::sources::map_batch::{self as batch, BatchError, BatchReader};
use aya::maps::{
    Array, HashMap as BpfHashMap, IterableMap, MapData, MapError, PerCpuArray, PerCpuHashMap,
    PerCpuValues,
};
use aya::programs::{ProgramError, TracePoint};
use aya::{Ebpf, EbpfError, EbpfLoader, Pod};
use io_links::IoLinks;
use kernel_btf::{BtfError, KernelBtf};
use monitor_common::record_fields::slot;
use monitor_common::{probe_stat, IoStats, TaskKey, TaskTimes, WATCHED_CGROUP_ENTRIES};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tracefs::FieldLayout;

pub use loader::StallProbeLoader;

/// The compiled kernel programs, embedded at build time.
static PROBES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpuwatch-probes"));

const READ_SYSCALLS: [&str; 5] = ["read", "pread64", "readv", "preadv", "preadv2"];

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("missing {}: run gpuwatch as root or grant these capabilities", .0.join(", "))]
    MissingCapabilities(Vec<&'static str>),
    #[error("cannot read this process's capabilities: {0}")]
    Capabilities(std::io::Error),
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
    #[error("scheduler fields: {0}")]
    KernelBtf(#[from] BtfError),
    #[error("the kernel refused the eBPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("map {name}: its per-CPU values: {source}")]
    PerCpuValues {
        name: &'static str,
        source: std::io::Error,
    },
    #[error("map {name}: batch lookup: {source}")]
    BatchLookup {
        name: &'static str,
        source: std::io::Error,
    },
    #[error("relocating the record fields: {0}")]
    Relocation(#[from] record_fields::RelocationError),
    #[error("{0} missing from the eBPF object")]
    Missing(&'static str),
}

/// Cumulative counters read from the kernel, summed over CPUs.
#[derive(Debug, Default)]
pub struct ProbeTotals {
    pub times: HashMap<TaskKey, TaskTimes>,
    pub reads: HashMap<TaskKey, IoStats>,
    pub disk: HashMap<TaskKey, IoStats>,
    /// The kernel side's failure counters, by `probe_stat` index.
    pub failures: [u64; probe_stat::COUNT as usize],
    /// Entries that vanished between the key walk and the lookup (LRU eviction; only where the
    /// kernel has no batch lookup and the keys are walked).
    pub evicted_during_read: u64,
}

/// Adding per-CPU values up.
pub trait Accumulate {
    fn accumulate(&mut self, other: &Self);
}

impl Accumulate for TaskTimes {
    fn accumulate(&mut self, o: &Self) {
        self.on_cpu_ns += o.on_cpu_ns;
        self.runq_ns += o.runq_ns;
        self.blocked_ns += o.blocked_ns;
        self.sleep_ns += o.sleep_ns;
        self.switches += o.switches;
        self.blocked_switches += o.blocked_switches;
    }
}

impl Accumulate for IoStats {
    fn accumulate(&mut self, o: &Self) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.total_ns += o.total_ns;
        for (a, b) in self.hist.iter_mut().zip(o.hist.iter()) {
            *a += b;
        }
    }
}

/// The loaded and attached programs with their maps.
pub struct StallProbe {
    _ebpf: Ebpf,
    times: PerCpuHashMap<MapData, TaskKey, TaskTimes>,
    reads: PerCpuHashMap<MapData, TaskKey, IoStats>,
    disk: PerCpuHashMap<MapData, TaskKey, IoStats>,
    stats: PerCpuArray<MapData, u64>,
    watched: BpfHashMap<MapData, u64, u8>,
    watched_ids: HashSet<u64>,
    /// Bumped after cgroups are added, so CPUs re-check threads they cached as unwatched.
    watch_generation: Array<MapData, u32>,
    generation: u32,
    /// Buffers for reading the task maps in batches; `None` where this kernel cannot, and the
    /// keys are walked instead.
    batches: Option<Batches>,
    /// Parts not traced on this kernel, with the reason ("read latency: …").
    pub missing: Vec<String>,
    /// Entries in each per-task map, sized from the possible CPUs (see [`map_sizing`]).
    pub task_entries: u32,
    /// The record fields loaded straight from the record, a bit per
    /// `monitor_common::record_fields::slot`; the others go through the probe-read helper.
    pub direct_record_fields: u32,
    /// The read and block programs, attached only while wanted (see [`Self::step_io`]).
    io: IoLinks,
}

struct Batches {
    times: BatchReader<TaskKey, TaskTimes>,
    io: BatchReader<TaskKey, IoStats>,
}

struct Offsets {
    globals: Vec<(&'static str, u32)>,
    /// The record fields the programs load directly, by `record_fields::slot`.
    fields: Vec<(u32, FieldLayout)>,
    missing: Vec<String>,
    reads: bool,
    disk: bool,
}

fn offsets(tracefs: &Path) -> Result<Offsets, ProbeError> {
    let f = |cat, ev, field| tracefs::field_layout(tracefs, cat, ev, field);
    let prev_state = f("sched", "sched_switch", "prev_state")?;
    let prev_pid = f("sched", "sched_switch", "prev_pid")?;
    let mut globals = vec![
        ("SCHED_SWITCH_PREV_STATE_OFFSET", prev_state.offset),
        ("SCHED_SWITCH_PREV_STATE_SIZE", prev_state.size),
        ("SCHED_SWITCH_PREV_PID_OFFSET", prev_pid.offset),
    ];
    let mut fields = vec![
        (slot::SCHED_SWITCH_PREV_PID, prev_pid),
        (
            if prev_state.size == 8 {
                slot::SCHED_SWITCH_PREV_STATE_8
            } else {
                slot::SCHED_SWITCH_PREV_STATE_4
            },
            prev_state,
        ),
    ];
    globals.extend(task_offsets(&KernelBtf::load()?)?);
    let mut missing = Vec::new();
    let reads = match f("syscalls", "sys_exit_read", "ret") {
        Ok(ret) => {
            globals.push(("SYS_EXIT_RET_OFFSET", ret.offset));
            fields.push((slot::SYS_EXIT_RET, ret));
            true
        }
        Err(e) => {
            missing.push(format!("read latency: {e}"));
            false
        }
    };
    let disk = (|| -> Result<Vec<(&'static str, u32, FieldLayout)>, tracefs::TracefsError> {
        let issue = |field| f("block", "block_rq_issue", field);
        let complete = |field| f("block", "block_rq_complete", field);
        Ok(vec![
            (
                "BLOCK_ISSUE_DEV_OFFSET",
                slot::BLOCK_ISSUE_DEV,
                issue("dev")?,
            ),
            (
                "BLOCK_ISSUE_SECTOR_OFFSET",
                slot::BLOCK_ISSUE_SECTOR,
                issue("sector")?,
            ),
            (
                "BLOCK_ISSUE_BYTES_OFFSET",
                slot::BLOCK_ISSUE_BYTES,
                issue("bytes")?,
            ),
            (
                "BLOCK_COMPLETE_DEV_OFFSET",
                slot::BLOCK_COMPLETE_DEV,
                complete("dev")?,
            ),
            (
                "BLOCK_COMPLETE_SECTOR_OFFSET",
                slot::BLOCK_COMPLETE_SECTOR,
                complete("sector")?,
            ),
        ])
    })();
    let disk = match disk {
        Ok(g) => {
            for (name, s, layout) in g {
                globals.push((name, layout.offset));
                fields.push((s, layout));
            }
            true
        }
        Err(e) => {
            missing.push(format!("disk latency: {e}"));
            false
        }
    };
    Ok(Offsets {
        globals,
        fields,
        missing,
        reads,
        disk,
    })
}

impl Offsets {
    /// Puts record field `slot` (global `name`) at `offset`, its size unchanged.
    fn move_field(&mut self, slot: u32, name: &str, offset: u32) {
        for (s, layout) in &mut self.fields {
            if *s == slot {
                layout.offset = offset;
            }
        }
        for (n, value) in &mut self.globals {
            if *n == name {
                *value = offset;
            }
        }
    }
}

/// What the programs load from the current task: its thread id, and where `sched_switch` finds
/// the scheduler's own bookkeeping: the switched-out task's run-queue wait and last switch-in,
/// and its run queue's clock (see `monitor_common::ThreadState`).
fn task_offsets(btf: &KernelBtf) -> Result<Vec<(&'static str, u32)>, BtfError> {
    Ok(vec![
        (
            "TASK_PID_OFFSET",
            btf.member_offset("task_struct", &["pid"])?,
        ),
        (
            "TASK_RUN_DELAY_OFFSET",
            btf.member_offset("task_struct", &["sched_info", "run_delay"])?,
        ),
        (
            "TASK_LAST_ARRIVAL_OFFSET",
            btf.member_offset("task_struct", &["sched_info", "last_arrival"])?,
        ),
        (
            "TASK_CFS_RQ_OFFSET",
            btf.member_offset("task_struct", &["se", "cfs_rq"])?,
        ),
        ("CFS_RQ_RQ_OFFSET", btf.member_offset("cfs_rq", &["rq"])?),
        ("RQ_CLOCK_OFFSET", btf.member_offset("rq", &["clock"])?),
    ])
}

/// The tracepoint program `name` of the object.
fn tracepoint<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut TracePoint, ProbeError> {
    ebpf.program_mut(name)
        .ok_or(ProbeError::Missing(name))?
        .try_into()
        .map_err(|source| ProbeError::Program { name, source })
}

/// Loads a program into the kernel without attaching it.
fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), ProbeError> {
    tracepoint(ebpf, name)?
        .load()
        .map_err(|source| ProbeError::Program { name, source })
}

/// Loads `name` and attaches it to each of `points`; fails only if none attaches.
fn attach(
    ebpf: &mut Ebpf,
    name: &'static str,
    points: &[(&str, &str)],
) -> Result<usize, ProbeError> {
    load_program(ebpf, name)?;
    let program = tracepoint(ebpf, name)?;
    let mut attached = 0;
    let mut last_err = None;
    for (cat, ev) in points {
        match program.attach(cat, ev) {
            Ok(_) => attached += 1,
            Err(e) => last_err = Some(e),
        }
    }
    match (attached, last_err) {
        (0, Some(source)) => Err(ProbeError::Program { name, source }),
        (n, _) => Ok(n),
    }
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, ProbeError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(ProbeError::Missing(name))?;
    T::try_from(map).map_err(|source| ProbeError::Map { name, source })
}

impl StallProbe {
    /// How to load the programs: `StallProbe::loader().load()` checks privileges, finds
    /// tracefs, reads field offsets, loads and attaches every program, tracking only the
    /// cgroups passed to [`Self::watch`]; [`StallProbeLoader`]'s settings change that.
    pub fn loader() -> StallProbeLoader {
        StallProbeLoader::default()
    }

    /// Moves the read and block programs one step toward attached (`on`) or detached; see
    /// [`io_links`] for why it takes two.
    pub fn step_io(&mut self, on: bool) -> Result<IoTracing, ProbeError> {
        self.io.step(&mut self._ebpf, on)
    }

    pub fn io_state(&self) -> IoTracing {
        self.io.state()
    }

    fn load_programs(options: &StallProbeLoader) -> Result<Self, ProbeError> {
        let StallProbeLoader {
            filter_by_cgroup,
            empty,
            attach_io,
            task_entries,
            time_every_read,
            exit_ret_offset,
        } = *options;
        let missing =
            caps::missing_for_tracing(caps::effective().map_err(ProbeError::Capabilities)?);
        if !missing.is_empty() {
            return Err(ProbeError::MissingCapabilities(missing));
        }
        let tracefs = tracefs::ensure_mounted()?;
        let mut offsets = offsets(&tracefs)?;
        if let Some(offset) = exit_ret_offset {
            offsets.move_field(slot::SYS_EXIT_RET, "SYS_EXIT_RET_OFFSET", offset);
        }
        // Our BTF read is done with: hand its memory back before aya parses the same file.
        #[cfg(target_env = "gnu")]
        // SAFETY: no preconditions; only returns free heap pages to the kernel.
        unsafe {
            libc::malloc_trim(0);
        }
        // The programs do no CO-RE relocation (every offset comes in a global, read here from
        // tracefs and BTF), so aya never parses the kernel's BTF itself (it does so only for
        // objects that relocate): ~23 MB at its peak on 6.18, where 0.14 parsed it in `new`.
        let mut loader = EbpfLoader::new();
        // THREADS is task-local storage, which aya creates but has no userspace type for
        // (userspace never reads it).
        loader.allow_unsupported_maps();
        for (name, value) in &offsets.globals {
            loader.override_global(name, value, true);
        }
        let filter = u32::from(filter_by_cgroup);
        loader.override_global("FILTER_BY_CGROUP", &filter, true);
        let empty = u32::from(empty);
        loader.override_global("EMPTY_PROGRAMS", &empty, true);
        let every_read = u32::from(time_every_read);
        loader.override_global("TIME_EVERY_READ", &every_read, true);
        let cpus = batch::possible_cpus();
        let task_entries = task_entries.unwrap_or_else(map_sizing::task_entries_here);
        for map in ["TASK_TIMES", "READ_STATS", "DISK_STATS"] {
            loader.map_max_entries(map, task_entries);
        }
        let mut object = PROBES.to_vec();
        let relocated = record_fields::relocate(&mut object, &offsets.fields)?;
        loader.override_global("DIRECT_RECORD_FIELDS", &relocated.direct, true);
        let direct_record_fields = relocated.direct;
        let mut ebpf = loader.load(&object)?;
        drop(object);

        attach(&mut ebpf, "sched_switch", &[("sched", "sched_switch")])?;
        let mut missing = offsets.missing;
        if let Err(e) = attach(
            &mut ebpf,
            "sched_process_exit",
            &[("sched", "sched_process_exit")],
        ) {
            missing.push(format!("exit clean-up: {e}"));
        }
        let mut reads = offsets.reads;
        if reads {
            if let Err(e) = load_program(&mut ebpf, "sys_enter_read")
                .and_then(|()| load_program(&mut ebpf, "sys_exit_read"))
            {
                missing.push(format!("read latency: {e}"));
                reads = false;
            }
        }
        let mut disk = offsets.disk;
        if disk {
            if let Err(e) = load_program(&mut ebpf, "block_rq_issue")
                .and_then(|()| load_program(&mut ebpf, "block_rq_complete"))
            {
                missing.push(format!("disk latency: {e}"));
                disk = false;
            }
        }
        let mut io = IoLinks::new(&tracefs, &READ_SYSCALLS, reads, disk);
        if attach_io {
            if let Err(e) = io.attach_all(&mut ebpf) {
                missing.push(format!("read and disk latency: {e}"));
                io = IoLinks::new(&tracefs, &READ_SYSCALLS, false, false);
            }
        }

        Ok(Self {
            times: take_map(&mut ebpf, "TASK_TIMES")?,
            reads: take_map(&mut ebpf, "READ_STATS")?,
            disk: take_map(&mut ebpf, "DISK_STATS")?,
            stats: take_map(&mut ebpf, "PROBE_STATS")?,
            watched: take_map(&mut ebpf, "WATCHED_CGROUPS")?,
            watched_ids: HashSet::new(),
            watch_generation: take_map(&mut ebpf, "WATCH_GENERATION")?,
            generation: 0,
            task_entries,
            batches: cpus.map(|cpus| Batches {
                times: BatchReader::new(cpus),
                io: BatchReader::new(cpus),
            }),
            missing,
            direct_record_fields,
            io,
            _ebpf: ebpf,
        })
    }

    /// Makes the kernel filter watch `ids` (only the changes reach the kernel), as many as fit
    /// its [`WATCHED_CGROUP_ENTRIES`]; returns how many did not.
    pub fn watch(&mut self, ids: &HashSet<u64>) -> Result<usize, ProbeError> {
        let err = |source| ProbeError::Map {
            name: "WATCHED_CGROUPS",
            source,
        };
        // Removals first: a full filter then has room for the cgroups that replace them.
        for id in self.watched_ids.difference(ids) {
            match self.watched.remove(id) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let mut added = false;
        let mut watched: HashSet<u64> = self.watched_ids.intersection(ids).copied().collect();
        let mut unwatched = 0;
        for id in ids.difference(&self.watched_ids) {
            if watched.len() >= WATCHED_CGROUP_ENTRIES as usize {
                unwatched += 1;
                continue;
            }
            self.watched.insert(id, &1, 0).map_err(err)?;
            watched.insert(*id);
            added = true;
        }
        if added {
            // after the inserts: a CPU that reads the new generation sees the new cgroups
            self.generation = self.generation.wrapping_add(1);
            self.watch_generation
                .set(0, &self.generation, 0)
                .map_err(|source| ProbeError::Map {
                    name: "WATCH_GENERATION",
                    source,
                })?;
        }
        self.watched_ids = watched;
        Ok(unwatched)
    }

    /// Per program: (name, runs, total run time in ns), from the kernel's BPF statistics (zero
    /// unless `kernel.bpf_stats_enabled` is 1). For benchmarks: the per-event cost of tracing.
    pub fn program_stats(&self) -> Vec<(String, u64, u64)> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut out = Vec::new();
        for (name, program) in self._ebpf.programs() {
            let Ok(fd) = program.fd() else { continue };
            let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
            let Ok(info) = std::fs::read_to_string(&path) else {
                continue;
            };
            let field = |key: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            out.push((name.to_owned(), field("run_cnt:"), field("run_time_ns:")));
        }
        out
    }

    /// Deletes the entries of tasks that are gone, so the maps (and each round's walk of them)
    /// hold only live tasks. The caller has already counted their last window.
    pub fn forget(&mut self, keys: &[TaskKey]) {
        for key in keys {
            // NotFound: evicted meanwhile; nothing else can fail for a key of the right type.
            let _ = self.times.remove(key);
            let _ = self.reads.remove(key);
            let _ = self.disk.remove(key);
        }
    }

    /// Reads the counters into `out` (each map read is cleared first). `io_maps`: also the read
    /// and disk maps; without it `out.reads` and `out.disk` are left as they are (the caller
    /// knows the maps cannot have changed: their programs were detached since the last read).
    /// Each map read walks all of its hash buckets in the kernel, filled or not.
    pub fn read(&mut self, out: &mut ProbeTotals, io_maps: bool) -> Result<(), ProbeError> {
        out.evicted_during_read = 0;
        if !self.read_batched(out, io_maps)? {
            out.evicted_during_read += walk_map(&self.times, "TASK_TIMES", &mut out.times)?;
            if io_maps {
                out.evicted_during_read += walk_map(&self.reads, "READ_STATS", &mut out.reads)?;
                out.evicted_during_read += walk_map(&self.disk, "DISK_STATS", &mut out.disk)?;
            }
        }
        for i in 0..probe_stat::COUNT {
            let v = self.stats.get(&i, 0).map_err(|source| ProbeError::Map {
                name: "PROBE_STATS",
                source,
            })?;
            out.failures[i as usize] = v.iter().sum();
        }
        Ok(())
    }

    /// The three task maps through batch lookups. False where the kernel has none (and from
    /// then on the keys are walked).
    fn read_batched(&mut self, out: &mut ProbeTotals, io_maps: bool) -> Result<bool, ProbeError> {
        let Some(b) = self.batches.as_mut() else {
            return Ok(false);
        };
        let result = batch_map(&mut b.times, self.times.map(), &mut out.times)
            .map_err(|e| ("TASK_TIMES", e))
            .and_then(|()| {
                if !io_maps {
                    return Ok(());
                }
                batch_map(&mut b.io, self.reads.map(), &mut out.reads)
                    .map_err(|e| ("READ_STATS", e))?;
                batch_map(&mut b.io, self.disk.map(), &mut out.disk).map_err(|e| ("DISK_STATS", e))
            });
        match result {
            Ok(()) => Ok(true),
            Err((_, BatchError::Unsupported)) => {
                self.batches = None;
                Ok(false)
            }
            Err((name, BatchError::Io(source))) => Err(ProbeError::BatchLookup { name, source }),
        }
    }
}

fn batch_map<V: Pod + Default + Accumulate>(
    reader: &mut BatchReader<TaskKey, V>,
    map: &MapData,
    out: &mut HashMap<TaskKey, V>,
) -> Result<(), BatchError> {
    out.clear();
    reader.read(map, |key, per_cpu| {
        let mut total = V::default();
        for v in per_cpu {
            total.accumulate(v);
        }
        out.insert(key, total);
    })
}

fn walk_map<V: Pod + Default + Accumulate>(
    map: &PerCpuHashMap<MapData, TaskKey, V>,
    name: &'static str,
    out: &mut HashMap<TaskKey, V>,
) -> Result<u64, ProbeError> {
    out.clear();
    let mut evicted = 0;
    for item in map.iter() {
        match item {
            Ok((key, per_cpu)) => {
                out.insert(key, sum(&per_cpu));
            }
            Err(MapError::KeyNotFound) => evicted += 1,
            Err(source) => return Err(ProbeError::Map { name, source }),
        }
    }
    Ok(evicted)
}

fn sum<V: Pod + Default + Accumulate>(values: &PerCpuValues<V>) -> V {
    let mut total = V::default();
    for v in values.iter() {
        total.accumulate(v);
    }
    total
}
