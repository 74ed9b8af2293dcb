//! When an adaptive probe set is wanted: attached while published rounds show a workload that
//! needs its evidence, and for a linger after the last one did. The read programs
//! (`io_tracing`) and the CUDA driver probes (`cuda`) each keep one.
use serde::Deserialize;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TracingMode {
    /// Attached while a workload needs the evidence.
    #[default]
    Adaptive,
    /// Attached all the time.
    Always,
    /// Never attached.
    Off,
}

impl TracingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adaptive => "adaptive",
            Self::Always => "always",
            Self::Off => "off",
        }
    }

    /// For a one-shot window (`snapshot`, `doctor`): no earlier round can ask for the evidence,
    /// so adaptive tracing traces from the start (for seconds, at a cost nobody pays for long).
    pub fn for_one_shot(self) -> Self {
        match self {
            Self::Adaptive => Self::Always,
            m => m,
        }
    }
}

/// Remembers when the evidence was last needed, and why.
#[derive(Debug)]
pub struct Demand {
    mode: TracingMode,
    linger: Duration,
    last_needed: Option<Instant>,
    pub reason: Option<String>,
}

impl Demand {
    pub fn new(mode: TracingMode, linger: Duration) -> Self {
        Self {
            mode,
            linger,
            last_needed: None,
            reason: None,
        }
    }

    pub fn mode(&self) -> TracingMode {
        self.mode
    }

    /// A published round needed the evidence (`why`), or did not (`None`).
    pub fn note(&mut self, why: Option<String>, now: Instant) {
        if let Some(why) = why {
            self.last_needed = Some(now);
            self.reason = Some(why);
        }
    }

    /// Whether the probes should be attached now.
    pub fn wanted(&mut self, now: Instant) -> bool {
        match self.mode {
            TracingMode::Always => true,
            TracingMode::Off => false,
            TracingMode::Adaptive => {
                let on = self
                    .last_needed
                    .is_some_and(|t| now.duration_since(t) <= self.linger);
                if !on {
                    self.reason = None;
                }
                on
            }
        }
    }
}

/// The linger a probe set keeps: `linger`, but at least two series intervals. Rounds are
/// published in batches, once the GPU's utilisation series covers them (every
/// `series_interval`); a shorter linger ran out between two batches that both needed the
/// evidence, and the programs came and went while a GPU idled (measured on an H200 with a 5-s
/// linger and the 10-s series: read evidence in 3 of 17 rows of an I/O-bound phase).
pub fn effective_linger(linger: Duration, series_interval: Duration) -> Duration {
    linger.max(series_interval.saturating_mul(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linger_outlasts_the_gap_between_two_batches_of_published_rounds() {
        let series = Duration::from_secs(10);
        assert_eq!(
            effective_linger(Duration::from_secs(5), series),
            Duration::from_secs(20)
        );
        assert_eq!(
            effective_linger(Duration::from_secs(300), series),
            Duration::from_secs(300)
        );
        // `top` fetches every round: a 1-s series leaves a short linger as it is.
        assert_eq!(
            effective_linger(Duration::from_secs(5), Duration::from_secs(1)),
            Duration::from_secs(5)
        );
    }
}
