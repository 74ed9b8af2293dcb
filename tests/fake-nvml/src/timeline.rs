//! The driver's utilisation records of one GPU, and what each query returns from them.
//!
//! Everything here copies what NVML did on an H200 (driver 580.159.04, 2026-12-01, measured with
//! `tests/gpu/nvml_semantics.py`; the figures are in `docs/gpu-sampling.md`):
//!
//! - The driver closes one record per sample period (200 ms on the H200) and keeps the last 72
//!   (`GetProcessUtilization` sized its buffer at 72; `GetSamples(0)` returned 71 records
//!   spanning 14.0 s).
//! - `GetSamples(GPU_UTILIZATION_SAMPLES, last_seen)` returns every record newer than
//!   `last_seen`: five a second, each the device's utilisation over its period.
//! - Each record is credited to one process: the busiest in that period. Two processes at 70 %
//!   and 30 % duty (their bursts overlapping) showed only the 70 % process, carrying the
//!   device's figure (68.9 against 68.5); two at full duty both showed, so tied processes take
//!   turns here.
//! - `GetProcessUtilization(last_seen)` returns one entry per process that was credited with a
//!   record since `last_seen`: the sum of its credited records over the number of records in
//!   that span. Polled at 1 s, one busy process gave one sample per call (sm 95.7 at 96.4 device
//!   utilisation); the two full-duty processes gave 44.3 and 54.1, summing to the device's 99;
//!   polled at 100 ms, every other call found a record, carrying the device's figure.
use std::collections::VecDeque;

/// Records the driver keeps per GPU (measured: 72).
pub const HISTORY_RECORDS: usize = 72;

/// One closed sample period.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// End of the period, µs since the epoch (the driver's timestamps are host wall time).
    pub ts_us: u64,
    /// The device's utilisation over the period, percent.
    pub device_percent: u32,
    /// The process credited with the period and its memory-controller figure; `None` when no
    /// process was alive.
    pub owner: Option<u32>,
    pub owner_mem_percent: u32,
}

/// One GPU's records, oldest first.
#[derive(Debug)]
pub struct Timeline {
    records: VecDeque<Record>,
    capacity: usize,
    /// The process the last tied period went to: the next tie goes to the one after it.
    last_tie: Option<u32>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::with_capacity(HISTORY_RECORDS)
    }
}

/// Each process's activity in one period: (pid, mean SM percent, mean memory percent).
pub type PeriodActivity = [(u32, u32, u32)];

impl Timeline {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            records: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
            last_tie: None,
        }
    }

    /// Closes a period. `device_override` is the scenario's fixed device figure, if any;
    /// otherwise time-slicing adds the processes' shares, capped at 100 (two processes at full
    /// duty each got ~47 % of the GPU, which read 99.9 %).
    pub fn close_period(
        &mut self,
        ts_us: u64,
        activity: &PeriodActivity,
        device_override: Option<u32>,
    ) {
        let sum: u32 = activity.iter().map(|a| a.1).sum();
        let device_percent = device_override.unwrap_or(sum.min(100));
        let owner = self.owner(activity);
        if self.records.len() == self.capacity {
            self.records.pop_front();
        }
        self.records.push_back(Record {
            ts_us,
            device_percent,
            owner: owner.map(|a| a.0),
            owner_mem_percent: owner.map_or(0, |a| a.2),
        });
    }

    /// The busiest process of a period. Tied ones take turns: two processes at full duty on
    /// the H200 were both credited (44.3 and 54.1 over 1-s polls), never one alone. An all-idle
    /// period is a tie too; which process the driver credits then is unmeasured, and nothing
    /// relies on it (a 0 % record adds nothing to any process's figure).
    fn owner(&mut self, activity: &PeriodActivity) -> Option<(u32, u32, u32)> {
        let max = activity.iter().map(|a| a.1).max()?;
        let tied: Vec<&(u32, u32, u32)> = activity.iter().filter(|a| a.1 == max).collect();
        if tied.len() == 1 {
            return Some(*tied[0]);
        }
        let after = self
            .last_tie
            .and_then(|pid| tied.iter().position(|a| a.0 == pid))
            .map_or(0, |i| (i + 1) % tied.len());
        self.last_tie = Some(tied[after].0);
        Some(*tied[after])
    }

    pub fn latest(&self) -> Option<&Record> {
        self.records.back()
    }

    fn since(&self, last_seen: u64) -> impl Iterator<Item = &Record> {
        self.records.iter().filter(move |r| r.ts_us > last_seen)
    }

    /// `GetSamples`: (timestamp, device percent) of every record newer than `last_seen`.
    pub fn device_samples(&self, last_seen: u64) -> Vec<(u64, u32)> {
        self.since(last_seen)
            .map(|r| (r.ts_us, r.device_percent))
            .collect()
    }

    /// `GetProcessUtilization`: per credited process, (pid, timestamp of its newest record, SM
    /// percent, memory percent), the percents summed over its records and divided by the number
    /// of records in the span.
    pub fn process_samples(&self, last_seen: u64) -> Vec<(u32, u64, u32, u32)> {
        let span: Vec<&Record> = self.since(last_seen).collect();
        let n = span.len() as u64;
        let mut out: Vec<(u32, u64, u64, u64)> = Vec::new();
        for r in &span {
            let Some(pid) = r.owner else { continue };
            match out.iter_mut().find(|e| e.0 == pid) {
                Some(e) => {
                    e.1 = e.1.max(r.ts_us);
                    e.2 += u64::from(r.device_percent);
                    e.3 += u64::from(r.owner_mem_percent);
                }
                None => out.push((
                    pid,
                    r.ts_us,
                    u64::from(r.device_percent),
                    u64::from(r.owner_mem_percent),
                )),
            }
        }
        out.into_iter()
            .map(|(pid, ts, sm, mem)| (pid, ts, (sm / n) as u32, (mem / n) as u32))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 200_000;

    fn run(t: &mut Timeline, periods: u64, activity: &PeriodActivity) {
        let start = t.latest().map_or(P, |r| r.ts_us + P);
        for k in 0..periods {
            t.close_period(start + k * P, activity, None);
        }
    }

    #[test]
    fn one_busy_process_gives_one_sample_per_call_at_the_devices_figure() {
        // H200: one process at 96 %: one sample per 1-s call, sm 95.7 at 96.4 device.
        let mut t = Timeline::default();
        run(&mut t, 5, &[(7, 96, 40)]);
        let last = t.latest().unwrap().ts_us;
        run(&mut t, 5, &[(7, 96, 40)]);
        assert_eq!(
            t.device_samples(last).len(),
            5,
            "five device records a second"
        );
        assert_eq!(t.process_samples(last), vec![(7, last + 5 * P, 96, 40)]);
        // polled every 100 ms, every other call finds a record
        assert_eq!(t.process_samples(last + 5 * P).len(), 0);
    }

    #[test]
    fn each_period_goes_to_its_busiest_process() {
        // H200: 70 % and 30 % duty, overlapping bursts: only the 70 % process shows, with the
        // device's figure.
        let mut t = Timeline::default();
        run(&mut t, 5, &[(1, 50, 0), (2, 19, 0)]);
        assert_eq!(t.process_samples(0), vec![(1, 5 * P, 69, 0)]);
        // Two at full duty alternate periods (measured 44.3 and 54.1 summing to 99): each gets
        // its periods over all periods in the span.
        let mut t = Timeline::default();
        for k in 1..=5u64 {
            let act = if k % 2 == 0 {
                [(1, 50, 0), (2, 49, 0)]
            } else {
                [(1, 49, 0), (2, 50, 0)]
            };
            t.close_period(k * P, &act, None);
        }
        let s = t.process_samples(0);
        assert_eq!(s.len(), 2);
        let total: u32 = s.iter().map(|e| e.2).sum();
        assert!((98..=99).contains(&total), "{s:?}");
        assert_eq!(t.device_samples(0).iter().map(|d| d.1).sum::<u32>(), 5 * 99);
    }

    #[test]
    fn equal_processes_take_turns_and_both_are_credited() {
        // Two processes exactly tied every period: the H200 credited both (never one alone).
        let mut t = Timeline::default();
        run(&mut t, 10, &[(1, 50, 0), (2, 50, 0), (3, 10, 0)]);
        let s = t.process_samples(0);
        let sm = |pid: u32| s.iter().find(|e| e.0 == pid).map(|e| e.2);
        // Each holds half the periods at the device's 100 (the shares capped): 50 each.
        assert_eq!((sm(1), sm(2), sm(3)), (Some(50), Some(50), None), "{s:?}");
    }

    #[test]
    fn the_driver_keeps_72_records_and_time_slicing_caps_at_100() {
        let mut t = Timeline::default();
        run(&mut t, 100, &[(1, 80, 0), (2, 80, 0)]);
        let all = t.device_samples(0);
        assert_eq!(all.len(), HISTORY_RECORDS);
        assert!(all.iter().all(|s| s.1 == 100));
        let mut t = Timeline::default();
        t.close_period(P, &[(1, 10, 0)], Some(60));
        assert_eq!(
            t.device_samples(0),
            vec![(P, 60)],
            "a fixed device figure wins"
        );
        assert!(
            t.process_samples(P).is_empty(),
            "nothing newer than last_seen"
        );
    }
}
