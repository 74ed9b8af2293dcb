//! `gpu_memory_leak` and `cpu_memory_leak`: sustained, near-linear memory growth of a container,
//! on its GPUs or on the host — a least-squares line over `window` with at least
//! `min_duration` of data, a slope of at least `min_growth_per_minute` and a fit of at least
//! `min_r_squared`, so a sawtooth of allocations that are freed again is no leak. Alert rules.
use crate::field_error::FieldError;
use crate::health::rule::{
    rule_config, Finding, Outcome, Outcomes, Rule, Severity, SnapshotView, MIB,
};
use crate::health::trend::Series;
use crate::model::{Workload, WorkloadId, WorkloadKind};
use crate::units::ByteSize;
use std::collections::HashMap;
use std::time::Duration;

pub const GPU_NAME: &str = "gpu_memory_leak";
pub const CPU_NAME: &str = "cpu_memory_leak";

rule_config! {
    /// Sustained, near-linear memory growth.
    Config {
        #[serde(with = "crate::units::duration")]
        window: Duration = Duration::from_secs(600),
        #[serde(with = "crate::units::duration")]
        min_duration: Duration = Duration::from_secs(300),
        min_growth_per_minute: ByteSize = ByteSize(64 * ByteSize::MIB),
        min_r_squared: f64 = 0.9,
    }
    for = Duration::ZERO, severity = Severity::Warning
}

impl Config {
    pub fn validate(&self) -> Result<(), FieldError> {
        if !(0.0..=1.0).contains(&self.min_r_squared) {
            return Err(FieldError::new("min_r_squared", "must be between 0 and 1"));
        }
        if self.min_duration > self.window || self.min_duration.is_zero() {
            return Err(FieldError::new(
                "min_duration",
                format!(
                    "must be more than 0 and at most the window ({})",
                    humantime::format_duration(self.window)
                ),
            ));
        }
        Ok(())
    }
}

/// Which memory a leak rule follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// The GPU memory of a container's processes (containers holding a GPU).
    Gpu,
    /// The memory of a workload's cgroup less its page cache (any container): a loader that
    /// reads a dataset fills the cache steadily, and that is no leak.
    Host,
}

/// A leak rule with its series per workload.
pub struct LeakRule {
    config: Config,
    memory: Memory,
    series: HashMap<WorkloadId, Series>,
}

impl LeakRule {
    pub fn new(config: &Config, memory: Memory) -> Self {
        Self {
            config: config.clone(),
            memory,
            series: HashMap::new(),
        }
    }

    /// The bytes this rule follows for `w`, where it applies.
    fn reading(&self, w: &Workload) -> Option<u64> {
        match self.memory {
            Memory::Gpu => (w.gpu.processes > 0 && !w.exited).then_some(w.gpu.memory_bytes),
            Memory::Host if w.kind == WorkloadKind::Host || w.exited => None,
            Memory::Host => w.memory.map(|m| m.own_or_usage_bytes()),
        }
    }
}

impl Rule for LeakRule {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        let t = round.seconds();
        let window = self.config.window.as_secs_f64();
        for w in &round.snap.workloads {
            let Some(bytes) = self.reading(w) else {
                continue;
            };
            let series = self.series.entry(w.id.clone()).or_default();
            series.push(t, bytes as f64, window);
            let outcome = leak_outcome(&self.config, series, &w.name, self.memory);
            out.push((w.id.to_string(), SnapshotView::workload_subject(w), outcome));
        }
        self.series.retain(|id, _| round.has_workload(id));
    }
}

fn leak_outcome(r: &Config, series: &Series, name: &str, memory: Memory) -> Outcome {
    let Some(fit) = series.fit() else {
        return Outcome::Unknown;
    };
    if fit.span < r.min_duration.as_secs_f64() {
        return Outcome::Unknown; // not enough history to tell a leak from a warm-up
    }
    let per_minute = fit.slope * 60.0;
    if per_minute < r.min_growth_per_minute.0 as f64 || fit.r_squared < r.min_r_squared {
        return Outcome::Clear;
    }
    let what = match memory {
        Memory::Gpu => "GPU memory",
        Memory::Host => "CPU memory",
    };
    Outcome::Breached(Finding {
        value: per_minute / MIB,
        threshold: r.min_growth_per_minute.0 as f64 / MIB,
        unit: "MiB/min",
        summary: format!(
            "{name}: {what} grows {:.0} MiB/min steadily over {:.0} s (R² {:.2}), now {:.0} MiB",
            per_minute / MIB,
            fit.span,
            fit.r_squared,
            series.last().unwrap_or(0.0) / MIB
        ),
        action: match memory {
            Memory::Gpu => {
                "Something keeps tensors alive across steps: look for losses or outputs kept \
                 without .item()/.detach(), growing caches, or callbacks holding graphs."
            }
            Memory::Host => {
                "The process keeps growing on the host: check Dataset.__getitem__ for objects \
                 kept per sample, caches without bounds, and DataLoader workers copying the \
                 dataset."
            }
        }
        .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::evaluate;
    use crate::model::test_support::{container, snapshot};
    use crate::model::MemoryUsage;

    fn short() -> Config {
        Config {
            window: Duration::from_secs(60),
            min_duration: Duration::from_secs(20),
            ..Config::default()
        }
    }

    /// 40 one-second rounds of `memory(t)`; the last outcome. Unknown for the first 20 s.
    fn run(rule: &mut LeakRule, memory: &dyn Fn(u64) -> u64) -> Outcome {
        run_with_cache(rule, memory, &|_| None)
    }

    /// As `run`, with the host usage's page cache `cache(t)` when known.
    fn run_with_cache(
        rule: &mut LeakRule,
        memory: &dyn Fn(u64) -> u64,
        cache: &dyn Fn(u64) -> Option<u64>,
    ) -> Outcome {
        let mut last = Outcome::Unknown;
        for t in 0..40u64 {
            let mut w = container("train");
            w.gpu.processes = 1;
            w.gpu.memory_bytes = memory(t);
            w.memory = Some(MemoryUsage::new(memory(t), None, cache(t).map(|c| (c, 0))));
            let out = evaluate(rule, &snapshot(t * 1000, vec![], vec![w]));
            assert_eq!(out.len(), 1);
            last = out[0].2.clone();
            if t < 20 {
                assert_eq!(last, Outcome::Unknown, "too little history at {t} s");
            }
        }
        last
    }

    #[test]
    fn a_sawtooth_is_no_leak_and_a_ramp_is() {
        let mut rule = LeakRule::new(&short(), Memory::Gpu);
        // Allocations that are freed again every other second.
        assert_eq!(
            run(&mut rule, &|t| (4 << 30) + (t % 2) * (2 << 30)),
            Outcome::Clear
        );
        // 2 MiB/s = 120 MiB/min, steady.
        let mut rule = LeakRule::new(&short(), Memory::Gpu);
        let Outcome::Breached(f) = run(&mut rule, &|t| (4 << 30) + t * (2 << 20)) else {
            panic!("a steady ramp is a leak");
        };
        assert!((f.value - 120.0).abs() < 0.5, "{f:?}");
        assert!(
            f.summary.starts_with("train: GPU memory grows 120 MiB/min"),
            "{}",
            f.summary
        );
        // Slower than the threshold (64 MiB/min): 30 MiB/min is growth, not a leak.
        let mut rule = LeakRule::new(&short(), Memory::Host);
        assert_eq!(
            run(&mut rule, &|t| (4 << 30) + t * (512 << 10)),
            Outcome::Clear
        );
        let mut rule = LeakRule::new(&short(), Memory::Host);
        let Outcome::Breached(f) = run(&mut rule, &|t| (4 << 30) + t * (2 << 20)) else {
            panic!("a host ramp");
        };
        assert!(f.summary.contains("CPU memory"), "{}", f.summary);
        assert!(f.action.contains("Dataset.__getitem__"), "{}", f.action);
    }

    #[test]
    fn a_page_cache_that_fills_is_no_host_leak() {
        // A loader reading its dataset: the usage climbs 2 MiB/s, all of it page cache.
        let ramp = |t: u64| (1 << 30) + t * (2 << 20);
        let mut rule = LeakRule::new(&short(), Memory::Host);
        assert_eq!(
            run_with_cache(&mut rule, &ramp, &|t| Some(t * (2 << 20))),
            Outcome::Clear
        );
        // The same usage with the cache flat is the job's own memory growing.
        let mut rule = LeakRule::new(&short(), Memory::Host);
        assert!(matches!(
            run_with_cache(&mut rule, &ramp, &|_| Some(64 << 20)),
            Outcome::Breached(_)
        ));
    }

    #[test]
    fn each_memory_has_its_subjects_and_a_gone_workload_is_forgotten() {
        let mut host_only = container("loader");
        host_only.memory = Some(MemoryUsage {
            usage_bytes: 1 << 30,
            limit_bytes: None,
            page_cache_bytes: None,
            own_bytes: None,
        });
        let snap = snapshot(0, vec![], vec![host_only]);
        // Not on a GPU: no GPU leak to follow; its host memory is followed.
        assert!(evaluate(&mut LeakRule::new(&short(), Memory::Gpu), &snap).is_empty());
        let mut rule = LeakRule::new(&short(), Memory::Host);
        assert_eq!(evaluate(&mut rule, &snap).len(), 1);
        assert_eq!(rule.series.len(), 1);
        evaluate(&mut rule, &snapshot(1000, vec![], vec![]));
        assert!(
            rule.series.is_empty(),
            "the series of a gone workload is dropped"
        );
        let mut exited = snap.clone();
        exited.workloads[0].exited = true;
        assert!(evaluate(&mut LeakRule::new(&short(), Memory::Host), &exited).is_empty());
    }

    #[test]
    fn validation_names_the_field() {
        let bad = Config {
            min_r_squared: 1.5,
            ..short()
        };
        assert_eq!(bad.validate().unwrap_err().field, "min_r_squared");
        let bad = Config {
            min_duration: Duration::from_secs(120),
            ..short()
        };
        assert_eq!(bad.validate().unwrap_err().field, "min_duration");
    }
}
