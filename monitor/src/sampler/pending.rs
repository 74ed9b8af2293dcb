//! Rounds waiting for their GPU series, and how one is completed once the series covers it.
//!
//! A round is taken every interval, but the GPU's utilisation series is fetched in batches
//! (every `series_interval`: one fetch costs ~2 ms of CPU however much it returns, and the
//! driver keeps 14 s). So a round is held until the series reaches the end of its window, then
//! completed: each GPU's busy share over the window, divided between its holders, and the
//! verdicts, which need it.
use super::busy_split::{self, Holder};
use crate::model::{PcieTraffic, SmActivity, WorkloadId};

use crate::model::{BusySource, Gpu, GpuBusy, Snapshot, SplitMethod, Workload};
use crate::sources::gpu::{DeviceFetch, GpuSource, ProcessSplit};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

/// A round taken but not yet published.
pub struct PendingRound {
    pub snapshot: Snapshot,
    /// The round's window, µs since the epoch; `None` for the first round.
    pub window_us: Option<(u64, u64)>,
    pub taken: Instant,
    /// The GPUs whose split in this round may need the driver's per-process figures: held by
    /// several workloads, and not every holder busy on a CPU.
    pub driver_split_gpus: Vec<u32>,
}

/// Spans of GPM and per-process figures kept per GPU: enough to cover every pending round.
const SPANS_KEPT: usize = 4;

/// What the series fetches brought beyond the series itself, per GPU.
#[derive(Default)]
pub struct Fetched {
    sm_activity: HashMap<u32, VecDeque<SmActivity>>,
    pcie: HashMap<u32, VecDeque<PcieTraffic>>,
    splits: HashMap<u32, VecDeque<ProcessSplit>>,
    errors: HashMap<u32, BTreeMap<&'static str, String>>,
}

impl Fetched {
    pub fn add(&mut self, fetches: Vec<DeviceFetch>) {
        for f in fetches {
            if let Some(a) = f.sm_activity {
                push_bounded(self.sm_activity.entry(f.index).or_default(), a);
            }
            if let Some(p) = f.pcie {
                push_bounded(self.pcie.entry(f.index).or_default(), p);
            }
            if let Some(s) = f.split {
                push_bounded(self.splits.entry(f.index).or_default(), s);
            }
            if f.errors.is_empty() {
                self.errors.remove(&f.index);
            } else {
                self.errors.insert(f.index, f.errors);
            }
        }
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == SPANS_KEPT {
        q.pop_front();
    }
    q.push_back(v);
}

/// How much of the window (a, b] the span (s, e] overlaps.
fn overlap(a: u64, b: u64, s: u64, e: u64) -> u64 {
    b.min(e).saturating_sub(a.max(s))
}

/// The span that overlaps the window most.
fn best_span<T>(
    spans: Option<&VecDeque<T>>,
    a: u64,
    b: u64,
    span: impl Fn(&T) -> (u64, u64),
) -> Option<&T> {
    spans?
        .iter()
        .map(|t| {
            let (s, e) = span(t);
            (overlap(a, b, s, e), t)
        })
        .filter(|(o, _)| *o > 0)
        .max_by_key(|(o, _)| *o)
        .map(|(_, t)| t)
}

/// What completes a round: the GPU series and what the fetches brought.
pub struct Completion<'a> {
    pub gpu: Option<&'a GpuSource>,
    pub fetched: &'a Fetched,
}

impl Completion<'_> {
    pub fn complete(&self, p: PendingRound) -> Snapshot {
        let mut snap = p.snapshot;
        let index: HashMap<WorkloadId, usize> = snap
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| (w.id.clone(), i))
            .collect();
        if let Some((a, b)) = p.window_us {
            for g in &mut snap.gpus {
                self.complete_gpu(g, a, b, &mut snap.workloads, &index);
            }
        }
        for w in &mut snap.workloads {
            finish_workload_busy(w);
            super::rank_envs::finish(w);
        }
        snap
    }

    fn complete_gpu(
        &self,
        g: &mut Gpu,
        a: u64,
        b: u64,
        workloads: &mut [Workload],
        index: &HashMap<WorkloadId, usize>,
    ) {
        let i = g.device.index;
        if let Some(errors) = self.fetched.errors.get(&i) {
            g.device
                .errors
                .extend(errors.iter().map(|(k, v)| (*k, v.clone())));
        }
        let (a_ms, b_ms) = (a / 1000, b / 1000);
        g.sm_activity = best_span(self.fetched.sm_activity.get(&i), a_ms, b_ms, |s| {
            (s.start_unix_ms, s.end_unix_ms)
        })
        .copied();
        g.gpm = self.gpu.and_then(|s| s.gpm_state(i)).cloned();
        g.pcie = self.fetched.pcie.get(&i).and_then(|q| {
            if q.back()?.source == crate::model::PcieSource::Gpm {
                best_span(Some(q), a_ms, b_ms, |p| (p.start_unix_ms, p.end_unix_ms)).copied()
            } else {
                // The counter's ~20-ms sample: the one read nearest the window's end.
                q.iter()
                    .min_by_key(|p| p.end_unix_ms.abs_diff(b_ms))
                    .copied()
            }
        });
        let Some((fraction, coverage, source)) = self.busy(g, a, b) else {
            return;
        };
        let split = best_span(self.fetched.splits.get(&i), a, b, |s| {
            (s.start_us, s.end_us)
        });
        for p in &mut g.processes {
            p.driver_sm_percent = split.and_then(|s| {
                s.processes
                    .iter()
                    .find(|e| e.0 == p.reading.pid)
                    .map(|e| e.1)
            });
        }
        let holders: Vec<Holder> = g.processes.iter().map(Holder::from).collect();
        let result = busy_split::split(&holders, (b - a) as f64 / 1e6);
        g.busy = Some(GpuBusy {
            fraction,
            coverage,
            source,
            split: result.method,
        });
        let per_process = !result.method.is_exact() && result.method != SplitMethod::Unknown;
        let kernel_fraction = self.kernel_fraction(g);
        // Each workload's part: the sum of its processes' shares, unknown if any is.
        let mut parts: BTreeMap<&WorkloadId, Option<f64>> = BTreeMap::new();
        for (p, share) in g.processes.iter_mut().zip(&result.shares) {
            if per_process {
                p.busy_fraction = share.map(|s| s * fraction);
            }
            if let Some(w) = &p.workload {
                let part = parts.entry(w).or_insert(Some(0.0));
                *part = part.zip(*share).map(|(x, y)| x + y);
            }
        }
        for (id, part) in parts {
            let Some(w) = index.get(id).map(|&k| &mut workloads[k]) else {
                continue;
            };
            let Some(share) = w.gpu.per_gpu.iter_mut().find(|s| s.index == i) else {
                continue;
            };
            share.busy_fraction = part.map(|p| p * fraction);
            share.split = Some(result.method);
            share.device_busy_fraction = Some(fraction);
            let alone = result.method.is_exact() && part == Some(1.0);
            share.sm_activity_percent = alone
                .then(|| g.sm_activity.and_then(|a| sm_while_busy(&a)))
                .flatten();
            share.kernel_fraction = alone.then_some(kernel_fraction).flatten();
            share.pcie_bytes_per_second = alone
                .then(|| {
                    g.pcie
                        .map(|p| p.rx_bytes_per_second + p.tx_bytes_per_second)
                })
                .flatten();
        }
    }

    /// Of the GPU's busy time over its GPM span, the share its engine ran kernels: the engine
    /// activity over the utilisation series' busy share across the same span (both time
    /// averages); `None` without both, or on a GPU nearly idle over the span.
    fn kernel_fraction(&self, g: &Gpu) -> Option<f64> {
        let a = g.sm_activity?;
        let engine = a.engine_percent? / 100.0;
        let span = self
            .gpu?
            .busy(g.device.index, a.start_unix_ms * 1000, a.end_unix_ms * 1000)
            .filter(|w| w.coverage >= 0.5)?;
        (span.fraction >= 0.01).then(|| (engine / span.fraction).min(1.0))
    }

    /// The GPU's busy share over (a, b], best source first: the utilisation series, GPM's
    /// engine activity over the span holding the window, the round's instantaneous reading.
    fn busy(&self, g: &Gpu, a: u64, b: u64) -> Option<(f64, Option<f64>, BusySource)> {
        let i = g.device.index;
        if let Some(w) = self
            .gpu
            .and_then(|s| s.busy(i, a, b))
            .filter(|w| w.coverage >= 0.5)
        {
            return Some((w.fraction, Some(w.coverage), BusySource::UtilizationSamples));
        }
        if let Some((s, engine)) = g.sm_activity.and_then(|s| Some((s, s.engine_percent?))) {
            let covered = overlap(a / 1000, b / 1000, s.start_unix_ms, s.end_unix_ms);
            let coverage = covered as f64 * 1000.0 / (b - a) as f64;
            return Some((engine / 100.0, Some(coverage), BusySource::GpmEngine));
        }
        g.device
            .utilization_gpu_percent
            .map(|u| (f64::from(u) / 100.0, None, BusySource::UtilizationReading))
    }
}

/// GPM's SM activity while a kernel ran: its SM activity over its engine activity (both time
/// averages over the span), percent; `None` on a GPU idle for nearly all of the span.
fn sm_while_busy(a: &SmActivity) -> Option<f64> {
    let engine = a.engine_percent.filter(|e| *e >= 1.0)?;
    Some((a.sm_percent? / engine * 100.0).min(100.0))
}

/// The workload's busy share: the mean over its GPUs whose share is known.
fn finish_workload_busy(w: &mut Workload) {
    let known: Vec<f64> = w
        .gpu
        .per_gpu
        .iter()
        .filter_map(|s| s.busy_fraction)
        .collect();
    w.gpu.busy_fraction =
        (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_on_several_gpus_is_as_busy_as_their_mean() {
        // A DDP job on GPUs 0-2: 0.9, 0.6 and one whose part is unknown (a shared GPU the
        // split could not divide): busy 0.75, the mean of the two known, not their sum.
        let mut w = crate::model::test_support::container("ddp");
        for (i, busy) in [(0, Some(0.9)), (1, Some(0.6)), (2, None)] {
            w.gpu.per_gpu.push(crate::model::WorkloadGpuShare {
                busy_fraction: busy,
                ..crate::model::WorkloadGpuShare::new(i, None)
            });
        }
        finish_workload_busy(&mut w);
        assert!(
            (w.gpu.busy_fraction.unwrap() - 0.75).abs() < 1e-9,
            "{:?}",
            w.gpu
        );
        for s in &mut w.gpu.per_gpu {
            s.busy_fraction = None;
        }
        finish_workload_busy(&mut w);
        assert_eq!(w.gpu.busy_fraction, None);
    }

    #[test]
    fn the_span_that_overlaps_most_is_chosen() {
        let mut q = VecDeque::new();
        for (s, e) in [(0u64, 10u64), (10, 20), (20, 30)] {
            q.push_back((s, e));
        }
        assert_eq!(best_span(Some(&q), 8, 13, |t| *t), Some(&(10, 20)));
        assert_eq!(best_span(Some(&q), 30, 40, |t| *t), None);
        assert_eq!(overlap(5, 15, 10, 30), 5);
    }
}
