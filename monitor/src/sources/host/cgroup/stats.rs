//! A workload's CPU and memory counters from its cgroup files (v1 and v2).
use super::pressure::PressureFiles;
use super::{layout::CgroupLayout, membership::CgroupMembership};
use crate::model::{PressureTotals, QuotaPeriods};
use crate::sources::host::live_file::LiveFile;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Cumulative CPU time and current memory of one cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CgroupUsage {
    /// CPU time consumed since the cgroup was created, in seconds.
    pub cpu_usage_seconds_total: f64,
    /// Memory charged to the cgroup (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub memory_bytes: u64,
    /// The memory limit, `None` when unlimited.
    pub memory_limit_bytes: Option<u64>,
    /// Page cache charged to the cgroup (v2 `memory.stat` `file`, v1 `total_cache`), shmem
    /// included; `None` when `memory.stat` cannot be read.
    pub page_cache_bytes: Option<u64>,
    /// Of the page cache, shared memory (v2 `shmem`, v1 `total_shmem`): `/dev/shm` and
    /// DataLoader tensors passed between processes, the job's own memory.
    pub shmem_bytes: Option<u64>,
    /// The CPU quota in cores, `None` when unlimited (or the cpu controller is not available).
    pub cpu_limit_cores: Option<f64>,
    /// The CPUs its cpuset lets it run on (`cpuset.cpus.effective`, v1
    /// `cpuset.effective_cpus`), `None` where the cpuset controller is not available.
    pub cpuset_cpus: Option<u32>,
    /// Time the CPU quota throttled the cgroup, since creation (`None`: not available).
    pub throttled_seconds_total: Option<f64>,
    /// Quota periods since creation: all those the cgroup ran in, and those it was throttled
    /// in (`cpu.stat` `nr_periods`, `nr_throttled`).
    pub periods_total: Option<QuotaPeriods>,
    /// Its pressure stall totals, where its unified-hierarchy directory has them.
    pub pressure: Option<PressureTotals>,
}

#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("no {controller} cgroup directory for this process on this host")]
    NoController { controller: &'static str },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot parse {field:?} from {text:?}")]
    Parse {
        path: PathBuf,
        field: &'static str,
        text: String,
    },
}

/// Where to read one workload's counters, resolved once from a member process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupStatsPaths {
    cpu: CpuSource,
    memory: MemorySource,
    quota: Option<QuotaSource>,
    /// The file listing the CPUs its cpuset allows.
    cpuset: Option<PathBuf>,
    pressure: Option<PressureFiles>,
}

/// Where the CPU quota and its throttling counters are.
#[derive(Clone, Debug, PartialEq, Eq)]
enum QuotaSource {
    /// v1 cpu controller: `cpu.cfs_quota_us`, `cpu.cfs_period_us`, `cpu.stat` (throttled_time,
    /// ns; read every round, so kept open).
    V1 { dir: PathBuf, stat: LiveFile },
    /// v2: `cpu.max` ("max 100000" or "50000 100000"), `cpu.stat` (throttled_usec).
    V2(PathBuf),
}

/// The files read every round are kept open ([`LiveFile`]); the rest are opened when read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum CpuSource {
    /// v1 `cpuacct.usage`, nanoseconds.
    V1(LiveFile),
    /// v2 `cpu.stat`, `usage_usec` line.
    V2(LiveFile),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum MemorySource {
    V1 {
        usage: LiveFile,
        stat: LiveFile,
        limit: PathBuf,
    },
    V2 {
        current: LiveFile,
        stat: LiveFile,
        max: PathBuf,
    },
}

/// The limits change only when an operator changes them (`docker update`), so they are read
/// once every this many rounds, not every round: on v2 that is two of a workload's four files.
pub const LIMITS_EVERY: u32 = 30;

/// The limits as last read, and the rounds left before they are read again.
#[derive(Clone, Debug, Default)]
pub struct LimitsCache {
    rounds_left: u32,
    memory_limit_bytes: Option<u64>,
    cpu_limit_cores: Option<f64>,
    cpuset_cpus: Option<u32>,
}

impl CgroupStatsPaths {
    pub fn resolve(
        layout: &CgroupLayout,
        membership: &CgroupMembership,
    ) -> Result<Self, StatsError> {
        let cpu = if layout.v1_mount("cpuacct").is_some() {
            let dir =
                membership
                    .controller_dir(layout, "cpuacct")
                    .ok_or(StatsError::NoController {
                        controller: "cpuacct",
                    })?;
            CpuSource::V1(LiveFile::new(dir.join("cpuacct.usage")))
        } else {
            let dir = membership
                .unified_dir(layout)
                .ok_or(StatsError::NoController { controller: "cpu" })?;
            CpuSource::V2(LiveFile::new(dir.join("cpu.stat")))
        };
        let memory = if layout.v1_mount("memory").is_some() {
            let dir =
                membership
                    .controller_dir(layout, "memory")
                    .ok_or(StatsError::NoController {
                        controller: "memory",
                    })?;
            MemorySource::V1 {
                usage: LiveFile::new(dir.join("memory.usage_in_bytes")),
                stat: LiveFile::new(dir.join("memory.stat")),
                limit: dir.join("memory.limit_in_bytes"),
            }
        } else {
            let dir = membership
                .unified_dir(layout)
                .ok_or(StatsError::NoController {
                    controller: "memory",
                })?;
            MemorySource::V2 {
                current: LiveFile::new(dir.join("memory.current")),
                stat: LiveFile::new(dir.join("memory.stat")),
                max: dir.join("memory.max"),
            }
        };
        let quota = if layout.v1_mount("cpu").is_some() {
            membership
                .controller_dir(layout, "cpu")
                .map(|dir| QuotaSource::V1 {
                    stat: LiveFile::new(dir.join("cpu.stat")),
                    dir,
                })
        } else {
            membership.unified_dir(layout).map(QuotaSource::V2)
        };
        let cpuset = if layout.v1_mount("cpuset").is_some() {
            membership
                .controller_dir(layout, "cpuset")
                .map(|dir| dir.join("cpuset.effective_cpus"))
        } else {
            membership
                .unified_dir(layout)
                .map(|dir| dir.join("cpuset.cpus.effective"))
        };
        let pressure = membership
            .unified_dir(layout)
            .map(|dir| PressureFiles::new(&dir));
        Ok(Self {
            cpu,
            memory,
            quota,
            cpuset,
            pressure,
        })
    }

    /// Reads the counters now, and the limits when `limits` says they are due.
    pub fn read(&mut self, limits: &mut LimitsCache) -> Result<CgroupUsage, StatsError> {
        let fresh = limits.rounds_left == 0;
        if fresh {
            limits.memory_limit_bytes = self.memory_limit()?;
            limits.cpu_limit_cores = self.cpu_limit();
            limits.cpuset_cpus = self
                .cpuset
                .as_deref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|t| cpu_list_len(&t));
            limits.rounds_left = LIMITS_EVERY;
        }
        limits.rounds_left -= 1;
        let memory_limit_bytes = limits.memory_limit_bytes;
        // v2 keeps usage and throttling in one file: read it once.
        let mut v2_cpu_stat: Option<String> = None;
        let cpu_usage_seconds_total = match &mut self.cpu {
            CpuSource::V1(f) => read_live_u64(f, "cpuacct.usage")? as f64 / 1e9,
            CpuSource::V2(f) => {
                let text = read_live(f)?;
                let p = f.path();
                let usec = text
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .ok_or_else(|| parse_error(p, "usage_usec", &text))?;
                let seconds = parse_u64(p, "usage_usec", usec)? as f64 / 1e6;
                v2_cpu_stat = Some(text);
                seconds
            }
        };
        let memory_bytes = match &mut self.memory {
            MemorySource::V1 { usage, .. } => read_live_u64(usage, "memory.usage_in_bytes")?,
            MemorySource::V2 { current, .. } => read_live_u64(current, "memory.current")?,
        };
        // The cache is part of the usage above: the job's own memory is the rest, shmem kept.
        let (stat, cache_field, shmem_field) = match &mut self.memory {
            MemorySource::V1 { stat, .. } => (stat, "total_cache", "total_shmem"),
            MemorySource::V2 { stat, .. } => (stat, "file", "shmem"),
        };
        let memory_stat = stat.read_string().ok();
        let page_cache_bytes = memory_stat
            .as_deref()
            .and_then(|t| stat_value(t, cache_field));
        let shmem_bytes = memory_stat
            .as_deref()
            .and_then(|t| stat_value(t, shmem_field));
        // The quota files exist only with the cpu controller enabled: absent means unknown.
        let (cpu_stat, throttled_field, per_second) = match &mut self.quota {
            None => (None, "", 1.0),
            Some(QuotaSource::V1 { stat, .. }) => (stat.read_string().ok(), "throttled_time", 1e9),
            Some(QuotaSource::V2(dir)) => (
                v2_cpu_stat.or_else(|| std::fs::read_to_string(dir.join("cpu.stat")).ok()),
                "throttled_usec",
                1e6,
            ),
        };
        let cpu_stat = cpu_stat.as_deref();
        let throttled_seconds_total = cpu_stat
            .and_then(|t| stat_value(t, throttled_field))
            .map(|v| v as f64 / per_second);
        let periods_total = cpu_stat.and_then(|t| {
            Some(QuotaPeriods {
                periods: stat_value(t, "nr_periods")?,
                throttled: stat_value(t, "nr_throttled")?,
            })
        });
        Ok(CgroupUsage {
            cpu_usage_seconds_total,
            memory_bytes,
            memory_limit_bytes,
            page_cache_bytes,
            shmem_bytes,
            cpu_limit_cores: limits.cpu_limit_cores,
            cpuset_cpus: limits.cpuset_cpus,
            throttled_seconds_total,
            periods_total,
            pressure: self.pressure.as_mut().and_then(PressureFiles::read),
        })
    }

    /// The memory limit, `None` when unlimited.
    fn memory_limit(&self) -> Result<Option<u64>, StatsError> {
        Ok(match &self.memory {
            MemorySource::V1 { limit, .. } => {
                let limit = read_u64(limit, "memory.limit_in_bytes")?;
                // v1 reports "unlimited" as a page-rounded i64::MAX.
                (limit < 1 << 62).then_some(limit)
            }
            MemorySource::V2 { max, .. } => match read(max)?.trim() {
                "max" => None,
                v => Some(parse_u64(max, "memory.max", v)?),
            },
        })
    }

    /// The CPU quota in cores, `None` when unlimited or unknown.
    fn cpu_limit(&self) -> Option<f64> {
        match self.quota.as_ref()? {
            QuotaSource::V1 { dir, .. } => {
                let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok()?;
                let period = std::fs::read_to_string(dir.join("cpu.cfs_period_us")).ok()?;
                let (q, p) = (
                    quota.trim().parse::<i64>().ok()?,
                    period.trim().parse::<f64>().ok()?,
                );
                (q > 0 && p > 0.0).then(|| q as f64 / p)
            }
            QuotaSource::V2(dir) => {
                let t = std::fs::read_to_string(dir.join("cpu.max")).ok()?;
                let mut it = t.split_whitespace();
                let (q, p) = (it.next()?, it.next()?);
                let (q, p) = (q.parse::<f64>().ok()?, p.parse::<f64>().ok()?);
                (p > 0.0).then_some(q / p)
            }
        }
    }
}

/// How many CPUs a CPU list names ("0-3,8,10-11": 7), `None` when it is not one (or empty:
/// a cpuset without CPUs of its own uses its parent's).
fn cpu_list_len(text: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// A `name value` line of a flat-keyed file such as `cpu.stat`.
fn stat_value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn read(path: &Path) -> Result<String, StatsError> {
    std::fs::read_to_string(path).map_err(|source| StatsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_u64(path: &Path, field: &'static str) -> Result<u64, StatsError> {
    parse_u64(path, field, &read(path)?)
}

fn read_live(f: &mut LiveFile) -> Result<String, StatsError> {
    f.read_string().map_err(|source| StatsError::Read {
        path: f.path().to_owned(),
        source,
    })
}

fn read_live_u64(f: &mut LiveFile, field: &'static str) -> Result<u64, StatsError> {
    let text = read_live(f)?;
    parse_u64(f.path(), field, &text)
}

fn parse_u64(path: &Path, field: &'static str, text: &str) -> Result<u64, StatsError> {
    text.trim()
        .parse()
        .map_err(|_| parse_error(path, field, text))
}

fn parse_error(path: &Path, field: &'static str, text: &str) -> StatsError {
    StatsError::Parse {
        path: path.to_owned(),
        field,
        text: text.chars().take(80).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_list_is_counted() {
        assert_eq!(cpu_list_len("0-1\n"), Some(2));
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("5"), Some(1));
        assert_eq!(cpu_list_len("\n"), None);
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("a-b"), None);
    }

    #[test]
    fn reads_v2_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("job");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("cpu.stat"),
            "usage_usec 2500000\nuser_usec 2000000\n",
        )
        .unwrap();
        std::fs::write(dir.join("memory.current"), "1048576\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("cpu.max"), "50000 100000\n").unwrap();
        std::fs::write(dir.join("cpuset.cpus.effective"), "0-1\n").unwrap();
        std::fs::write(
            dir.join("cpu.stat"),
            "usage_usec 2500000\nuser_usec 2000000\nnr_periods 20\nnr_throttled 7\nthrottled_usec 1500000\n",
        )
        .unwrap();
        let m = CgroupMembership::parse("0::/job\n");
        let mut paths =
            CgroupStatsPaths::resolve(&CgroupLayout::unified_at(root.path()), &m).unwrap();
        let u = paths.read(&mut LimitsCache::default()).unwrap();
        assert_eq!(u.cpu_usage_seconds_total, 2.5);
        assert_eq!(u.memory_bytes, 1 << 20);
        assert_eq!(u.memory_limit_bytes, None);
        assert_eq!(u.cpu_limit_cores, Some(0.5));
        assert_eq!(u.cpuset_cpus, Some(2));
        assert_eq!(u.throttled_seconds_total, Some(1.5));
        assert_eq!(
            u.periods_total,
            Some(QuotaPeriods {
                periods: 20,
                throttled: 7
            })
        );
        assert_eq!(u.page_cache_bytes, None, "no memory.stat yet");
        std::fs::write(dir.join("memory.max"), "2097152\n").unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            "anon 4096\nfile 786432\nkernel 8192\nshmem 65536\nfile_mapped 0\n",
        )
        .unwrap();
        let limited = paths.read(&mut LimitsCache::default()).unwrap();
        assert_eq!(limited.memory_limit_bytes, Some(2 << 20));
        assert_eq!(limited.page_cache_bytes, Some(786432));
        assert_eq!(limited.shmem_bytes, Some(65536), "not shmem_thp or others");
    }

    #[test]
    fn limits_are_read_once_every_limits_every_rounds() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("job");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("cpu.stat"), "usage_usec 1000000\n").unwrap();
        std::fs::write(dir.join("memory.current"), "4096\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("cpu.max"), "max 100000\n").unwrap();
        let m = CgroupMembership::parse("0::/job\n");
        let mut paths =
            CgroupStatsPaths::resolve(&CgroupLayout::unified_at(root.path()), &m).unwrap();
        let mut cache = LimitsCache::default();
        let first = paths.read(&mut cache).unwrap();
        assert_eq!(
            (first.memory_limit_bytes, first.cpu_limit_cores),
            (None, None)
        );
        // `docker update --memory 8m --cpus 2`: seen within LIMITS_EVERY rounds, not before.
        std::fs::write(dir.join("memory.max"), "8388608\n").unwrap();
        std::fs::write(dir.join("cpu.max"), "200000 100000\n").unwrap();
        std::fs::write(dir.join("memory.current"), "8192\n").unwrap();
        let mut seen = Vec::new();
        for _ in 1..=LIMITS_EVERY {
            let u = paths.read(&mut cache).unwrap();
            assert_eq!(u.memory_bytes, 8192, "usage is read every round");
            seen.push((u.memory_limit_bytes, u.cpu_limit_cores));
        }
        assert!(seen[..LIMITS_EVERY as usize - 1]
            .iter()
            .all(|l| *l == (None, None)));
        assert_eq!(seen.last(), Some(&(Some(8 << 20), Some(2.0))));
        // A limit file that turns unreadable is an error with its path, as usage is.
        std::fs::write(dir.join("memory.max"), "lots\n").unwrap();
        let err = paths
            .read(&mut LimitsCache::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory.max") && err.contains("lots"), "{err}");
    }

    #[test]
    fn reads_v1_files_and_names_bad_ones() {
        let root = tempfile::tempdir().unwrap();
        let cpu = root.path().join("cpuacct/docker/x");
        let mem = root.path().join("memory/docker/x");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::create_dir_all(&mem).unwrap();
        std::fs::write(cpu.join("cpuacct.usage"), "3000000000\n").unwrap();
        std::fs::write(mem.join("memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(mem.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let layout = CgroupLayout::from_mountinfo(&format!(
            "1 0 0:1 / {r}/cpuacct rw - cgroup cgroup rw,cpuacct\n2 0 0:2 / {r}/memory rw - cgroup cgroup rw,memory\n",
            r = root.path().display()
        ));
        let m = CgroupMembership::parse("3:cpuacct:/docker/x\n2:memory:/docker/x\n");
        let mut paths = CgroupStatsPaths::resolve(&layout, &m).unwrap();
        let u = paths.read(&mut LimitsCache::default()).unwrap();
        assert_eq!(u.cpu_usage_seconds_total, 3.0);
        assert_eq!(u.memory_bytes, 4096);
        assert_eq!(u.memory_limit_bytes, None);

        std::fs::write(mem.join("memory.usage_in_bytes"), "lots\n").unwrap();
        let err = paths
            .read(&mut LimitsCache::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory.usage_in_bytes") && err.contains("lots"),
            "{err}"
        );
        std::fs::remove_dir_all(&cpu).unwrap();
        let err = paths
            .read(&mut LimitsCache::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cpuacct.usage"), "{err}");
    }
}
