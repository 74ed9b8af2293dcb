//! The container's own configuration, over the whole window: `container_shm`,
//! `container_cpu_limit`, `container_memory_limit`, `container_memlock` and
//! `gpu_allocated_idle` (the analysis stage's findings, [`crate::analysis::config_checks`]).
//! A GPU counts as idle only if no round saw the container use it; every other check reports
//! its worst round. Doctor.
pub use crate::analysis::config_checks::CHECKS as NAMES;
use crate::analysis::config_checks::{findings, ConfigFinding, Level, ALLOCATED_IDLE};
use crate::health::check::{Checks, Status, Window};
use crate::model::WorkloadId;
use std::collections::BTreeMap;

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    // (workload, check, ordinal within the round) -> (name, the finding kept)
    let mut kept: BTreeMap<(WorkloadId, &'static str, usize), (String, ConfigFinding)> =
        BTreeMap::new();
    for s in window.snaps {
        for w in window.workloads(s).filter(|w| !w.exited) {
            let mut ordinal: BTreeMap<&'static str, usize> = BTreeMap::new();
            for f in findings(w) {
                let n = ordinal.entry(f.check).or_default();
                let key = (w.id.clone(), f.check, *n);
                *n += 1;
                let replace = match kept.get(&key) {
                    None => true,
                    // In use in any round: not an idle allocation.
                    Some((_, old)) if f.check == ALLOCATED_IDLE => f.level <= old.level,
                    Some((_, old)) => f.level >= old.level,
                };
                if replace {
                    kept.insert(key, (w.name.clone(), f));
                }
            }
        }
    }
    for (subject, f) in kept.into_values() {
        let status = match f.level {
            Level::Ok => Status::Ok,
            Level::Warning => Status::Warning,
            Level::Risk => Status::Risk,
        };
        out.add(f.check, subject, status, f.value, f.threshold, &f.action);
    }
}
