//! The counters stage: each workload's cgroup CPU, memory and pressure, as totals and as rates
//! over the round's window (from the previous round's totals).
use super::cgroups::WorkloadCgroups;
use crate::events::{CgroupStatsFailed, EventCounters};
use crate::model::{CpuUsage, MemoryUsage, Pressure, PressureTotals, Workload, WorkloadId};
use crate::sources::host::cgroup::stats::CgroupUsage;
use std::collections::{BTreeMap, HashMap};

/// A workload's totals as the previous round read them.
#[derive(Default, Clone, Copy)]
struct Previous {
    cpu_seconds: Option<f64>,
    throttled_seconds: Option<f64>,
    pressure: Option<PressureTotals>,
}

#[derive(Default)]
pub(super) struct CgroupCounters {
    previous: HashMap<WorkloadId, Previous>,
}

impl CgroupCounters {
    /// Reads each workload's cgroup into its `cpu`, `memory` and `pressure`, with rates over
    /// `window` seconds. An exited workload's cgroup is gone: it keeps the values last read.
    pub fn read(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        cgroups: &mut WorkloadCgroups,
        window: Option<f64>,
        events: &EventCounters,
    ) {
        for (id, w) in workloads.iter_mut() {
            let prev = self.previous.get(id).copied().unwrap_or_default();
            let mut now = Previous::default();
            let Some(cg) = cgroups.get_mut(id) else {
                w.errors.insert(
                    "cgroup",
                    "no member process to locate the cgroup".to_owned(),
                );
                self.previous.insert(id.clone(), now);
                continue;
            };
            w.cgroup_path = Some(cg.path.clone());
            if !w.exited {
                match &mut cg.stats {
                    Ok(paths) => match paths.read(&mut cg.limits) {
                        Ok(u) => now = fill(w, &u, prev, window),
                        Err(e) => {
                            events.emit(CgroupStatsFailed {
                                workload: id.to_string(),
                                error: e.to_string(),
                            });
                            w.errors.insert("cgroup", e.to_string());
                        }
                    },
                    Err(e) => {
                        w.errors.insert("cgroup", e.to_string());
                    }
                }
            }
            self.previous.insert(id.clone(), now);
        }
        self.previous.retain(|id, _| workloads.contains_key(id));
    }
}

/// Fills `w` from the totals `u` just read; the totals for the next round.
fn fill(w: &mut Workload, u: &CgroupUsage, prev: Previous, window: Option<f64>) -> Previous {
    let rate = |n: Option<f64>, b: Option<f64>| match (n, b, window) {
        (Some(n), Some(b), Some(win)) => Some(((n - b) / win).max(0.0)),
        _ => None,
    };
    w.cpu = Some(CpuUsage {
        usage_seconds_total: u.cpu_usage_seconds_total,
        cores: rate(Some(u.cpu_usage_seconds_total), prev.cpu_seconds),
        limit_cores: u.cpu_limit_cores,
        cpuset_cpus: u.cpuset_cpus,
        throttled_seconds_total: u.throttled_seconds_total,
        throttled_fraction: rate(u.throttled_seconds_total, prev.throttled_seconds)
            .map(|f| f.min(1.0)),
        quota_periods: u.periods_total,
    });
    w.pressure = match (prev.pressure, u.pressure, window) {
        (Some(a), Some(b), Some(win)) => Pressure::between(&a, &b, win),
        _ => None,
    };
    w.memory = Some(MemoryUsage::new(
        u.memory_bytes,
        u.memory_limit_bytes,
        u.page_cache_bytes.map(|c| (c, u.shmem_bytes.unwrap_or(0))),
    ));
    Previous {
        cpu_seconds: Some(u.cpu_usage_seconds_total),
        throttled_seconds: u.throttled_seconds_total,
        pressure: u.pressure,
    }
}
