//! Wiring: starts the Docker task on a small runtime and opens the sampler. Every command that
//! samples starts the agent the same way, and takes its rounds from [`Agent::round`]: the
//! sampler's assembly, then the analysis's judgement.
use crate::analysis::{self, AnalysisConfig};
use crate::events::EventCounters;
use crate::model::Snapshot;
use crate::sampler::{Sampler, SamplerConfig};
use crate::sources::docker::{self, DockerCache, DockerSourceConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Debug, Default)]
pub struct AgentConfig {
    pub sampler: SamplerConfig,
    /// `None` turns the Docker source off.
    pub docker: Option<DockerSourceConfig>,
    pub analysis: AnalysisConfig,
}

/// A running agent: the sampler plus the background tasks feeding its caches.
pub struct Agent {
    pub sampler: Sampler,
    pub events: Arc<EventCounters>,
    analysis: AnalysisConfig,
    shutdown: watch::Sender<bool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Agent {
    /// Starts the sources. Waits up to `docker_wait` for the Docker cache's first fill, so a
    /// one-shot snapshot sees the containers.
    pub fn start(config: &AgentConfig, docker_wait: Duration) -> std::io::Result<Self> {
        let events = Arc::new(EventCounters::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut runtime = None;
        let mut cache = None;
        if let Some(dc) = &config.docker {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("gpuwatch-docker")
                .enable_all()
                .build()?;
            let c = Arc::new(DockerCache::default());
            rt.spawn(docker::run(
                dc.clone(),
                c.clone(),
                events.clone(),
                shutdown_rx,
            ));
            if !c.wait_attempted(docker_wait) {
                tracing::warn!(
                    "Docker did not answer within {docker_wait:?}; containers may be missing names"
                );
            }
            let status = c.status();
            if !status.up {
                tracing::warn!(
                    "Docker source down: {}; identifying containers by cgroup only",
                    status.error.as_deref().unwrap_or("unknown")
                );
            }
            cache = Some(c);
            runtime = Some(rt);
        }
        let sampler = Sampler::new(&config.sampler, cache, events.clone());
        Ok(Self {
            sampler,
            events,
            analysis: config.analysis,
            shutdown,
            runtime,
        })
    }
}

impl Agent {
    /// Drops every capability the running agent no longer uses (see [`super::privileges`]),
    /// becoming `user` when one is given; logs what it kept.
    pub fn keep_only_needed_privileges(
        &self,
        user: Option<&super::privileges::Identity>,
    ) -> Result<u64, super::privileges::PrivilegeError> {
        let (bpf_maps, attach_later) = self.sampler.probe_use();
        let needs = super::privileges::Needs {
            bpf_maps,
            attach_later,
        };
        let kept = super::privileges::keep_only(needs, user)?;
        tracing::info!(
            user = user.map(|u| u.name.as_str()),
            "capabilities kept: {}",
            super::privileges::names(kept).join(", ")
        );
        Ok(kept)
    }

    /// One sampling round: the rounds it completed (see [`Sampler::round`]), judged.
    pub fn round(&mut self) -> Vec<Snapshot> {
        let heartbeat = self.sampler.heartbeat();
        heartbeat.round_begins();
        let mut snaps = self.sampler.round();
        self.judge(&mut snaps);
        heartbeat.round_ends();
        snaps
    }

    /// The rounds still held for the GPU series, completed with what it has, judged.
    pub fn flush(&mut self) -> Vec<Snapshot> {
        let heartbeat = self.sampler.heartbeat();
        heartbeat.round_begins();
        let mut snaps = self.sampler.flush();
        self.judge(&mut snaps);
        heartbeat.round_ends();
        snaps
    }

    fn judge(&self, snaps: &mut [Snapshot]) {
        for s in snaps {
            analysis::judge(s, &self.analysis);
        }
    }

    /// Sleeps until `until`; returns early with `false` when `stop` is set. Nothing is polled
    /// meanwhile: the GPU series is fetched in batches by the rounds themselves.
    pub fn wait_until(&self, until: std::time::Instant, stop: &AtomicBool) -> bool {
        loop {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            let now = std::time::Instant::now();
            if now >= until {
                return true;
            }
            // A signal sets `stop` without waking the sleep: look every second (each wake-up
            // costs the agent CPU; at the default 1-s interval this is one a round).
            std::thread::sleep((until - now).min(Duration::from_secs(1)));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}
