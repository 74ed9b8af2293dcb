//! `container_memory`: a container's host memory high, a risk only while it also rises steadily
//! (a fit over the window), as the monitoring article watches psutil's RSS. Doctor; the alert
//! for sustained growth is `cpu_memory_leak`.
use crate::health::check::{level, Checks, Status, Window};
use crate::health::trend::Series;
use crate::model::WorkloadKind;
use crate::units::ByteSize;
use std::collections::BTreeMap;

pub const NAME: &str = "container_memory";

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let c = window.config;
    // Containers, and other workloads holding a GPU: (name, memory over the window).
    let mut series: BTreeMap<String, (String, Series)> = BTreeMap::new();
    for s in window.snaps {
        for w in &s.workloads {
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
                        m.usage_bytes as f64,
                        f64::INFINITY,
                    );
            }
        }
    }
    for (name, s) in series.values() {
        let Some(now) = s.last() else { continue };
        let rising = s.fit().is_some_and(|f| f.slope > 0.0 && f.r_squared >= 0.8);
        let status = match level(
            now,
            c.container_memory_ok.0 as f64,
            c.container_memory_risk.0 as f64,
        ) {
            Status::Ok => Status::Ok,
            Status::Risk if rising => Status::Risk,
            _ => Status::Warning,
        };
        out.add(
            NAME,
            name.clone(),
            status,
            format!(
                "{}{}",
                ByteSize(now as u64),
                if rising { ", rising" } else { "" }
            ),
            format!(
                "ok ≤ {}, risk > {} and rising",
                c.container_memory_ok, c.container_memory_risk
            ),
            "Host memory grows: check Dataset.__getitem__ for large objects kept per sample and \
             caches without bounds.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_rows;
    use crate::model::test_support::{container, snapshot};
    use crate::model::MemoryUsage;

    fn rows(gib: &[f64]) -> Vec<(String, Status)> {
        let snaps: Vec<_> = gib
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut w = container("loader");
                w.memory = Some(MemoryUsage {
                    usage_bytes: (g * (1u64 << 30) as f64) as u64,
                    limit_bytes: None,
                    page_cache_bytes: None,
                });
                snapshot(i as u64 * 1000, vec![], vec![w])
            })
            .collect();
        doctor_rows(examine, &snaps)
    }

    #[test]
    fn high_and_rising_is_a_risk_high_alone_a_warning() {
        assert_eq!(rows(&[1.0, 1.5, 1.9])[0].1, Status::Ok);
        assert_eq!(rows(&[3.5, 3.5, 3.5])[0].1, Status::Warning, "high, flat");
        assert_eq!(
            rows(&[2.5, 2.6, 2.7])[0].1,
            Status::Warning,
            "rising, below risk"
        );
        assert_eq!(rows(&[3.1, 3.3, 3.5, 3.7])[0].1, Status::Risk);
        assert_eq!(rows(&[3.5])[0].0, "loader");
    }
}
