//! Judging a container's own configuration: each check turns its `config` section into a level,
//! the measured value, the threshold and a concrete fix (for `doctor`), and the verdict's advice
//! names the configuration when it is the cause.
use crate::model::{ContainerConfig, CpuLimit, Verdict, VerdictKind, Workload};
use crate::units::ByteSize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warning,
    Risk,
}

/// The checks' names, as `doctor` reports them.
pub const SHM: &str = "container_shm";
pub const CPU_LIMIT: &str = "container_cpu_limit";
pub const MEMORY_LIMIT: &str = "container_memory_limit";
pub const MEMLOCK: &str = "container_memlock";
pub const ALLOCATED_IDLE: &str = "gpu_allocated_idle";
pub const CHECKS: [&str; 5] = [SHM, CPU_LIMIT, MEMORY_LIMIT, MEMLOCK, ALLOCATED_IDLE];

/// One check of one container's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigFinding {
    pub check: &'static str,
    pub level: Level,
    pub value: String,
    pub threshold: String,
    /// What to do; empty when all is well.
    pub action: String,
}

/// `/dev/shm` this full is a risk: DataLoader workers die with "bus error" when it fills.
const SHM_FULL: f64 = 0.9;
/// Docker's default `/dev/shm`.
const SHM_DOCKER_DEFAULT: u64 = 64 * ByteSize::MIB;
/// Demand above the limit by this factor (and by half a core) is a risk.
const CPU_OVER_LIMIT: f64 = 1.2;
const CPU_THROTTLED_RISK: f64 = 0.25;
const CPU_THROTTLED_WARNING: f64 = 0.05;
/// Quota periods (100 ms each by default) a container must have run before its throttled
/// share since it started is judged: 5 s of work.
const QUOTA_PERIODS_MIN: u64 = 50;
/// Memory this close to its limit, with this share of it page cache, squeezes the cache.
const MEMORY_NEAR_LIMIT: f64 = 0.9;
const PAGE_CACHE_SHARE: f64 = 0.25;
/// Disk reads in the window that show the squeezed cache is read again.
const DISK_REREAD_BYTES: u64 = ByteSize::MIB;
const MEMLOCK_NEAR_LIMIT: f64 = 0.8;

/// Every check of `w`'s configuration; empty for a workload that is not a container.
pub fn findings(w: &Workload) -> Vec<ConfigFinding> {
    let Some(c) = &w.config else {
        return Vec::new();
    };
    // DataLoader workers: a GPU job with other processes that ran in the window (known only
    // with stall tracing; without it the default size is not flagged, only a full one).
    let workers = w.gpu.processes > 0
        && w.stalls.as_ref().is_some_and(|s| {
            s.processes
                .iter()
                .any(|p| p.role == crate::model::ProcessRole::Loader && p.on_cpu_seconds > 0.0)
        });
    let mut out = Vec::new();
    out.extend(shm(c, workers));
    out.extend(cpu(c));
    out.extend(memory(c));
    out.extend(memlock(c));
    out.extend(allocated(c));
    out
}

fn finding(check: &'static str, level: Level, value: String, threshold: &str) -> ConfigFinding {
    ConfigFinding {
        check,
        level,
        value,
        threshold: threshold.to_owned(),
        action: String::new(),
    }
}

fn shm(c: &ContainerConfig, trains: bool) -> Option<ConfigFinding> {
    let s = c.shm.as_ref()?;
    let used = s.used_bytes as f64 / s.size_bytes.max(1) as f64;
    let value = format!(
        "{} of {} used ({:.0}%){}",
        ByteSize(s.used_bytes),
        ByteSize(s.size_bytes),
        used * 100.0,
        match s.ipc_mode.as_deref() {
            Some("host") => ", the host's (--ipc=host)",
            _ => "",
        }
    );
    let level = if used >= SHM_FULL {
        Level::Risk
    } else if s.size_bytes <= SHM_DOCKER_DEFAULT && trains && s.ipc_mode.as_deref() != Some("host")
    {
        Level::Warning
    } else {
        Level::Ok
    };
    let mut f = finding(
        SHM,
        level,
        value,
        "risk ≥ 90% used; warning at Docker's 64 MiB default for a training container",
    );
    if level != Level::Ok {
        f.action = "PyTorch DataLoader workers hand batches over through /dev/shm and die with \
                    \"bus error\" when it fills: start the container with --shm-size=8g (compose: \
                    shm_size: 8g), or --ipc=host."
            .into();
    }
    Some(f)
}

fn cpu(c: &ContainerConfig) -> Option<ConfigFinding> {
    let cpu = &c.cpu;
    let limit = cpu.limit_cores?;
    let throttled = cpu.throttled_fraction.unwrap_or(0.0);
    // Since it started: a one-shot look in a window the workers happen to wait still sees a
    // quota that held the job back all along.
    let all_along = cpu
        .quota_periods
        .and_then(|p| p.throttled_share(QUOTA_PERIODS_MIN))
        .unwrap_or(0.0);
    let worst = throttled.max(all_along);
    let over = cpu
        .demand_cores
        .filter(|d| *d > limit * CPU_OVER_LIMIT && *d - limit >= 0.5);
    let level = match over {
        Some(_) => Level::Risk,
        None if worst >= CPU_THROTTLED_RISK => Level::Risk,
        None if worst >= CPU_THROTTLED_WARNING => Level::Warning,
        None => Level::Ok,
    };
    let mut f = finding(
        CPU_LIMIT,
        level,
        cpu_value(cpu, limit, throttled),
        "risk: demand above 1.2× the limit, or throttled ≥ 25% of the window or of its quota \
         periods since it started; warning: ≥ 5%",
    );
    if level != Level::Ok {
        f.action = cpu_action(cpu, limit);
    }
    Some(f)
}

/// The quota, the workers and processes that share it, and how often it throttled them.
fn cpu_value(cpu: &CpuLimit, limit: f64, throttled: f64) -> String {
    let workers = cpu
        .loader_workers
        .map(|n| format!("; {n} DataLoader workers"))
        .unwrap_or_default();
    let demand = match (cpu.demand_cores, cpu.busy_loader_processes) {
        (Some(d), Some(n)) => format!("; its processes want {d:.2} ({n} busy loader processes)"),
        _ => String::new(),
    };
    let since = cpu
        .quota_periods
        .filter(|p| p.periods >= QUOTA_PERIODS_MIN)
        .map(|p| {
            format!(
                ", in {:.0}% of its quota periods since it started ({} of {})",
                p.throttled as f64 * 100.0 / p.periods as f64,
                p.throttled,
                p.periods
            )
        })
        .unwrap_or_default();
    format!(
        "limit {limit:.2} cores{workers}{demand}; throttled {:.0}% of the window{since}",
        throttled * 100.0
    )
}

/// Raise the quota to what the job wants, or fit the workers to the quota.
fn cpu_action(cpu: &CpuLimit, limit: f64) -> String {
    // The cores its processes asked for, to the nearest (2.08 measured for two spinning loaders
    // under a 0.5 quota: the shell that waits on them adds a little); with workers known, one
    // each and one for the training loop.
    let want = cpu
        .demand_cores
        .unwrap_or(limit * 2.0)
        .round()
        .max(cpu.loader_workers.map_or(0.0, |n| n as f64 + 1.0))
        .max(limit.ceil())
        .max(1.0);
    // The training loop keeps a core of the quota; the workers get the rest.
    let fit = ((limit.floor() as u64).saturating_sub(1)).max(1);
    let who = match cpu.loader_workers.filter(|n| *n > 0) {
        Some(n) => format!("{n} DataLoader workers and the training loop share {limit:.2} CPUs"),
        None => format!("The CPU quota ({limit:.2} cores) is below what the loader needs"),
    };
    format!(
        "{who}: raise the quota to at least {want:.0} (docker --cpus {want:.0}, compose cpus: \
         \"{want:.0}\"), or set the DataLoader's num_workers={fit} so they fit."
    )
}

fn memory(c: &ContainerConfig) -> Option<ConfigFinding> {
    let m = &c.memory;
    let (limit, usage) = (m.limit_bytes?, m.usage_bytes?);
    let cache = m.page_cache_bytes.unwrap_or(0);
    let squeezed = usage as f64 >= limit as f64 * MEMORY_NEAR_LIMIT
        && cache as f64 >= limit as f64 * PAGE_CACHE_SHARE;
    let rereads = m.disk_read_bytes.is_some_and(|b| b >= DISK_REREAD_BYTES);
    let level = match (squeezed, rereads) {
        (true, true) => Level::Risk,
        (true, false) => Level::Warning,
        _ => Level::Ok,
    };
    let disk = m
        .disk_read_bytes
        .map(|b| format!("; {} read from disk in the window", ByteSize(b)))
        .unwrap_or_default();
    let mut f = finding(
        MEMORY_LIMIT,
        level,
        format!(
            "{} of the {} limit used, {} of it page cache{disk}",
            ByteSize(usage),
            ByteSize(limit),
            ByteSize(cache)
        ),
        "warning ≥ 90% of the limit with ≥ 25% page cache; risk when it also reads from disk",
    );
    if level != Level::Ok {
        f.action = format!(
            "The memory limit caps the page cache, so a dataset larger than about {} is read \
             from disk again every epoch: raise --memory (compose: mem_limit:), or cache the \
             dataset inside the limit on local NVMe.",
            ByteSize(cache)
        );
    }
    Some(f)
}

fn memlock(c: &ContainerConfig) -> Option<ConfigFinding> {
    let m = c.memlock?;
    let soft = m.soft_bytes?; // unlimited: nothing to check
    if m.locked_bytes == 0 {
        return None; // the job pins nothing; the limit does not bear on it
    }
    let level = if m.locked_bytes as f64 >= soft as f64 * MEMLOCK_NEAR_LIMIT {
        Level::Risk
    } else {
        Level::Ok
    };
    let mut f = finding(
        MEMLOCK,
        level,
        format!(
            "{} locked or pinned of a {} memlock limit",
            ByteSize(m.locked_bytes),
            ByteSize(soft)
        ),
        "risk ≥ 80% of the soft limit",
    );
    if level != Level::Ok {
        f.action = "Pinned host memory (RDMA, NCCL, mlock) is near the memlock limit and \
                    allocations will fail: start the container with --ulimit memlock=-1 \
                    (compose: ulimits: memlock: -1)."
            .into();
    }
    Some(f)
}

/// The GPUs given and not used this round, and declarations that name no GPU.
fn allocated(c: &ContainerConfig) -> Vec<ConfigFinding> {
    let Some(a) = &c.gpus else {
        return Vec::new();
    };
    let declared = a.applied_declarations();
    let mut out: Vec<ConfigFinding> = a
        .gpus
        .iter()
        .map(|g| {
            let mut f = finding(
                ALLOCATED_IDLE,
                if g.in_use { Level::Ok } else { Level::Warning },
                format!(
                    "GPU {} given ({}), {}",
                    g.index,
                    declared.join(", "),
                    if g.in_use {
                        format!("{} held on it", ByteSize(g.memory_bytes))
                    } else {
                        "no process of the container on it".to_owned()
                    }
                ),
                "warning: a GPU given and not used",
            );
            if !g.in_use {
                f.action = format!(
                    "GPU {} is reserved for this container and idle: leave it out of --gpus / \
                     NVIDIA_VISIBLE_DEVICES, or check why the job does not use it \
                     (CUDA_VISIBLE_DEVICES inside, a single-GPU script given several GPUs).",
                    g.index
                );
            }
            f
        })
        .collect();
    out.extend(a.unresolved.iter().map(|u| {
        let mut f = finding(
            ALLOCATED_IDLE,
            Level::Warning,
            format!("declared {u}"),
            "every declared device names a GPU of this host",
        );
        f.action =
            "Fix the declaration: list GPUs by an index or UUID that `nvidia-smi -L` shows.".into();
        f
    }));
    out
}

/// Adds to an input-bound verdict's advice what the configuration says about the cause: the
/// CPU quota it runs under, a full `/dev/shm`.
pub fn advise(v: &mut Verdict, c: &ContainerConfig) {
    if !matches!(
        v.kind,
        VerdictKind::InputBoundCpu | VerdictKind::InputBoundIo
    ) {
        return;
    }
    if let (VerdictKind::InputBoundCpu, Some(limit)) = (v.kind, c.cpu.limit_cores) {
        if !v.advice.contains("quota") {
            v.advice.push_str(&format!(
                " The container's CPU quota is {limit:.2} cores{}: raise docker --cpus first.",
                c.cpu
                    .busy_loader_processes
                    .map(|n| format!(" for {n} busy loader processes"))
                    .unwrap_or_default()
            ));
        }
        if c.cpu.loader_workers.is_some_and(|n| n > 0) {
            v.advice.push(' ');
            v.advice.push_str(&cpu_action(&c.cpu, limit));
        }
    }
    if let Some(s) = &c.shm {
        if s.used_bytes as f64 >= s.size_bytes as f64 * SHM_FULL {
            v.advice.push_str(&format!(
                " /dev/shm is {} of {} full: workers that die with \"bus error\" need a larger \
                 --shm-size (or --ipc=host).",
                ByteSize(s.used_bytes),
                ByteSize(s.size_bytes)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::container;
    use crate::model::{AllocatedGpu, CpuLimit, GpuAllocation, Memlock, MemoryLimit, ShmUse};

    /// A GPU job with one DataLoader worker that ran in the window.
    fn with(config: ContainerConfig) -> Workload {
        let mut w = container("trainer");
        w.gpu.processes = 1;
        w.stalls = Some(crate::model::StallWindow {
            cgroup_id: 1,
            processes: vec![crate::model::ProcessStall {
                pid: 7,
                role: crate::model::ProcessRole::Loader,
                on_cpu_seconds: 0.3,
                runq_seconds: 0.0,
                blocked_seconds: 0.0,
                sleep_seconds: 0.7,
                switches: 10,
                blocked_switches: 0,
                main_thread: None,
            }],
            reads: Default::default(),
            disk: Default::default(),
            io_traced: true,
        });
        w.config = Some(config);
        w
    }

    fn level_of(w: &Workload, check: &str) -> Vec<Level> {
        findings(w)
            .into_iter()
            .filter(|f| f.check == check)
            .map(|f| f.level)
            .collect()
    }

    #[test]
    fn a_full_or_default_shm_is_named_with_the_fix() {
        let shm = |size: u64, used: u64, ipc: &str| {
            with(ContainerConfig {
                shm: Some(ShmUse {
                    size_bytes: size,
                    used_bytes: used,
                    ipc_mode: Some(ipc.into()),
                }),
                ..Default::default()
            })
        };
        let full = shm(16 << 20, 15 << 20, "private");
        let f = &findings(&full)[0];
        assert_eq!((f.check, f.level), ("container_shm", Level::Risk));
        assert!(
            f.value.starts_with("15 MiB of 16 MiB used (94%)"),
            "{}",
            f.value
        );
        assert!(f.action.contains("--shm-size"));
        assert_eq!(
            level_of(&shm(64 << 20, 1 << 20, "private"), "container_shm"),
            [Level::Warning]
        );
        assert_eq!(
            level_of(&shm(64 << 20, 1 << 20, "host"), "container_shm"),
            [Level::Ok]
        );
        let mut no_workers = shm(64 << 20, 1 << 20, "private");
        no_workers.stalls = None;
        assert_eq!(level_of(&no_workers, "container_shm"), [Level::Ok]);
        assert_eq!(
            level_of(&shm(8 << 30, 1 << 20, "private"), "container_shm"),
            [Level::Ok]
        );
    }

    #[test]
    fn a_quota_below_the_loaders_demand_is_a_risk() {
        let cpu = |demand: Option<f64>, throttled: f64| {
            with(ContainerConfig {
                cpu: CpuLimit {
                    limit_cores: Some(0.5),
                    used_cores: Some(0.5),
                    throttled_fraction: Some(throttled),
                    busy_loader_processes: demand.map(|_| 2),
                    demand_cores: demand,
                    loader_workers: None,
                    quota_periods: None,
                },
                ..Default::default()
            })
        };
        let over = cpu(Some(2.0), 0.5);
        let f = &findings(&over)[0];
        assert_eq!(f.level, Level::Risk);
        assert!(f.value.contains("limit 0.50 cores"), "{}", f.value);
        assert!(f.value.contains("2 busy loader processes"), "{}", f.value);
        assert!(f.action.contains("--cpus 2"), "{}", f.action);
        assert_eq!(
            level_of(&cpu(Some(0.45), 0.0), "container_cpu_limit"),
            [Level::Ok]
        );
        assert_eq!(
            level_of(&cpu(None, 0.4), "container_cpu_limit"),
            [Level::Risk]
        );
        assert_eq!(
            level_of(&cpu(None, 0.1), "container_cpu_limit"),
            [Level::Warning]
        );
    }

    /// The ResNet-50 case: six DataLoader workers under `--cpus 1.5`, looked at in a window
    /// where they wait for the training loop.
    fn quiet_window(periods: u64, throttled: u64) -> Workload {
        with(ContainerConfig {
            cpu: CpuLimit {
                limit_cores: Some(1.5),
                used_cores: Some(0.2),
                throttled_fraction: Some(0.0),
                busy_loader_processes: Some(0),
                demand_cores: Some(0.2),
                loader_workers: Some(6),
                quota_periods: Some(crate::model::QuotaPeriods { periods, throttled }),
            },
            ..Default::default()
        })
    }

    #[test]
    fn a_quota_that_throttled_all_along_is_seen_in_a_quiet_window() {
        let w = quiet_window(890, 812);
        let f = &findings(&w)[0];
        assert_eq!(f.level, Level::Risk, "{f:?}");
        assert_eq!(
            f.value,
            "limit 1.50 cores; 6 DataLoader workers; its processes want 0.20 (0 busy loader \
             processes); throttled 0% of the window, in 91% of its quota periods since it \
             started (812 of 890)"
        );
        assert!(
            f.action.starts_with(
                "6 DataLoader workers and the training loop share 1.50 CPUs: raise the quota to \
                 at least 7 (docker --cpus 7"
            ) && f
                .action
                .ends_with("or set the DataLoader's num_workers=1 so they fit."),
            "{}",
            f.action
        );
        // The thresholds, on the share since it started.
        let level = |throttled| level_of(&quiet_window(1000, throttled), CPU_LIMIT);
        assert_eq!(level(250), [Level::Risk]);
        assert_eq!(level(249), [Level::Warning]);
        assert_eq!(level(50), [Level::Warning]);
        assert_eq!(level(49), [Level::Ok]);
        // Too few periods to judge: a container that has barely run.
        assert_eq!(
            level_of(&quiet_window(QUOTA_PERIODS_MIN - 1, 40), CPU_LIMIT),
            [Level::Ok]
        );
    }

    #[test]
    fn a_squeezed_page_cache_that_rereads_is_a_risk() {
        let mem = |cache: u64, disk: Option<u64>| {
            with(ContainerConfig {
                memory: MemoryLimit {
                    limit_bytes: Some(4 << 30),
                    usage_bytes: Some(3900 << 20),
                    page_cache_bytes: Some(cache),
                    disk_read_bytes: disk,
                },
                ..Default::default()
            })
        };
        assert_eq!(
            level_of(&mem(3 << 30, Some(200 << 20)), "container_memory_limit"),
            [Level::Risk]
        );
        assert_eq!(
            level_of(&mem(3 << 30, None), "container_memory_limit"),
            [Level::Warning]
        );
        assert_eq!(
            level_of(&mem(10 << 20, Some(200 << 20)), "container_memory_limit"),
            [Level::Ok]
        );
    }

    #[test]
    fn memlock_only_where_the_job_pins() {
        let lock = |soft: Option<u64>, locked: u64| {
            with(ContainerConfig {
                memlock: Some(Memlock {
                    soft_bytes: soft,
                    hard_bytes: soft,
                    locked_bytes: locked,
                }),
                ..Default::default()
            })
        };
        assert!(level_of(&lock(Some(64 << 10), 0), "container_memlock").is_empty());
        assert!(level_of(&lock(None, 1 << 30), "container_memlock").is_empty());
        assert_eq!(
            level_of(&lock(Some(64 << 10), 60 << 10), "container_memlock"),
            [Level::Risk]
        );
    }

    #[test]
    fn the_advice_names_the_quota_and_a_full_shm() {
        let verdict = |kind| Verdict {
            gpu_busy_fraction: 0.3,
            gpu_idle_fraction: 0.7,
            input_bound_share: Some(0.6),
            trainer_wait_fraction: Some(0.6),
            ..crate::model::test_support::verdict(kind, "The data loader is CPU-bound.")
        };
        let config = ContainerConfig {
            cpu: CpuLimit {
                limit_cores: Some(0.5),
                busy_loader_processes: Some(2),
                ..Default::default()
            },
            shm: Some(ShmUse {
                size_bytes: 16 << 20,
                used_bytes: 16 << 20,
                ipc_mode: None,
            }),
            ..Default::default()
        };
        let mut v = verdict(VerdictKind::InputBoundCpu);
        advise(&mut v, &config);
        assert!(
            v.advice
                .contains("CPU quota is 0.50 cores for 2 busy loader processes"),
            "{}",
            v.advice
        );
        assert!(v.advice.contains("--shm-size"), "{}", v.advice);
        let mut gpu_bound = verdict(VerdictKind::GpuBound);
        advise(&mut gpu_bound, &config);
        assert_eq!(gpu_bound.advice, "The data loader is CPU-bound.");
    }

    #[test]
    fn an_unused_given_gpu_warns_and_names_the_declaration() {
        let w = with(ContainerConfig {
            gpus: Some(GpuAllocation {
                claims: vec![crate::model::ResolvedClaim {
                    claim: crate::model::GpuClaim {
                        via: crate::model::ClaimVia::DeviceNodes,
                        declared: "--device /dev/nvidia1".into(),
                        devices: crate::model::ClaimedDevices::List(vec![]),
                        applied: true,
                        note: None,
                    },
                    gpus: vec![1],
                    unresolved: Vec::new(),
                }],
                gpus: vec![
                    AllocatedGpu {
                        index: 0,
                        uuid: None,
                        in_use: true,
                        memory_bytes: 1 << 30,
                    },
                    AllocatedGpu {
                        index: 1,
                        uuid: None,
                        in_use: false,
                        memory_bytes: 0,
                    },
                ],
                unresolved: vec!["GPU-dead: no such GPU among the 2 NVML lists".into()],
            }),
            ..Default::default()
        });
        let f = findings(&w);
        let levels: Vec<Level> = f.iter().map(|f| f.level).collect();
        assert_eq!(levels, [Level::Ok, Level::Warning, Level::Warning]);
        assert!(f[1].value.contains("GPU 1 given (--device /dev/nvidia1)"));
        assert!(f[2].value.contains("GPU-dead"));
    }
}
