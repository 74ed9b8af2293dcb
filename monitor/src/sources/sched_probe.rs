//! The scheduler probe: the `sched_switch` tracepoint program from `monitor-ebpf`, counting
//! switches (and switches out in D state) per (cgroup id, tgid) in a per-CPU LRU map.
//!
//! This is the eBPF pipeline's proof: build (aya-build), offsets from the format file, load,
//! attach, read each round. The stall analysis builds on it.
use crate::{caps, tracefs};
use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuHashMap};
use aya::programs::{ProgramError, TracePoint};
use aya::{Ebpf, EbpfError, EbpfLoader};
use monitor_common::{probe_stat, SchedCounts, TaskKey};
use std::collections::{HashMap, HashSet};

/// The compiled kernel programs, embedded at build time.
static PROBES: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpuwatch-probes"));

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("missing {}: run gpuwatch as root or grant these capabilities", .0.join(", "))]
    MissingCapabilities(Vec<&'static str>),
    #[error("cannot read this process's capabilities: {0}")]
    Capabilities(std::io::Error),
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
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
    #[error("map {0} missing from the eBPF object")]
    NoMap(&'static str),
}

/// The loaded and attached programs with their maps.
pub struct SchedProbe {
    _ebpf: Ebpf,
    counts: PerCpuHashMap<MapData, TaskKey, SchedCounts>,
    stats: PerCpuArray<MapData, u64>,
    watched: BpfHashMap<MapData, u64, u8>,
    watched_ids: HashSet<u64>,
}

impl SchedProbe {
    /// Checks privileges, finds tracefs, reads field offsets, loads and attaches. With
    /// `filter_by_cgroup`, the kernel counts only the cgroups passed to [`Self::watch`].
    pub fn load(filter_by_cgroup: bool) -> Result<Self, ProbeError> {
        let missing =
            caps::missing_for_tracing(caps::effective().map_err(ProbeError::Capabilities)?);
        if !missing.is_empty() {
            return Err(ProbeError::MissingCapabilities(missing));
        }
        let tracefs = tracefs::ensure_mounted()?;
        let prev_state = tracefs::field_layout(&tracefs, "sched", "sched_switch", "prev_state")?;

        let mut ebpf = EbpfLoader::new()
            .override_global("SCHED_SWITCH_PREV_STATE_OFFSET", &prev_state.offset, true)
            .override_global("SCHED_SWITCH_PREV_STATE_SIZE", &prev_state.size, true)
            .override_global("FILTER_BY_CGROUP", &u32::from(filter_by_cgroup), true)
            .load(PROBES)?;
        let program: &mut TracePoint = ebpf
            .program_mut("sched_switch")
            .ok_or(ProbeError::NoMap("sched_switch program"))?
            .try_into()
            .map_err(|source| ProbeError::Program {
                name: "sched_switch",
                source,
            })?;
        program.load().map_err(|source| ProbeError::Program {
            name: "sched_switch",
            source,
        })?;
        program
            .attach("sched", "sched_switch")
            .map_err(|source| ProbeError::Program {
                name: "sched_switch",
                source,
            })?;

        let counts = ebpf
            .take_map("SCHED_COUNTS")
            .ok_or(ProbeError::NoMap("SCHED_COUNTS"))?;
        let counts = PerCpuHashMap::try_from(counts).map_err(|source| ProbeError::Map {
            name: "SCHED_COUNTS",
            source,
        })?;
        let stats = ebpf
            .take_map("PROBE_STATS")
            .ok_or(ProbeError::NoMap("PROBE_STATS"))?;
        let stats = PerCpuArray::try_from(stats).map_err(|source| ProbeError::Map {
            name: "PROBE_STATS",
            source,
        })?;
        let watched = ebpf
            .take_map("WATCHED_CGROUPS")
            .ok_or(ProbeError::NoMap("WATCHED_CGROUPS"))?;
        let watched = BpfHashMap::try_from(watched).map_err(|source| ProbeError::Map {
            name: "WATCHED_CGROUPS",
            source,
        })?;
        Ok(Self {
            _ebpf: ebpf,
            counts,
            stats,
            watched,
            watched_ids: HashSet::new(),
        })
    }

    /// Makes the kernel filter watch exactly `ids` (only the changes reach the kernel).
    pub fn watch(&mut self, ids: &HashSet<u64>) -> Result<(), ProbeError> {
        let err = |source| ProbeError::Map {
            name: "WATCHED_CGROUPS",
            source,
        };
        for id in ids.difference(&self.watched_ids) {
            self.watched.insert(id, 1, 0).map_err(err)?;
        }
        for id in self.watched_ids.difference(ids) {
            match self.watched.remove(id) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(err(e)),
            }
        }
        self.watched_ids.clone_from(ids);
        Ok(())
    }

    /// Cumulative counts per (cgroup id, tgid), summed over CPUs. Entries whose read fails
    /// (deleted by LRU eviction between the key walk and the lookup) are skipped and counted.
    pub fn read_counts(&self, out: &mut HashMap<TaskKey, SchedCounts>) -> Result<u64, ProbeError> {
        out.clear();
        let mut failed = 0;
        for item in self.counts.iter() {
            match item {
                Ok((key, per_cpu)) => {
                    let mut sum = SchedCounts::default();
                    for c in per_cpu.iter() {
                        sum.switches += c.switches;
                        sum.blocked_switches += c.blocked_switches;
                    }
                    out.insert(key, sum);
                }
                Err(MapError::KeyNotFound) => failed += 1,
                Err(source) => {
                    return Err(ProbeError::Map {
                        name: "SCHED_COUNTS",
                        source,
                    })
                }
            }
        }
        Ok(failed)
    }

    /// The kernel side's failure counters: (map updates failed, field reads failed).
    pub fn probe_failures(&self) -> Result<(u64, u64), ProbeError> {
        let sum = |i: u32| -> Result<u64, ProbeError> {
            let v = self.stats.get(&i, 0).map_err(|source| ProbeError::Map {
                name: "PROBE_STATS",
                source,
            })?;
            Ok(v.iter().sum())
        };
        Ok((
            sum(probe_stat::MAP_UPDATE_FAILED)?,
            sum(probe_stat::FIELD_READ_FAILED)?,
        ))
    }
}
