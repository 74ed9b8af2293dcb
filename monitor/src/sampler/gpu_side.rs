//! The GPU side of the rounds: the NVML source (opened again when it failed or the driver's GPUs
//! changed), and the rounds that wait for its utilisation series, completed once the series
//! covers them.
use super::gpu_open::{Due, GpuOpener};
use super::pending::{Completion, Fetched, PendingRound};
use crate::heartbeat::{Heartbeat, Step};
use crate::model::{DeviceReading, Snapshot, SourceError, SourceState};
use crate::sources::gpu::GpuSource;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct GpuSide {
    gpu: Result<GpuSource, SourceError>,
    /// Opens NVML, again when it failed or the driver's GPUs changed.
    opener: GpuOpener,
    pending: VecDeque<PendingRound>,
    fetched: Fetched,
    series_interval: Duration,
    last_fetch: Option<Instant>,
    heartbeat: Arc<Heartbeat>,
}

/// What tending the source did.
pub(super) struct Tended {
    /// The rounds completed on the old source before it was opened again.
    pub done: Vec<Snapshot>,
    /// Whether it was opened (again) in this call.
    pub opened: bool,
}

impl GpuSide {
    pub(super) fn new(
        gpu: Result<GpuSource, SourceError>,
        opener: GpuOpener,
        series_interval: Duration,
        heartbeat: Arc<Heartbeat>,
    ) -> Self {
        Self {
            gpu,
            opener,
            pending: VecDeque::new(),
            fetched: Fetched::default(),
            series_interval,
            last_fetch: None,
            heartbeat,
        }
    }

    pub(super) fn driver_version(&self) -> Option<String> {
        self.gpu
            .as_ref()
            .ok()
            .and_then(|g| g.driver_version.clone())
    }

    pub(super) fn state(&self) -> SourceState {
        match &self.gpu {
            Ok(_) => SourceState::up(),
            Err(e) => SourceState::from_error(e.clone()),
        }
    }

    /// Opens NVML again when it failed and the back-off says so, or when the driver lists
    /// other GPUs than NVML was opened on. Before a re-open the pending rounds are completed
    /// on the old source (a GPU bound in front of the others renumbers them).
    pub(super) fn tend(&mut self, keep_from: Option<u64>) -> Tended {
        self.heartbeat.enter(Step::NvmlReadings);
        let done = match self.opener.due(&self.gpu) {
            Due::Nothing => {
                return Tended {
                    done: Vec::new(),
                    opened: false,
                }
            }
            Due::Retry => Vec::new(),
            Due::Reopen(change) => {
                tracing::warn!("the driver's GPUs changed ({change}): opening NVML again");
                self.flush(keep_from)
            }
        };
        let opened = self.opener.reopen(&mut self.gpu);
        Tended { done, opened }
    }

    /// The round's readings of every GPU, and how long NVML took; none without NVML.
    pub(super) fn readings(&mut self) -> (Vec<DeviceReading>, Option<f64>) {
        self.heartbeat.enter(Step::NvmlReadings);
        let started = Instant::now();
        match &mut self.gpu {
            Ok(g) => (g.collect(), Some(started.elapsed().as_secs_f64())),
            Err(_) => (Vec::new(), None),
        }
    }

    /// The next round asks the driver for GPU `index`'s process lists again.
    pub(super) fn relist(&mut self, index: u32) {
        if let Ok(g) = &mut self.gpu {
            g.relist(index);
        }
    }

    /// Holds a round until the series covers it; fetches the series when it is due. Returns
    /// the rounds now complete, oldest first. `keep_from`: where the next round's window starts.
    pub(super) fn hold(&mut self, p: PendingRound, keep_from: Option<u64>) -> Vec<Snapshot> {
        self.pending.push_back(p);
        let due = self
            .last_fetch
            .is_none_or(|t| t.elapsed() >= self.series_interval);
        if due {
            self.fetch();
        }
        self.complete(false, keep_from)
    }

    /// Fetches the series now and completes every pending round, waiting up to one sample
    /// period for the series to reach the end of the newest window.
    pub(super) fn flush(&mut self, keep_from: Option<u64>) -> Vec<Snapshot> {
        if let (Some(end), Ok(g)) = (self.pending.back().and_then(|p| p.window_us), &self.gpu) {
            let reach = |g: &GpuSource, snap: &Snapshot| {
                snap.gpus
                    .iter()
                    .filter(|x| g.has_series(x.device.index))
                    .all(|x| {
                        g.covered_through(x.device.index)
                            .is_some_and(|t| t >= end.1)
                    })
            };
            let newest = self.pending.back().map(|p| &p.snapshot);
            if newest.is_some_and(|s| !reach(g, s)) {
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        self.fetch();
        self.complete(true, keep_from)
    }

    /// Fetches the GPU series, GPM and, for the GPUs whose split in a pending round may need it,
    /// the driver's per-process split.
    fn fetch(&mut self) {
        self.heartbeat.enter(Step::NvmlSeries);
        self.last_fetch = Some(Instant::now());
        let Ok(g) = &mut self.gpu else { return };
        let mut shared: Vec<u32> = Vec::new();
        for p in &self.pending {
            for i in &p.driver_split_gpus {
                if !shared.contains(i) {
                    shared.push(*i);
                }
            }
        }
        let started = Instant::now();
        let fetches = g.fetch(super::now_unix_us() / 1000, &shared);
        if let Some(p) = self.pending.back_mut() {
            p.snapshot.series_fetch_seconds = Some(started.elapsed().as_secs_f64());
        }
        self.fetched.add(fetches);
    }

    /// Completes the pending rounds the series covers, oldest first; all of them if `force`,
    /// or any held longer than twice the series interval (a GPU whose series stalls must not
    /// hold the others back: those rounds say what their series covered).
    fn complete(&mut self, force: bool, keep_from: Option<u64>) -> Vec<Snapshot> {
        self.heartbeat.enter(Step::Publishing);
        let hold = self.series_interval * 2 + Duration::from_secs(5);
        let mut out = Vec::new();
        while let Some(front) = self.pending.front() {
            let ready = force
                || front.taken.elapsed() > hold
                || match (front.window_us, &self.gpu) {
                    (None, _) | (_, Err(_)) => true,
                    (Some((_, end)), Ok(g)) => front.snapshot.gpus.iter().all(|x| {
                        x.device.lost
                            || !g.has_series(x.device.index)
                            || g.covered_through(x.device.index).is_some_and(|t| t >= end)
                    }),
                };
            if !ready {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            out.push(
                Completion {
                    gpu: self.gpu.as_ref().ok(),
                    fetched: &self.fetched,
                }
                .complete(p),
            );
        }
        // Keep the series back to where the oldest window still to be answered starts: the
        // oldest pending round's, or, with none pending, the next round's (the latest round).
        let keep_from = match self.pending.front() {
            Some(p) => p.window_us.map(|w| w.0),
            None => keep_from,
        };
        if let (Ok(g), Some(t)) = (&mut self.gpu, keep_from) {
            g.forget_before(t);
        }
        out
    }
}
