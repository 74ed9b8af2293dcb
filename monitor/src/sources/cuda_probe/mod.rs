//! The CUDA driver probes: `monitor-ebpf`'s uprobe programs on the driver library's launch,
//! copy and synchronise entry points ([`ENTRY_POINTS`]), attached per library file (inode) the
//! GPU processes map, and their per-task counters.
//!
//! Loaded once (maps and programs, nothing attached), in two halves: the [`Counters`], read by
//! every round, and the [`Programs`], attached to a library while its evidence is wanted and
//! detached after, since every hit stops the calling thread (measured on an H100 host,
//! 0.5–0.9 µs for an entry probe, ~3 µs for an entry and a return probe:
//! `monitor_common::cuda`). The programs live on a thread of their own ([`attacher`]): which
//! libraries there are is shaped by tenants, and nothing a tenant shapes runs on the round.
pub mod attacher;
pub mod elf;
pub mod library;

use crate::caps;
use crate::sources::map_batch::{possible_cpus, BatchError, BatchReader};
use aya::maps::{IterableMap, MapData, MapError, PerCpuArray, PerCpuHashMap};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope};
use aya::programs::{ProgramError, UProbe};
use aya::{Ebpf, EbpfError, EbpfLoader};
use library::LibraryFile;
use monitor_common::cuda::{call_kind, cuda_stat, CUDA_TASK_ENTRIES};
use monitor_common::{CudaStats, TaskKey};
use std::collections::HashMap;

/// The compiled programs, embedded at build time.
static PROGRAMS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpuwatch-cuda-probes"));

/// The entry points probed, with what each does. The names are those the H100 host's driver
/// (580.159.04) exports; which a PyTorch job calls is in `monitor_common::cuda`. Per-thread
/// default-stream variants (`_ptsz`, `_ptds`) count as their plain form.
pub const ENTRY_POINTS: &[(&str, u64)] = &[
    ("cuLaunchKernel", call_kind::LAUNCH),
    ("cuLaunchKernel_ptsz", call_kind::LAUNCH),
    ("cuLaunchKernelEx", call_kind::LAUNCH),
    ("cuLaunchKernelEx_ptsz", call_kind::LAUNCH),
    ("cuLaunchCooperativeKernel", call_kind::LAUNCH),
    ("cuLaunchCooperativeKernel_ptsz", call_kind::LAUNCH),
    ("cuGraphLaunch", call_kind::GRAPH_LAUNCH),
    ("cuGraphLaunch_ptsz", call_kind::GRAPH_LAUNCH),
    ("cuMemcpyHtoD_v2", call_kind::COPY_H2D),
    ("cuMemcpyHtoD_v2_ptds", call_kind::COPY_H2D),
    ("cuMemcpyHtoDAsync_v2", call_kind::COPY_H2D),
    ("cuMemcpyHtoDAsync_v2_ptsz", call_kind::COPY_H2D),
    ("cuMemcpyDtoH_v2", call_kind::COPY_D2H),
    ("cuMemcpyDtoH_v2_ptds", call_kind::COPY_D2H),
    ("cuMemcpyDtoHAsync_v2", call_kind::COPY_D2H),
    ("cuMemcpyDtoHAsync_v2_ptsz", call_kind::COPY_D2H),
    ("cuMemcpyDtoD_v2", call_kind::COPY_D2D),
    ("cuMemcpyDtoD_v2_ptds", call_kind::COPY_D2D),
    ("cuMemcpyDtoDAsync_v2", call_kind::COPY_D2D),
    ("cuMemcpyDtoDAsync_v2_ptsz", call_kind::COPY_D2D),
    ("cuMemcpy", call_kind::COPY_OTHER),
    ("cuMemcpy_ptds", call_kind::COPY_OTHER),
    ("cuMemcpyAsync", call_kind::COPY_OTHER),
    ("cuMemcpyAsync_ptsz", call_kind::COPY_OTHER),
    ("cuStreamSynchronize", call_kind::SYNC),
    ("cuStreamSynchronize_ptsz", call_kind::SYNC),
    ("cuCtxSynchronize", call_kind::SYNC),
    ("cuCtxSynchronize_v2", call_kind::SYNC),
    ("cuEventSynchronize", call_kind::SYNC),
];

#[derive(Debug, thiserror::Error)]
pub enum CudaProbeError {
    #[error("missing {}: run gpuwatch as root or grant these capabilities", .0.join(", "))]
    MissingCapabilities(Vec<&'static str>),
    #[error("cannot read this process's capabilities: {0}")]
    Capabilities(std::io::Error),
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
    #[error("map {name}: batch lookup: {source}")]
    BatchLookup {
        name: &'static str,
        source: std::io::Error,
    },
    #[error("{0} missing from the eBPF object")]
    Missing(&'static str),
    #[error("reading its symbols: {0}")]
    Symbols(#[from] elf::ElfError),
    #[error("none of the probed entry points is exported")]
    NoEntryPoints,
}

/// Kernel memory the per-CPU statistics map may take.
const STATS_BUDGET_BYTES: u64 = 8 << 20;

/// Entries of the per-CPU statistics map on a host with `possible_cpus` CPUs: as many as fit
/// [`STATS_BUDGET_BYTES`] (the kernel preallocates one value per possible CPU per entry), at
/// least 256 (128 GPU processes, main thread and others apart).
pub fn stats_entries(possible_cpus: u32) -> u32 {
    // the element header before the key (as in `stall_probe::map_sizing`), then the values
    let one = 80
        + size_of::<TaskKey>() as u64
        + size_of::<CudaStats>() as u64 * u64::from(possible_cpus.max(1));
    u32::try_from(STATS_BUDGET_BYTES / one)
        .unwrap_or(u32::MAX)
        .clamp(256, CUDA_TASK_ENTRIES)
}

/// The probed entry points of a library, with their offsets (one per offset: two names of one
/// function would count each call twice).
pub fn entry_points(lib: &LibraryFile) -> Result<Vec<(u64, u64)>, CudaProbeError> {
    let found = elf::exported_functions(&lib.file, lib.size, |name| {
        ENTRY_POINTS.iter().any(|(n, _)| *n == name)
    })?;
    let mut points: Vec<(u64, u64)> = Vec::new();
    for (name, kind) in ENTRY_POINTS {
        if let Some(offset) = found.get(*name) {
            if !points.iter().any(|(o, _)| o == offset) {
                points.push((*offset, *kind));
            }
        }
    }
    if points.is_empty() {
        return Err(CudaProbeError::NoEntryPoints);
    }
    Ok(points)
}

/// The probes' counters: per task, and the kernel side's failures.
pub struct Counters {
    stats: PerCpuHashMap<MapData, TaskKey, CudaStats>,
    /// Buffers for reading `stats` in batches; `None` where this kernel cannot (the keys are
    /// walked then).
    batch: Option<BatchReader<TaskKey, CudaStats>>,
    failures: PerCpuArray<MapData, u64>,
}

/// The programs, loaded; attached to no library until [`Programs::attach`].
pub struct Programs {
    ebpf: Ebpf,
    /// Links per attached library, by (device, inode).
    attached: HashMap<(u64, u64), Vec<(&'static str, UProbeLinkId)>>,
}

const LAUNCH: &str = "cuda_launch";
const CALL: &str = "cuda_call";
const RETURN: &str = "cuda_return";

fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut UProbe, CudaProbeError> {
    ebpf.program_mut(name)
        .ok_or(CudaProbeError::Missing(name))?
        .try_into()
        .map_err(|source| CudaProbeError::Program { name, source })
}

/// Checks privileges, loads the programs and creates the maps; attaches nothing.
pub fn load() -> Result<(Counters, Programs), CudaProbeError> {
    let missing =
        caps::missing_for_tracing(caps::effective().map_err(CudaProbeError::Capabilities)?);
    if !missing.is_empty() {
        return Err(CudaProbeError::MissingCapabilities(missing));
    }
    let cpus = aya::util::nr_cpus().map_or(1, |n| n.get());
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("CUDA_STATS", stats_entries(cpus))
        .load(PROGRAMS)?;
    for name in [LAUNCH, CALL, RETURN] {
        program(&mut ebpf, name)?
            .load()
            .map_err(|source| CudaProbeError::Program { name, source })?;
    }
    let map = |ebpf: &mut Ebpf, name: &'static str| {
        ebpf.take_map(name).ok_or(CudaProbeError::Missing(name))
    };
    let stats = map(&mut ebpf, "CUDA_STATS")?;
    let failures = map(&mut ebpf, "CUDA_PROBE_STATS")?;
    let counters = Counters {
        stats: PerCpuHashMap::try_from(stats).map_err(|source| CudaProbeError::Map {
            name: "CUDA_STATS",
            source,
        })?,
        batch: possible_cpus().map(BatchReader::new),
        failures: PerCpuArray::try_from(failures).map_err(|source| CudaProbeError::Map {
            name: "CUDA_PROBE_STATS",
            source,
        })?,
    };
    Ok((
        counters,
        Programs {
            ebpf,
            attached: HashMap::new(),
        },
    ))
}

impl Programs {
    pub fn is_attached(&self, key: (u64, u64)) -> bool {
        self.attached.contains_key(&key)
    }

    /// Attaches the programs to `points` of `lib` (from [`entry_points`]), for every process
    /// that maps it, through the agent's own descriptor of the file (so the kernel probes the
    /// inode that was checked, whatever its path names now). All or nothing: a failure detaches
    /// what this call attached.
    pub fn attach(
        &mut self,
        lib: &LibraryFile,
        points: &[(u64, u64)],
    ) -> Result<(), CudaProbeError> {
        let key = (lib.device, lib.inode);
        if self.attached.contains_key(&key) {
            return Ok(());
        }
        let with_cookies = |launch: bool| -> Vec<UProbeAttachPoint<'static>> {
            points
                .iter()
                .filter(|(_, kind)| {
                    launch == matches!(*kind, call_kind::LAUNCH | call_kind::GRAPH_LAUNCH)
                })
                .map(|(offset, kind)| UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(*offset),
                    cookie: Some(*kind),
                })
                .collect()
        };
        let path = lib.probe_path();
        let mut links = Vec::new();
        for (name, launch) in [(LAUNCH, true), (CALL, false), (RETURN, false)] {
            let points = with_cookies(launch);
            if points.is_empty() {
                continue;
            }
            let attached = program(&mut self.ebpf, name).and_then(|p| {
                p.attach(points, &path, UProbeScope::AllProcesses)
                    .map_err(|source| CudaProbeError::Program { name, source })
            });
            match attached {
                Ok(link) => links.push((name, link)),
                Err(e) => {
                    self.detach_links(links);
                    return Err(e);
                }
            }
        }
        self.attached.insert(key, links);
        Ok(())
    }

    fn detach_links(&mut self, links: Vec<(&'static str, UProbeLinkId)>) {
        for (name, link) in links {
            if let Ok(p) = program(&mut self.ebpf, name) {
                // A link already gone (its library's last mapping ended) has nothing to undo.
                let _ = p.detach(link);
            }
        }
    }

    /// Detaches the library `key` (device, inode), if attached.
    pub fn detach(&mut self, key: (u64, u64)) {
        if let Some(links) = self.attached.remove(&key) {
            self.detach_links(links);
        }
    }

    /// Detaches every library.
    pub fn detach_all(&mut self) {
        let all: Vec<_> = self.attached.drain().flat_map(|(_, l)| l).collect();
        self.detach_links(all);
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        self.detach_all();
    }
}

impl Counters {
    /// Reads the cumulative counters, summed over CPUs, into `out` (cleared first).
    pub fn read(&mut self, out: &mut HashMap<TaskKey, CudaStats>) -> Result<(), CudaProbeError> {
        out.clear();
        if let Some(reader) = self.batch.as_mut() {
            let result = reader.read(self.stats.map(), |key, per_cpu| {
                let mut total = CudaStats::default();
                for v in per_cpu {
                    add(&mut total, v);
                }
                out.insert(key, total);
            });
            match result {
                Ok(()) => return Ok(()),
                Err(BatchError::Unsupported) => {
                    self.batch = None;
                    out.clear();
                }
                Err(BatchError::Io(source)) => {
                    return Err(CudaProbeError::BatchLookup {
                        name: "CUDA_STATS",
                        source,
                    })
                }
            }
        }
        for item in self.stats.iter() {
            match item {
                Ok((key, per_cpu)) => {
                    let mut total = CudaStats::default();
                    for v in per_cpu.iter() {
                        add(&mut total, v);
                    }
                    out.insert(key, total);
                }
                // evicted between the key walk and the lookup
                Err(MapError::KeyNotFound) => {}
                Err(source) => {
                    return Err(CudaProbeError::Map {
                        name: "CUDA_STATS",
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    /// The kernel side's failure counters, by `cuda_stat` index.
    pub fn failures(&self) -> [u64; cuda_stat::COUNT as usize] {
        let mut out = [0; cuda_stat::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            if let Ok(v) = self.failures.get(&(i as u32), 0) {
                *slot = v.iter().sum();
            }
        }
        out
    }

    /// Deletes the entries of tasks that are gone.
    pub fn forget(&mut self, keys: &[TaskKey]) {
        for key in keys {
            let _ = self.stats.remove(key);
        }
    }
}

/// Adds one CPU's counters.
pub fn add(total: &mut CudaStats, o: &CudaStats) {
    total.launches += o.launches;
    total.graph_launches += o.graph_launches;
    for (a, b) in total.copies.iter_mut().zip(o.copies.iter()) {
        a.count += b.count;
        a.bytes += b.bytes;
        a.call_ns += b.call_ns;
        a.wait_ns += b.wait_ns;
        a.between_ns += b.between_ns;
    }
    total.syncs += o.syncs;
    total.sync_ns += o.sync_ns;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_map_stays_within_its_budget() {
        assert_eq!(stats_entries(2), CUDA_TASK_ENTRIES);
        for cpus in [64, 128, 512] {
            let n = stats_entries(cpus);
            let bytes = u64::from(n)
                * (80
                    + size_of::<TaskKey>() as u64
                    + size_of::<CudaStats>() as u64 * u64::from(cpus));
            assert!(n == 256 || bytes <= STATS_BUDGET_BYTES, "{cpus}: {n}");
        }
    }

    #[test]
    fn every_entry_point_is_named_once() {
        for (i, (name, _)) in ENTRY_POINTS.iter().enumerate() {
            assert!(
                !ENTRY_POINTS[i + 1..].iter().any(|(n, _)| n == name),
                "{name} twice"
            );
        }
    }
}
