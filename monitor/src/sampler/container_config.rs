//! Each container's configuration section, read every round from its inspect response (kept by
//! the Docker cache), its main process's `/proc` entries (`mountinfo`, `limits`, `root/dev/shm`),
//! its GPU processes' `status`, and what the cgroup and the probes measured in the window.
use crate::model::{
    AllocatedGpu, ClaimedDevices, ContainerConfig, ContainerInfo, CpuLimit, Gpu, GpuAllocation,
    GpuClaim, Memlock, MemoryLimit, ProcessRole, ResolvedClaim, ShmUse, Workload,
};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
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
    shm_mounted: Result<bool, String>,
    memlock: Result<(Option<u64>, Option<u64>), String>,
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
        proc_root: &Path,
        c: &ContainerInfo,
        w: &Workload,
        gpus: &[Gpu],
        window: Option<f64>,
    ) -> ContainerConfig {
        let mut out = ContainerConfig {
            cpu: cpu(proc_root, w, window),
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
                shm_mounted: shm_mounted(proc_root, pid),
                memlock: memlock_limit(proc_root, pid),
                locked: None,
            });
        // Locked pages matter only under a limit.
        let limited = matches!(entry.memlock, Ok((Some(_), _)));
        let stale = entry
            .locked
            .is_none_or(|(_, at)| at.elapsed() >= LOCKED_REFRESH);
        if limited && stale {
            entry.locked = Some((locked_bytes(proc_root, w), Instant::now()));
        }
        let fixed = entry.clone();
        match fixed.shm_mounted.and_then(|m| match m {
            true => shm_use(proc_root, pid).map(Some),
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
                out.errors.insert("shm", e);
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
                out.errors.insert("memlock", e);
            }
        }
        out
    }

    /// Forgets the containers `running` no longer lists.
    pub fn retain(&mut self, running: impl Fn(&str) -> bool) {
        self.fixed.retain(|(id, _), _| running(id));
    }
}

fn cpu(proc_root: &Path, w: &Workload, window: Option<f64>) -> CpuLimit {
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
            .map(|_| loader_workers(proc_root, w)),
        quota_periods: w.cpu.and_then(|c| c.quota_periods),
    }
}

/// The DataLoader workers: children of the workload's GPU processes, alive now. A DataLoader
/// forks (or spawns) its workers from the thread that iterates it, the main thread in a
/// training script, so only the main thread's `children` is read: one file per GPU process.
fn loader_workers(proc_root: &Path, w: &Workload) -> usize {
    let gpu_pids = w.gpu.pids();
    let children: BTreeSet<u32> = gpu_pids
        .iter()
        .filter_map(|pid| {
            std::fs::read_to_string(proc_root.join(format!("{pid}/task/{pid}/children"))).ok()
        })
        .flat_map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
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

/// Whether the process sees a `/dev/shm` mount.
fn shm_mounted(proc_root: &Path, pid: u32) -> Result<bool, String> {
    let mountinfo = proc_root.join(pid.to_string()).join("mountinfo");
    let text =
        std::fs::read_to_string(&mountinfo).map_err(|e| format!("{}: {e}", mountinfo.display()))?;
    Ok(text
        .lines()
        .any(|l| l.split(' ').nth(4) == Some("/dev/shm")))
}

/// Size and use of the `/dev/shm` the process sees.
fn shm_use(proc_root: &Path, pid: u32) -> Result<(u64, u64), String> {
    let path = proc_root.join(pid.to_string()).join("root/dev/shm");
    let st = statvfs(&path).map_err(|e| format!("statvfs {}: {e}", path.display()))?;
    let frsize = st.f_frsize;
    Ok((
        st.f_blocks.saturating_mul(frsize),
        st.f_blocks
            .saturating_sub(st.f_bfree)
            .saturating_mul(frsize),
    ))
}

fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is written by the call before it is read.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// The main process's `Max locked memory` (soft, hard).
fn memlock_limit(proc_root: &Path, pid: u32) -> Result<(Option<u64>, Option<u64>), String> {
    let path = proc_root.join(pid.to_string()).join("limits");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_memlock(&text)
        .ok_or_else(|| format!("{}: no readable \"Max locked memory\" line", path.display()))
}

/// `VmLck` + `VmPin` over the workload's GPU processes.
fn locked_bytes(proc_root: &Path, w: &Workload) -> u64 {
    let pids: BTreeSet<u32> = w
        .gpu
        .per_gpu
        .iter()
        .flat_map(|s| s.pids.iter().copied())
        .collect();
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(proc_root.join(p.to_string()).join("status")).ok())
        .map(|status| locked_kib(&status) * 1024)
        .sum()
}

/// `(soft, hard)` of the `Max locked memory` line of `/proc/<pid>/limits`; `None` = unlimited.
fn parse_memlock(limits: &str) -> Option<(Option<u64>, Option<u64>)> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let mut it = rest.split_whitespace();
    let value = |v: &str| match v {
        "unlimited" => Some(None),
        n => n.parse::<u64>().ok().map(Some),
    };
    Some((value(it.next()?)?, value(it.next()?)?))
}

fn locked_kib(status: &str) -> u64 {
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("VmLck:")
                .or_else(|| l.strip_prefix("VmPin:"))
        })
        .filter_map(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
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

    #[test]
    fn memlock_and_locked_pages_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n\
                      Max locked memory         8388608              unlimited            bytes\n";
        assert_eq!(parse_memlock(limits), Some((Some(8 << 20), None)));
        assert_eq!(parse_memlock("Max open files 1 1 files\n"), None);
        assert_eq!(
            locked_kib("Name:\tpython\nVmLck:\t     128 kB\nVmPin:\t      64 kB\n"),
            192
        );
    }

    #[test]
    fn shm_of_a_real_process() {
        // This test process's own view: /dev/shm is a tmpfs mount on Debian and in containers.
        let me = std::process::id();
        if shm_mounted(Path::new("/proc"), me).unwrap() {
            let (size, used) = shm_use(Path::new("/proc"), me).unwrap();
            assert!(size > 0 && used <= size, "{size} {used}");
        } else {
            assert!(!std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(" /dev/shm "));
        }
    }
}
