//! Keeping the GPU source on what the driver has now. NVML that failed to open is tried again
//! with back-off (a driver still loading at boot, a library installed later). NVML that was
//! opened on another set of GPUs than the driver lists now (a GPU bound or unbound since, a
//! driver reloaded while NVML was closed) is shut down and opened again: NVML enumerates only
//! when it is initialised, so nothing else would show a GPU that appeared.
use crate::events::{EventCounters, EventKind, NvmlCallFailed};
use crate::model::SourceError;
use crate::sources::gpu::driver_list::ListChange;
use crate::sources::gpu::{GpuSource, GpuSourceConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first retry of an NVML that failed to open comes after this; each failure doubles it,
/// up to [`GPU_RETRY_MAX`]. A driver still loading at boot answers within seconds; one that
/// is missing costs a failed `dlopen` every five minutes.
pub const GPU_RETRY_FIRST: Duration = Duration::from_secs(2);
pub const GPU_RETRY_MAX: Duration = Duration::from_secs(300);
/// How often the driver's list of GPUs is compared with NVML's (one directory listing).
pub const DRIVER_LIST_CHECK_EVERY: Duration = Duration::from_secs(5);

/// What the GPU source needs before a round.
#[derive(Debug, PartialEq)]
pub(super) enum Due {
    Nothing,
    /// NVML is not open and the back-off has run out.
    Retry,
    /// NVML is open on another set of GPUs than the driver lists.
    Reopen(ListChange),
}

/// Opens the GPU source, and says when to open it again.
pub(super) struct GpuOpener {
    /// `None`: the GPU source is off.
    config: Option<GpuSourceConfig>,
    events: Arc<EventCounters>,
    /// While NVML is not open: the delay before the next try, and when that is.
    retry: Option<(Duration, Instant)>,
    next_list_check: Instant,
}

impl GpuOpener {
    /// The opener and the source as its first try left it.
    pub(super) fn open(
        config: Option<&GpuSourceConfig>,
        events: Arc<EventCounters>,
    ) -> (Self, Result<GpuSource, SourceError>) {
        let mut opener = Self {
            config: config.cloned(),
            events,
            retry: None,
            next_list_check: Instant::now() + DRIVER_LIST_CHECK_EVERY,
        };
        let gpu = match &opener.config {
            None => Err(SourceError::disabled("disabled")),
            Some(c) => GpuSource::open(c, opener.events.clone()).map_err(SourceError::failed),
        };
        if let (Err(e), true) = (&gpu, opener.config.is_some()) {
            tracing::warn!(
                "GPU source unavailable: {e}; listing containers without GPU data, and trying \
                 again in {GPU_RETRY_FIRST:?}"
            );
            opener.retry = Some((GPU_RETRY_FIRST, Instant::now() + GPU_RETRY_FIRST));
        }
        (opener, gpu)
    }

    /// What `gpu` needs now.
    pub(super) fn due(&mut self, gpu: &Result<GpuSource, SourceError>) -> Due {
        let now = Instant::now();
        if let Some((_, next)) = self.retry {
            return if now >= next {
                Due::Retry
            } else {
                Due::Nothing
            };
        }
        let Ok(g) = gpu else {
            return Due::Nothing; // off
        };
        if now < self.next_list_check {
            return Due::Nothing;
        }
        self.next_list_check = now + DRIVER_LIST_CHECK_EVERY;
        g.driver_list_change().map_or(Due::Nothing, Due::Reopen)
    }

    /// Opens the source (again) into `gpu`, the old one shut down first so that NVML
    /// enumerates afresh (its initialisations are counted: only the last shutdown closes it).
    /// A failure keeps the error in `gpu` and backs off. Returns whether it opened.
    pub(super) fn reopen(&mut self, gpu: &mut Result<GpuSource, SourceError>) -> bool {
        let Some(config) = &self.config else {
            return false;
        };
        if gpu.is_ok() {
            *gpu = Err(SourceError::failed("re-opening")); // drops the old source: nvmlShutdown
        }
        match GpuSource::open(config, self.events.clone()) {
            Ok(g) => {
                tracing::info!("GPU source up: {} GPU(s)", g.device_count());
                *gpu = Ok(g);
                self.retry = None;
                self.next_list_check = Instant::now() + DRIVER_LIST_CHECK_EVERY;
                true
            }
            Err(e) => {
                let delay = self
                    .retry
                    .map_or(GPU_RETRY_FIRST, |(d, _)| (d * 2).min(GPU_RETRY_MAX));
                self.retry = Some((delay, Instant::now() + delay));
                let error = SourceError::failed(&e);
                if gpu.as_ref().err() != Some(&error) {
                    self.events.emit(NvmlCallFailed::library("opening", &error));
                    *gpu = Err(error);
                } else {
                    self.events.add(EventKind::NvmlCallFailed, 1);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nvml_that_cannot_load_is_retried_with_doubling_back_off() {
        let config = GpuSourceConfig {
            lib_path: Some("/nonexistent/libnvidia-ml.so".into()),
            ..GpuSourceConfig::default()
        };
        let events = Arc::new(EventCounters::default());
        let (mut opener, mut gpu) = GpuOpener::open(Some(&config), events.clone());
        assert!(gpu.is_err());
        assert_eq!(opener.due(&gpu), Due::Nothing, "not before the first delay");
        assert_eq!(opener.retry.map(|r| r.0), Some(GPU_RETRY_FIRST));
        assert!(!opener.reopen(&mut gpu));
        assert_eq!(opener.retry.map(|r| r.0), Some(GPU_RETRY_FIRST * 2));
        assert!(!opener.reopen(&mut gpu));
        assert_eq!(opener.retry.map(|r| r.0), Some(GPU_RETRY_FIRST * 4));
        assert_eq!(events.get(EventKind::NvmlCallFailed), 2);
    }

    #[test]
    fn a_source_turned_off_is_never_due() {
        let events = Arc::new(EventCounters::default());
        let (mut opener, mut gpu) = GpuOpener::open(None, events);
        assert_eq!(gpu.as_ref().err(), Some(&SourceError::disabled("disabled")));
        opener.next_list_check = Instant::now();
        assert_eq!(opener.due(&gpu), Due::Nothing);
        assert!(!opener.reopen(&mut gpu));
    }
}
