//! `doctor`'s checks of each container's own configuration (`/dev/shm`, CPU and memory limits,
//! memlock, GPUs given and not used), over the whole window: a GPU counts as idle only if no
//! round saw the container use it; every other check reports its worst round.
use super::doctor::{Check, Status};
use crate::analysis::container_config::{findings, ConfigFinding, Level};
use crate::model::{Snapshot, WorkloadId};
use std::collections::BTreeMap;

pub fn over(snaps: &[Snapshot]) -> Vec<Check> {
    // (workload, check, ordinal within the round) -> (name, the finding kept)
    let mut kept: BTreeMap<(WorkloadId, &'static str, usize), (String, ConfigFinding)> =
        BTreeMap::new();
    for s in snaps {
        for w in s.workloads.iter().filter(|w| !w.exited) {
            let mut ordinal: BTreeMap<&'static str, usize> = BTreeMap::new();
            for f in findings(w) {
                let n = ordinal.entry(f.check).or_default();
                let key = (w.id.clone(), f.check, *n);
                *n += 1;
                let replace = match kept.get(&key) {
                    None => true,
                    // In use in any round: not an idle allocation.
                    Some((_, old)) if f.check == "gpu_allocated_idle" => f.level <= old.level,
                    Some((_, old)) => f.level >= old.level,
                };
                if replace {
                    kept.insert(key, (w.name.clone(), f));
                }
            }
        }
    }
    kept.into_values()
        .map(|(subject, f)| Check {
            check: f.check,
            subject,
            status: match f.level {
                Level::Ok => Status::Ok,
                Level::Warning => Status::Warning,
                Level::Risk => Status::Risk,
            },
            value: f.value,
            threshold: f.threshold,
            action: f.action,
        })
        .collect()
}
