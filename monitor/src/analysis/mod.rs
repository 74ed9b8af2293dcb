//! The analysis: judges a round after the sampler has assembled it. Each GPU's energy is
//! charged to its holders ([`energy`]). Each workload gets its
//! verdict (why its GPU is idle, or that it is not; naming the container's configuration when
//! that is the cause; other workloads on its GPU when they are), its OOM headroom and, for a distributed job, the rank the others wait
//! for; the snapshot arrives
//! here with the facts only.
pub mod config_checks;
pub mod contention;
pub mod energy;
pub mod headroom;
pub mod straggler;
pub mod verdict;

use crate::model::Snapshot;
pub use headroom::HeadroomConfig;
pub use verdict::VerdictConfig;

/// The settings of every judgement, from the config file's `verdict:` and `headroom:`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnalysisConfig {
    pub verdict: VerdictConfig,
    pub headroom: HeadroomConfig,
}

/// Fills in each GPU's energy and its holders' parts, each workload's verdict and OOM headroom.
pub fn judge(snap: &mut Snapshot, config: &AnalysisConfig) {
    energy::charge(snap);
    let window = snap.window_seconds.filter(|w| *w > 0.0);
    let names = contention::names(&snap.workloads);
    let shared: Vec<_> = snap
        .workloads
        .iter()
        .map(|w| contention::contention(w, &names, &snap.gpus))
        .collect();
    for (w, shared) in snap.workloads.iter_mut().zip(shared) {
        let host = verdict::HostFacts {
            ebpf: &snap.sources.ebpf,
            cpus: snap.host.cpus,
        };
        w.verdict = verdict::assess(w, window, host, shared, &config.verdict);
        if let (Some(v), Some(c)) = (&mut w.verdict, &w.config) {
            config_checks::advise(v, c);
        }
        w.oom_headroom = headroom::oom_headroom(w, &snap.gpus, &config.headroom);
        w.straggler = straggler::straggler(w, &config.verdict);
    }
}
