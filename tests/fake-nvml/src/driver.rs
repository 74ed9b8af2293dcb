//! The simulated driver: a thread that watches each scenario process every 10 ms, as the real
//! driver watches contexts, and keeps per GPU what NVML's queries read:
//!
//! - the closed sample periods ([`Timeline`]), one per `sample_period_ms` on a grid aligned to
//!   the period, each with every live process's mean over it;
//! - GPM counters: the time integrals of engine, SM, tensor, occupancy and DRAM activity and of
//!   PCIe traffic, so that the metrics between two GPM samples are the averages over the time
//!   between them; and the PCIe rates of the latest reading, for the throughput counter.
//!
//! A process whose PID no longer exists computes nothing, whatever the scenario or its marker
//! file says (NVML may still list a dead process's context: that is the ghost case).
use crate::scenario::{Device, Process, Scenario};
use crate::timeline::Timeline;
use std::collections::HashMap;
use std::sync::{Mutex, Once};
use std::time::Duration;

const POLL: Duration = Duration::from_millis(10);

/// Time integrals of GPM activity, in percent × µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmCounters {
    pub ts_us: u64,
    pub engine: f64,
    pub sm: f64,
    pub tensor: f64,
    pub occupancy: f64,
    pub dram: f64,
    /// MiB/s × µs each way.
    pub pcie_rx: f64,
    pub pcie_tx: f64,
}

#[derive(Default)]
pub struct DeviceState {
    pub timeline: Timeline,
    /// Per PID of the open period: (sum of SM readings, sum of memory readings, readings).
    open: HashMap<u32, (u64, u64, u64)>,
    period_end_us: u64,
    pub gpm: GpmCounters,
    /// The live processes' PCIe rates at the latest reading, MiB/s (receive, transmit).
    pub pcie_now: (f64, f64),
    /// A recorded series being played back: its file, records, and when playback began.
    replay: Option<Replay>,
    /// Whether each listed PID is alive, looked up once per period (not every 10 ms: at
    /// thousands of processes that would be the fake's own load, and the driver has no such
    /// cost).
    alive: HashMap<u32, bool>,
}

struct Replay {
    path: String,
    /// (offset ms, percent), in offset order.
    records: Vec<(u64, u32)>,
    started_us: u64,
}

impl Replay {
    fn load(path: &str, started_us: u64) -> Self {
        let records = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Vec<(u64, u32)>>(&t).map_err(|e| e.to_string()))
            .unwrap_or_else(|e| {
                eprintln!("fake-nvml: replay series {path}: {e}");
                Vec::new()
            });
        Self {
            path: path.to_owned(),
            records,
            started_us,
        }
    }

    /// The record covering `now`: the latest whose offset has passed (0 after the end).
    fn at(&self, now: u64) -> u32 {
        let elapsed_ms = now.saturating_sub(self.started_us) / 1000;
        match self.records.partition_point(|r| r.0 <= elapsed_ms) {
            0 => 0,
            i if i == self.records.len() && elapsed_ms > self.records[i - 1].0 + 1000 => 0,
            i => self.records[i - 1].1,
        }
    }
}

static DEVICES: Mutex<Vec<DeviceState>> = Mutex::new(Vec::new());
static START: Once = Once::new();

pub fn start() {
    START.call_once(|| {
        // The real driver has watched its GPUs since it loaded: one poll before answering, so
        // a first call never reads a state nobody has filled yet.
        crate::with_scenario(poll);
        std::thread::Builder::new()
            .name("fake-nvml-driver".into())
            .spawn(|| loop {
                crate::with_scenario(poll);
                std::thread::sleep(POLL);
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("fake-nvml: cannot start the driver thread: {e}"));
    });
}

/// Runs `f` on device `index`'s state (created empty if the thread has not seen it yet).
pub fn with_device<T>(index: usize, history: usize, f: impl FnOnce(&DeviceState) -> T) -> T {
    let mut devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    while devices.len() <= index {
        devices.push(DeviceState {
            timeline: Timeline::with_capacity(history),
            ..Default::default()
        });
    }
    f(&devices[index])
}

fn is_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A live process's current SM share (percent).
fn current(p: &Process) -> u32 {
    match &p.sm_util_file {
        Some(file) => std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .unwrap_or(0),
        None => p.sm_util.unwrap_or(0),
    }
    .min(100)
}

fn poll(s: &Scenario) {
    let now = crate::now_us();
    let mut devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    for (index, d) in s.devices.iter().enumerate() {
        if devices.len() <= index {
            devices.push(DeviceState {
                timeline: Timeline::with_capacity(s.history_records),
                ..Default::default()
            });
        }
        if !d.lost {
            poll_device(&mut devices[index], d, now);
        }
    }
}

fn poll_device(state: &mut DeviceState, d: &Device, now: u64) {
    if state.replay.as_ref().map(|r| r.path.as_str()) != d.replay_series.as_deref() {
        let started = d.replay_started_unix_ms.map_or(now, |ms| ms * 1000);
        state.replay = d.replay_series.as_deref().map(|p| Replay::load(p, started));
    }
    let fixed = match &state.replay {
        Some(r) => Some(r.at(now)),
        None => d.utilization_gpu,
    };
    let period = d.sample_period_ms.max(1) * 1000;
    let boundary = now - now % period;
    if boundary > state.period_end_us || state.alive.len() != d.processes.len() {
        state.alive = d
            .processes
            .iter()
            .map(|p| (p.pid, is_alive(p.pid)))
            .collect();
    }
    let alive = |pid: u32| state.alive.get(&pid).copied().unwrap_or(false);
    let readings: Vec<(&Process, u32)> = d
        .processes
        .iter()
        .map(|p| (p, if alive(p.pid) { current(p) } else { 0 }))
        .collect();
    for (p, sm) in &readings {
        let e = state.open.entry(p.pid).or_default();
        e.0 += u64::from(*sm);
        e.1 += u64::from(p.mem_util);
        e.2 += 1;
    }
    let pcie = d
        .processes
        .iter()
        .filter(|p| alive(p.pid))
        .fold((0.0, 0.0), |(rx, tx), p| {
            (rx + p.pcie_rx_mib_s, tx + p.pcie_tx_mib_s)
        });
    add_gpm(&mut state.gpm, fixed, &readings, pcie, now);
    state.pcie_now = pcie;
    if state.period_end_us == 0 {
        state.period_end_us = boundary;
    } else if boundary > state.period_end_us {
        let activity: Vec<(u32, u32, u32)> = d
            .processes
            .iter()
            .filter(|p| state.alive.get(&p.pid).copied().unwrap_or(false))
            .map(|p| {
                let (sm, mem, n) = state.open.get(&p.pid).copied().unwrap_or_default();
                let n = n.max(1);
                (p.pid, (sm / n) as u32, (mem / n) as u32)
            })
            .collect();
        state.timeline.close_period(boundary, &activity, fixed);
        state.open.clear();
        state.period_end_us = boundary;
    }
}

/// Adds the time since the last reading to the GPM integrals. Time-slicing shares the engine:
/// when the processes' shares add up to more than 100 %, each gets its part of 100 (or of the
/// scenario's fixed device figure, `fixed`).
fn add_gpm(
    g: &mut GpmCounters,
    fixed: Option<u32>,
    readings: &[(&Process, u32)],
    pcie: (f64, f64),
    now: u64,
) {
    let dt = if g.ts_us == 0 {
        0.0
    } else {
        now.saturating_sub(g.ts_us).min(100_000) as f64
    };
    g.ts_us = now;
    let sum: f64 = readings.iter().map(|r| f64::from(r.1)).sum();
    let engine = fixed.map_or(sum.min(100.0), f64::from);
    let scale = if sum > 0.0 { engine / sum } else { 0.0 };
    g.engine += engine * dt;
    g.pcie_rx += pcie.0 * dt;
    g.pcie_tx += pcie.1 * dt;
    for (p, sm) in readings {
        let share = f64::from(*sm) * scale / 100.0 * dt;
        g.sm += share * p.sm_activity_percent;
        g.tensor += share * p.tensor_percent;
        g.occupancy += share * p.occupancy_percent;
        g.dram += share * p.dram_percent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpm_integrals_split_a_time_sliced_engine() {
        let me = std::process::id();
        let p = |sm| Process {
            pid: me,
            sm_util: Some(sm),
            sm_activity_percent: 96.0,
            tensor_percent: 93.0,
            ..Default::default()
        };
        let d = Device {
            processes: vec![p(80), p(80)],
            ..Default::default()
        };
        let mut g = GpmCounters::default();
        let r: Vec<(&Process, u32)> = d.processes.iter().map(|p| (p, current(p))).collect();
        assert!(is_alive(me));
        add_gpm(&mut g, d.utilization_gpu, &r, (5070.0, 305.0), 1_000_000);
        add_gpm(&mut g, d.utilization_gpu, &r, (5070.0, 305.0), 1_010_000);
        // 10 ms, engine capped at 100 %, each process half of it at 96 % SM activity
        assert!((g.engine - 100.0 * 10_000.0).abs() < 1e-6);
        assert!((g.sm - 96.0 * 10_000.0).abs() < 1e-6, "{}", g.sm);
        assert!((g.tensor - 93.0 * 10_000.0).abs() < 1e-6);
        // PCIe moves whether or not the engine is busy: 10 ms at the rates given
        assert!((g.pcie_rx - 5070.0 * 10_000.0).abs() < 1e-6);
        assert!((g.pcie_tx - 305.0 * 10_000.0).abs() < 1e-6);
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;

    #[test]
    fn a_replay_plays_each_record_from_its_offset() {
        let r = Replay {
            path: String::new(),
            records: vec![(200, 90), (400, 10), (600, 50)],
            started_us: 1_000_000,
        };
        assert_eq!(r.at(1_000_000), 0, "before the first record");
        assert_eq!(r.at(1_250_000), 90);
        assert_eq!(r.at(1_400_000), 10);
        assert_eq!(r.at(1_700_000), 50);
        assert_eq!(r.at(5_000_000), 0, "after the end, idle");
    }
}
