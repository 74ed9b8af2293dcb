//! Each container's configuration section, read every round from its inspect response (kept by
//! the Docker cache), its main process's `/proc` entries (`mountinfo`, `limits`, `root/dev/shm`),
//! its GPU processes' `status`, and what the cgroup and the probes measured in the window.
use crate::model::{
    AllocatedGpu, ClaimedDevices, ContainerConfig, ContainerInfo, CpuLimit, Gpu, GpuAllocation,
    GpuClaim, Memlock, MemoryLimit, ProcessRole, ResolvedClaim, ShmUse, Workload,
};
use crate::sources::host::{HostReadError, HostReader};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loader process busy (on a CPU or waiting for one) this share of the window counts as busy.
const BUSY_LOADER_SHARE: f64 = 0.5;

/// How often the GPU processes' locked pages are re-read: a `status` file per process (~10 µs
/// each, 1,600 of them at 8 GPUs × 200 processes) is too much for every round, and pinned
/// memory grows at allocation, not by the second.
const LOCKED_REFRESH: Duration = Duration::from_secs(30);

/// What stays put while a container's main process lives, read once per process: whether it
/// has a `/dev/shm` mount (its `mountinfo`) and its memlock limit (its `limits`); and the GPU
/// processes' locked pages, every [`LOCKED_REFRESH`]. Per round only a `statvfs` is read.
#[derive(Clone)]
struct Fixed {
    shm_mounted: Result<bool, Arc<HostReadError>>,
    memlock: Result<(Option<u64>, Option<u64>), Arc<HostReadError>>,
    locked: Option<(u64, Instant)>,
}

/// Reads each container's configuration section, caching what does not change.
#[derive(Default)]
pub struct ConfigReader {
    fixed: HashMap<(String, u32), Fixed>,
}

impl ConfigReader {
    /// The configuration section of container `w` (its facts only; the checks are the
    /// analysis's).
    pub fn read(
        &mut self,
        host: &HostReader,
        c: &ContainerInfo,
        w: &Workload,
        gpus: &[Gpu],
        window: Option<f64>,
    ) -> ContainerConfig {
        let mut out = ContainerConfig {
            cpu: cpu(host, w, window),
            memory: memory(w),
            gpus: allocation(&c.gpu_claims, gpus, w),
            ..Default::default()
        };
        let Some(pid) = c.init_pid else {
            out.errors
                .insert("process", "Docker gave no main process PID".into());
            return out;
        };
        let entry = self
            .fixed
            .entry((c.id.clone(), pid))
            .or_insert_with(|| Fixed {
                shm_mounted: host.shm_mounted(pid).map_err(Arc::new),
                memlock: host.memlock_limit(pid).map_err(Arc::new),
                locked: None,
            });
        // Locked pages matter only under a limit.
        let limited = matches!(entry.memlock, Ok((Some(_), _)));
        let stale = entry
            .locked
            .is_none_or(|(_, at)| at.elapsed() >= LOCKED_REFRESH);
        if limited && stale {
            entry.locked = Some((locked_bytes(host, w), Instant::now()));
        }
        let fixed = entry.clone();
        match fixed.shm_mounted.and_then(|m| match m {
            true => host.shm_use(pid).map(Some).map_err(Arc::new),
            false => Ok(None),
        }) {
            Ok(s) => {
                out.shm = s.map(|(size_bytes, used_bytes)| ShmUse {
                    size_bytes,
                    used_bytes,
                    ipc_mode: c.ipc_mode.clone(),
                })
            }
            Err(e) => {
                out.errors.insert("shm", e.to_string());
            }
        }
        match fixed.memlock {
            Ok((soft_bytes, hard_bytes)) => {
                out.memlock = Some(Memlock {
                    soft_bytes,
                    hard_bytes,
                    locked_bytes: fixed.locked.map_or(0, |(b, _)| b),
                })
            }
            Err(e) => {
                out.errors.insert("memlock", e.to_string());
            }
        }
        out
    }

    /// Forgets the containers `running` no longer lists.
    pub fn retain(&mut self, running: impl Fn(&str) -> bool) {
        self.fixed.retain(|(id, _), _| running(id));
    }
}

fn cpu(host: &HostReader, w: &Workload, window: Option<f64>) -> CpuLimit {
    let (busy, demand) = match (&w.stalls, window) {
        (Some(s), Some(win)) if win > 0.0 => {
            let wanted = |p: &crate::model::ProcessStall| p.on_cpu_seconds + p.runq_seconds;
            let busy = s
                .processes
                .iter()
                .filter(|p| p.role == ProcessRole::Loader && wanted(p) / win >= BUSY_LOADER_SHARE)
                .count();
            let demand = s.processes.iter().map(wanted).sum::<f64>() / win;
            (Some(busy), Some(demand))
        }
        _ => (None, None),
    };
    let limit_cores = w.cpu.and_then(|c| c.limit_cores);
    CpuLimit {
        limit_cores,
        used_cores: w.cpu.and_then(|c| c.cores),
        throttled_fraction: w.cpu.and_then(|c| c.throttled_fraction),
        busy_loader_processes: busy,
        demand_cores: demand,
        loader_workers: limit_cores
            .filter(|_| w.gpu.processes > 0)
            .map(|_| loader_workers(host, w)),
        quota_periods: w.cpu.and_then(|c| c.quota_periods),
    }
}

/// The DataLoader workers: children of the workload's GPU processes, alive now. A DataLoader
/// forks (or spawns) its workers from the thread that iterates it, the main thread in a
/// training script, so only the main thread's `children` is read: one file per GPU process.
fn loader_workers(host: &HostReader, w: &Workload) -> usize {
    let gpu_pids = w.gpu.pids();
    let children: BTreeSet<u32> = gpu_pids
        .iter()
        .flat_map(|pid| host.main_thread_children(*pid))
        .collect();
    // A GPU process started by another (a launcher's ranks) is no worker.
    children.difference(&gpu_pids).count()
}

fn memory(w: &Workload) -> MemoryLimit {
    MemoryLimit {
        limit_bytes: w.memory.and_then(|m| m.limit_bytes),
        usage_bytes: w.memory.map(|m| m.usage_bytes),
        page_cache_bytes: w.memory.and_then(|m| m.page_cache_bytes),
        disk_read_bytes: w.stalls.as_ref().map(|s| s.disk.bytes),
    }
}

/// `VmLck` + `VmPin` over the workload's GPU processes.
fn locked_bytes(host: &HostReader, w: &Workload) -> u64 {
    w.gpu
        .pids()
        .iter()
        .filter_map(|p| host.locked_bytes(*p))
        .sum()
}

/// Each claim resolved against the host's GPUs; the applied ones' GPUs, each with whether the
/// container uses it.
pub fn allocation(claims: &[GpuClaim], gpus: &[Gpu], w: &Workload) -> Option<GpuAllocation> {
    if claims.is_empty() {
        return None;
    }
    let resolved: Vec<ResolvedClaim> = claims.iter().map(|c| resolve(c, gpus)).collect();
    let applied = || resolved.iter().filter(|r| r.claim.applied);
    let given: BTreeSet<u32> = applied().flat_map(|r| r.gpus.iter().copied()).collect();
    let unresolved = applied()
        .flat_map(|r| r.unresolved.iter().cloned())
        .collect();
    let gpus = given
        .into_iter()
        .filter_map(|index| gpus.iter().find(|g| g.device.index == index))
        .map(|g| {
            let share = w.gpu.per_gpu.iter().find(|s| s.index == g.device.index);
            AllocatedGpu {
                index: g.device.index,
                uuid: g.device.uuid.clone(),
                in_use: share.is_some_and(|s| !s.pids.is_empty()),
                memory_bytes: share.map_or(0, |s| s.memory_bytes),
            }
        })
        .collect();
    Some(GpuAllocation {
        claims: resolved,
        gpus,
        unresolved,
    })
}

fn resolve(c: &GpuClaim, gpus: &[Gpu]) -> ResolvedClaim {
    let mut out = ResolvedClaim {
        claim: c.clone(),
        gpus: Vec::new(),
        unresolved: Vec::new(),
    };
    match &c.devices {
        ClaimedDevices::All => out.gpus.extend(gpus.iter().map(|g| g.device.index)),
        ClaimedDevices::None | ClaimedDevices::Void => {}
        ClaimedDevices::Unparsed { reason, .. } => {
            out.unresolved.push(format!("{}: {reason}", c.declared))
        }
        ClaimedDevices::List(refs) => {
            for r in refs {
                match r.find(gpus) {
                    Ok(index) if !out.gpus.contains(&index) => out.gpus.push(index),
                    Ok(_) => {}
                    Err(why) => out.unresolved.push(format!("{r}: {why}")),
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu};
    use crate::model::{ClaimVia, DeviceRef, WorkloadGpuShare};

    fn claim(devices: ClaimedDevices, applied: bool) -> GpuClaim {
        GpuClaim {
            via: ClaimVia::VisibleDevicesEnv,
            declared: "NVIDIA_VISIBLE_DEVICES=…".into(),
            devices,
            applied,
            note: None,
        }
    }

    #[test]
    fn claims_resolve_by_index_uuid_and_minor_and_say_which_are_used() {
        let mut gpus = vec![gpu(0), gpu(1), gpu(2)];
        gpus[2].device.minor_number = Some(7);
        let mut w = container("trainer");
        let mut share = WorkloadGpuShare::new(1, None);
        share.pids = vec![42];
        share.memory_bytes = 1 << 30;
        w.gpu.per_gpu.push(share);
        let uuid = gpus[1].device.uuid.clone().unwrap().to_lowercase();
        let claims = vec![
            claim(
                ClaimedDevices::List(vec![DeviceRef::Index(0), DeviceRef::Uuid(uuid)]),
                true,
            ),
            claim(ClaimedDevices::List(vec![DeviceRef::Minor(7)]), true),
            claim(
                ClaimedDevices::List(vec![
                    DeviceRef::Index(9),
                    DeviceRef::MigUuid("MIG-1".into()),
                ]),
                true,
            ),
            claim(ClaimedDevices::All, false),
        ];
        let a = allocation(&claims, &gpus, &w).unwrap();
        let got: Vec<(u32, bool, u64)> = a
            .gpus
            .iter()
            .map(|g| (g.index, g.in_use, g.memory_bytes))
            .collect();
        assert_eq!(got, [(0, false, 0), (1, true, 1 << 30), (2, false, 0)]);
        assert_eq!(a.unresolved.len(), 2, "{:?}", a.unresolved);
        assert!(a.unresolved[0].starts_with("9: no such GPU among the 3"));
        assert!(a.unresolved[1].contains("MIG"));
        assert_eq!(a.claims[0].gpus, [0, 1]);
        assert_eq!(a.claims[1].gpus, [2]);
        assert_eq!(a.claims[3].gpus, [0, 1, 2], "resolved, though not applied");
        assert!(allocation(&[], &gpus, &w).is_none());
        let none = allocation(&[claim(ClaimedDevices::None, true)], &gpus, &w).unwrap();
        assert!(none.gpus.is_empty());
    }
}
