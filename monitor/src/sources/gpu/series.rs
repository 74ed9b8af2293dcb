//! One GPU's utilisation series: the driver's device samples (`nvmlDeviceGetSamples` with
//! `NVML_GPU_UTILIZATION_SAMPLES`), each the share of its sample period (200 ms on an H200) in
//! which a kernel ran, kept long enough to answer for any window still pending.
//!
//! The series is complete: every period has a sample, idle ones at 0 (on the H200 five a
//! second, 71 kept by the driver over 14 s). So the busy share of a window is the mean of the
//! piecewise-constant series over it: a sample covers the time since the one before. The
//! agent fetches the series in batches (one call costs ~2 ms of CPU whatever it returns) and
//! asks afterwards for each round's window.
use std::collections::VecDeque;

/// The period assumed for the first sample, before a gap has been seen (the H200's).
pub const DEFAULT_PERIOD_US: u64 = 200_000;
/// A gap longer than this between two samples is a hole in the series (the driver's history
/// overflowed, or the GPU stopped answering), not one long period.
const MAX_PERIOD_US: u64 = 1_000_000;

/// A window's busy share and how much of the window the series covered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowBusy {
    /// Mean utilisation over the covered part of the window, 0..=1.
    pub fraction: f64,
    /// Share of the window the series covers, 0..=1.
    pub coverage: f64,
}

#[derive(Debug, Default)]
pub struct UtilSeries {
    /// (end of the sample's period µs since the epoch, utilisation percent), oldest first.
    samples: VecDeque<(u64, u32)>,
    /// The last gap between consecutive samples: the driver's period.
    period_us: Option<u64>,
}

impl UtilSeries {
    /// Appends samples newer than those held (older or repeated ones are ignored).
    pub fn extend(&mut self, new: impl IntoIterator<Item = (u64, u32)>) {
        for (ts, v) in new {
            let last = self.samples.back().map(|s| s.0);
            if last.is_some_and(|l| ts <= l) {
                continue;
            }
            if let Some(l) = last {
                let gap = ts - l;
                if gap <= MAX_PERIOD_US {
                    self.period_us = Some(gap);
                }
            }
            self.samples.push_back((ts, v.min(100)));
        }
    }

    /// The end of the newest sample's period: the series is known up to here.
    pub fn covered_through(&self) -> Option<u64> {
        self.samples.back().map(|s| s.0)
    }

    fn period(&self) -> u64 {
        self.period_us.unwrap_or(DEFAULT_PERIOD_US)
    }

    /// The busy share of the window (a, b] (µs since the epoch); `None` when no sample
    /// covers any of it.
    pub fn busy(&self, a: u64, b: u64) -> Option<WindowBusy> {
        if b <= a {
            return None;
        }
        let (mut busy, mut covered) = (0.0f64, 0u64);
        let mut prev: Option<u64> = None;
        for &(ts, v) in &self.samples {
            let start = match prev {
                Some(p) if ts - p <= MAX_PERIOD_US => p,
                _ => ts.saturating_sub(self.period()),
            };
            prev = Some(ts);
            if ts <= a {
                continue;
            }
            if start >= b {
                break;
            }
            let overlap = ts.min(b) - start.max(a);
            covered += overlap;
            busy += f64::from(v) / 100.0 * overlap as f64;
        }
        (covered > 0).then(|| WindowBusy {
            fraction: busy / covered as f64,
            coverage: covered as f64 / (b - a) as f64,
        })
    }

    /// Forgets samples that end before `t` (no pending window reaches back that far).
    pub fn forget_before(&mut self, t: u64) {
        // Keep one sample ending before `t`: it marks where the next one's period starts.
        while self.samples.len() > 1 && self.samples[1].0 <= t {
            self.samples.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 200_000;
    const T0: u64 = 1_800_000_000_000_000;

    fn series(values: &[u32]) -> UtilSeries {
        let mut s = UtilSeries::default();
        s.extend(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| (T0 + (i as u64 + 1) * P, *v)),
        );
        s
    }

    #[test]
    fn a_window_is_the_mean_of_the_samples_it_covers() {
        let s = series(&[100, 100, 0, 0, 50, 50, 100, 100, 100, 100]);
        let w = s.busy(T0, T0 + 1_000_000).unwrap();
        assert!((w.fraction - 0.5).abs() < 1e-9, "{w:?}");
        assert_eq!(w.coverage, 1.0);
        // A window that cuts a period in half takes half of it.
        let w = s.busy(T0 + P / 2, T0 + 3 * P / 2).unwrap();
        assert!((w.fraction - 1.0).abs() < 1e-9, "{w:?}");
        let w = s.busy(T0 + 3 * P / 2, T0 + 5 * P / 2).unwrap();
        assert!((w.fraction - 0.5).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn coverage_says_what_the_series_does_not_reach() {
        let s = series(&[80, 80, 80, 80]);
        // 0.8 s of samples in a 1-s window: the mean is over what is covered.
        let w = s.busy(T0, T0 + 1_000_000).unwrap();
        assert!((w.fraction - 0.8).abs() < 1e-9);
        assert!((w.coverage - 0.8).abs() < 1e-9);
        assert_eq!(s.covered_through(), Some(T0 + 4 * P));
        assert!(
            s.busy(T0 + 5 * P, T0 + 9 * P).is_none(),
            "beyond the series"
        );
        // A hole (samples lost to the driver's short history) is not covered.
        let mut s = series(&[100, 100]);
        s.extend([(T0 + 20 * P, 100)]);
        let w = s.busy(T0, T0 + 20 * P).unwrap();
        assert!((w.coverage - 0.15).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn repeated_samples_are_ignored_and_old_ones_forgotten() {
        let mut s = series(&[100, 0]);
        s.extend([(T0 + P, 0), (T0 + 2 * P, 100)]);
        assert_eq!(s.len(), 2);
        s.extend((3..=10).map(|i| (T0 + i * P, 100)));
        s.forget_before(T0 + 5 * P);
        assert_eq!(s.len(), 6, "one sample before the cut is kept");
        let w = s.busy(T0 + 5 * P, T0 + 6 * P).unwrap();
        assert_eq!((w.fraction, w.coverage), (1.0, 1.0));
    }
}
