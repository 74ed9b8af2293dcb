//! `container_memory`: a container's own host memory high and rising steadily (a fit over the
//! window), as the monitoring article watches psutil's RSS, or close to its memory limit. A
//! trainer holding 10 GiB flat is no finding: size alone says nothing of a leak. Its own
//! memory leaves out the page cache: a loader reading a dataset through ordinary reads fills
//! the cache (3.6 GiB of a 4.4 GiB usage, measured in a `--memory 6g` container), which the
//! kernel gives back under pressure; a cache squeezed by a limit is `container_memory_limit`'s
//! subject. Doctor; the alert for sustained growth is `cpu_memory_leak`.
use crate::health::check::{level, Checks, Status, Window};
use crate::health::doctor_config::Levels;
use crate::health::trend::Series;
use crate::model::WorkloadKind;
use crate::units::ByteSize;
use std::collections::BTreeMap;

pub const NAME: &str = "container_memory";

/// Doctor's levels for a container's own memory (page cache left out).
pub const DOCTOR: Levels<ByteSize> = Levels {
    ok: ByteSize(2 * ByteSize::GIB),
    risk: ByteSize(3 * ByteSize::GIB),
};

/// Own memory at this share of the container's limit: the OOM killer is near.
const NEAR_LIMIT: f64 = 0.9;

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let c = window.config;
    // Containers, and other workloads holding a GPU: (name, memory over the window).
    let mut series: BTreeMap<String, (String, Series)> = BTreeMap::new();
    let mut cache: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut limits: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for s in window.snaps {
        for w in window.workloads(s) {
            if w.kind == WorkloadKind::Host || (w.container.is_none() && w.gpu.processes == 0) {
                continue;
            }
            if let Some(m) = w.memory {
                series
                    .entry(w.id.to_string())
                    .or_insert_with(|| (w.name.clone(), Series::default()))
                    .1
                    .push(
                        s.monotonic_ms as f64 / 1000.0,
                        m.own_or_usage_bytes() as f64,
                        f64::INFINITY,
                    );
                cache.insert(w.id.to_string(), m.page_cache_bytes);
                limits.insert(w.id.to_string(), m.limit_bytes);
            }
        }
    }
    for (id, (name, s)) in &series {
        let Some(now) = s.last() else { continue };
        let rising = s.fit().is_some_and(|f| f.slope > 0.0 && f.r_squared >= 0.8);
        let limit = limits.get(id).copied().flatten();
        let near_limit = limit.is_some_and(|l| now >= NEAR_LIMIT * l as f64);
        let status = if near_limit {
            Status::Risk
        } else if rising {
            level(
                now,
                c.container_memory_ok.0 as f64,
                c.container_memory_risk.0 as f64,
            )
        } else {
            Status::Ok
        };
        out.add(
            NAME,
            name.clone(),
            status,
            format!(
                "{}{}{}{}",
                ByteSize(now as u64),
                match cache.get(id).copied().flatten() {
                    Some(c) => format!(" own (page cache {} more)", ByteSize(c)),
                    None => String::new(),
                },
                match limit {
                    Some(l) => format!(" of its {} limit", ByteSize(l)),
                    None => String::new(),
                },
                if rising { ", rising" } else { "" },
            ),
            format!(
                "rising: warning > {}, risk > {}; risk at {:.0} % of its limit",
                c.container_memory_ok,
                c.container_memory_risk,
                NEAR_LIMIT * 100.0
            ),
            "Host memory grows: check Dataset.__getitem__ for large objects kept per sample and \
             caches without bounds.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_checks;
    use crate::model::test_support::{container, snapshot};
    use crate::model::MemoryUsage;

    fn gib(g: f64) -> u64 {
        (g * (1u64 << 30) as f64) as u64
    }

    /// Rounds of (usage, page cache, shmem) in GiB; no `memory.stat` when the cache is NaN.
    fn rows_with_cache(rounds: &[(f64, f64, f64)]) -> Vec<(String, String, Status)> {
        let snaps: Vec<_> = rounds
            .iter()
            .enumerate()
            .map(|(i, &(usage, cache, shmem))| {
                let mut w = container("loader");
                let stat = (!cache.is_nan()).then(|| (gib(cache), gib(shmem)));
                w.memory = Some(MemoryUsage::new(gib(usage), None, stat));
                snapshot(i as u64 * 1000, vec![], vec![w])
            })
            .collect();
        doctor_checks(examine, &snaps)
            .0
            .into_iter()
            .map(|c| (c.subject, c.value, c.status))
            .collect()
    }

    fn rows(gib: &[f64]) -> Vec<(String, Status)> {
        let rounds: Vec<_> = gib.iter().map(|g| (*g, f64::NAN, 0.0)).collect();
        rows_with_cache(&rounds)
            .into_iter()
            .map(|(s, _, st)| (s, st))
            .collect()
    }

    #[test]
    fn a_growing_page_cache_is_not_the_jobs_memory() {
        // The `--memory 6g` loader: usage 1.0 → 4.4 GiB, 3.6 GiB of it page cache at the end.
        let rounds = [
            (1.0, 0.2, 0.0),
            (2.2, 1.4, 0.0),
            (3.3, 2.5, 0.0),
            (4.4, 3.6, 0.0),
        ];
        let r = rows_with_cache(&rounds);
        assert_eq!(r[0].2, Status::Ok, "{r:?}");
        assert_eq!(r[0].1, "819 MiB own (page cache 3.6 GiB more)");
        // /dev/shm is the job's own memory, though the kernel counts it as cache.
        let rounds = [
            (3.1, 3.0, 3.0),
            (3.3, 3.2, 3.2),
            (3.5, 3.4, 3.4),
            (3.7, 3.6, 3.6),
        ];
        assert_eq!(rows_with_cache(&rounds)[0].2, Status::Risk);
    }

    /// Size alone is no finding (a trainer holding 10 GiB flat); rising above each level is,
    /// and so is own memory near the container's limit, flat or not.
    #[test]
    fn rising_past_each_level_or_near_the_limit_is_a_finding_size_alone_not() {
        assert_eq!(rows(&[1.0, 1.5, 1.9])[0].1, Status::Ok);
        assert_eq!(rows(&[10.0, 10.0, 10.0])[0].1, Status::Ok, "high, flat");
        assert_eq!(
            rows(&[2.5, 2.6, 2.7])[0].1,
            Status::Warning,
            "rising, below risk"
        );
        assert_eq!(rows(&[3.1, 3.3, 3.5, 3.7])[0].1, Status::Risk);
        assert_eq!(rows(&[3.5])[0].0, "loader");
        // Under a 4 GiB limit: 3.5 GiB flat is 87.5 %, 3.7 GiB 92.5 %.
        let limited = |g: f64| {
            let mut w = container("loader");
            w.memory = Some(MemoryUsage::new(gib(g), Some(gib(4.0)), None));
            let snaps = vec![snapshot(0, vec![], vec![w])];
            let c = doctor_checks(examine, &snaps).0.remove(0);
            (c.status, c.value)
        };
        assert_eq!(limited(3.5).0, Status::Ok);
        let (status, value) = limited(3.7);
        assert_eq!(status, Status::Risk);
        assert_eq!(value, "3.7 GiB of its 4.0 GiB limit");
    }
}
