//! `gpu_allocated_idle`: a GPU given to a container (`--gpus`, `--device`,
//! `NVIDIA_VISIBLE_DEVICES` under the NVIDIA runtime) on which none of its processes holds
//! memory or a context — the GPU reserved and never used. An alert rule, one subject per
//! container and GPU; doctor's check of the same name is among the container's configuration
//! checks ([`super::container_config`]).
use crate::health::rule::{
    rule_config, ContainerRef, Finding, GpuRef, Outcome, Outcomes, Rule, Severity, SnapshotView,
    Subject,
};
use std::time::Duration;

pub const NAME: &str = "gpu_allocated_idle";

rule_config! {
    /// A GPU given to a container that none of its processes uses.
    Config {}
    for = Duration::from_secs(600), severity = Severity::Warning
}

impl Rule for Config {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        let snap = round.snap;
        for w in snap.workloads.iter().filter(|w| !w.exited) {
            let Some(a) = w.config.as_ref().and_then(|c| c.gpus.as_ref()) else {
                continue;
            };
            let declared = a.applied_declarations();
            for g in &a.gpus {
                let key = g
                    .uuid
                    .clone()
                    .unwrap_or_else(|| format!("index-{}", g.index));
                // Without NVML this round, use cannot be told.
                let outcome = if !snap.sources.nvml.up {
                    Outcome::Unknown
                } else if g.in_use {
                    Outcome::Clear
                } else {
                    Outcome::Breached(Finding {
                        value: 0.0,
                        threshold: 0.0,
                        unit: "processes",
                        summary: format!(
                            "GPU {} is given to {} ({}) and none of its processes uses it",
                            g.index,
                            w.name,
                            declared.join(", ")
                        ),
                        action: format!(
                            "Free GPU {} for other jobs: leave it out of the container's --gpus \
                             / NVIDIA_VISIBLE_DEVICES, or check why the job does not use it \
                             (CUDA_VISIBLE_DEVICES inside, a single-GPU script given several).",
                            g.index
                        ),
                    })
                };
                let subject = Subject {
                    gpu: Some(GpuRef {
                        index: g.index,
                        uuid: g.uuid.clone(),
                    }),
                    container: Some(ContainerRef::of(w)),
                    pid: None,
                };
                out.push((format!("{}/{key}", w.id), subject, outcome));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::evaluate;
    use crate::model::test_support::{container, snapshot};
    use crate::model::{AllocatedGpu, ContainerConfig, GpuAllocation, Snapshot};

    fn given(in_use: bool) -> Snapshot {
        let mut w = container("trainer");
        w.config = Some(ContainerConfig {
            gpus: Some(GpuAllocation {
                claims: Vec::new(),
                gpus: vec![AllocatedGpu {
                    index: 1,
                    uuid: Some("GPU-1".into()),
                    in_use,
                    memory_bytes: 0,
                }],
                unresolved: Vec::new(),
            }),
            ..Default::default()
        });
        snapshot(0, Vec::new(), vec![w])
    }

    #[test]
    fn an_unused_given_gpu_breaches_and_a_used_one_clears() {
        let r = Config::default();
        assert_eq!(r.for_, Duration::from_secs(600));
        let idle = evaluate(&mut r.clone(), &given(false));
        assert_eq!(idle.len(), 1);
        let Outcome::Breached(f) = &idle[0].2 else {
            panic!("{:?}", idle[0].2)
        };
        assert!(
            f.summary.contains("GPU 1 is given to trainer"),
            "{}",
            f.summary
        );
        assert_eq!(idle[0].1.gpu.as_ref().unwrap().index, 1);
        assert!(idle[0].0.ends_with("/GPU-1"), "{}", idle[0].0);
        assert_eq!(evaluate(&mut r.clone(), &given(true))[0].2, Outcome::Clear);
        let mut down = given(false);
        down.sources.nvml = crate::model::SourceState::down("no NVML");
        assert_eq!(evaluate(&mut r.clone(), &down)[0].2, Outcome::Unknown);
        let mut exited = given(false);
        exited.workloads[0].exited = true;
        assert!(evaluate(&mut r.clone(), &exited).is_empty());
    }
}
