//! GPU activity from NVML's per-process samples.
//!
//! `GetProcessUtilization` returns sparse samples: one per process per driver sample period
//! (200 ms on an H200) and only for processes that were active in that period. Each sample's SM
//! figure covers the time since the process's previous sample, capped at the period: a gap longer
//! than the period means the process was idle in between (no sample ⇒ no activity). Integrating
//! `sm% × covered time` gives the seconds the process kept the GPU busy; divided by the window,
//! its busy fraction. On the recorded H200 timeline this matches device utilisation within two
//! points (see the replay test).
use std::collections::{HashMap, VecDeque};

/// The driver's sample period assumed until enough gaps have been seen.
pub const DEFAULT_PERIOD_US: u64 = 200_000;
const MIN_PERIOD_US: u64 = 20_000;
const MAX_PERIOD_US: u64 = 2_000_000;
const GAPS_KEPT: usize = 64;

/// Integrates one GPU's samples, process by process.
#[derive(Debug, Default)]
pub struct SampleIntegrator {
    last_ts: HashMap<u32, u64>,
    gaps: VecDeque<u64>,
}

impl SampleIntegrator {
    /// The driver's sample period as observed: the median gap between consecutive samples of one
    /// process (gaps longer than 2 s are idleness, not the period).
    pub fn period_us(&self) -> u64 {
        if self.gaps.len() < 8 {
            return DEFAULT_PERIOD_US;
        }
        let mut g: Vec<u64> = self.gaps.iter().copied().collect();
        g.sort_unstable();
        g[g.len() / 2].clamp(MIN_PERIOD_US, MAX_PERIOD_US)
    }

    /// Adds one sample; returns the busy seconds it stands for. Samples must come in time order
    /// per process (NVML's are; a repeated or older one counts nothing).
    pub fn add(&mut self, pid: u32, ts_us: u64, sm_percent: u32) -> f64 {
        let period = self.period_us();
        let covered = match self.last_ts.get(&pid) {
            Some(&prev) if ts_us <= prev => return 0.0,
            Some(&prev) => {
                let gap = ts_us - prev;
                if gap < MAX_PERIOD_US {
                    if self.gaps.len() == GAPS_KEPT {
                        self.gaps.pop_front();
                    }
                    self.gaps.push_back(gap);
                }
                gap.min(period)
            }
            None => period,
        };
        self.last_ts.insert(pid, ts_us);
        f64::from(sm_percent.min(100)) / 100.0 * covered as f64 / 1e6
    }

    /// Forgets processes not in `live` (they left the GPU).
    pub fn retain(&mut self, live: impl Fn(u32) -> bool) {
        self.last_ts.retain(|pid, _| live(*pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_process_integrates_to_its_utilisation() {
        let mut i = SampleIntegrator::default();
        let mut busy = 0.0;
        // 5 s of samples every 200 ms at 50 %
        for k in 1..=25u64 {
            busy += i.add(1, k * 200_000, 50);
        }
        assert!((busy - 2.5).abs() < 1e-9, "{busy}");
        assert_eq!(i.period_us(), 200_000);
    }

    #[test]
    fn gaps_are_idleness_and_repeats_count_nothing() {
        let mut i = SampleIntegrator::default();
        for k in 1..=10u64 {
            i.add(1, k * 200_000, 100);
        }
        // 3 s without samples, then one: it covers one period, not 3 s
        let b = i.add(1, 2_000_000 + 3_000_000, 100);
        assert!((b - 0.2).abs() < 1e-9, "{b}");
        assert_eq!(i.add(1, 5_000_000, 100), 0.0, "the same sample again");
        assert_eq!(i.add(1, 4_000_000, 100), 0.0, "an older one");
    }
}
