//! Samples of file-driven processes: a thread polls each `sm_util_file` every 10 ms (0 once the
//! process is gone) and keeps, per sample period, the mean value as one sample (none when the
//! mean is 0: the driver reports only processes that were active), for the last 10 s.
use crate::scenario::Scenario;
use nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, Once};
use std::time::Duration;

const POLL: Duration = Duration::from_millis(10);
const HISTORY_US: u64 = 10_000_000;

#[derive(Default)]
struct Track {
    sum: u64,
    polls: u64,
    period_start_us: u64,
    samples: VecDeque<(u64, u32)>,
}

/// (device index, pid) → its accumulation and samples.
static TRACKS: Mutex<Option<HashMap<(usize, u32), Track>>> = Mutex::new(None);
static START: Once = Once::new();

pub fn start() {
    START.call_once(|| {
        std::thread::Builder::new()
            .name("fake-nvml-sampler".into())
            .spawn(|| loop {
                crate::with_scenario(poll);
                std::thread::sleep(POLL);
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("fake-nvml: cannot start the sampler thread: {e}"));
    });
}

fn poll(s: &Scenario) {
    let now = crate::now_us();
    let mut guard = TRACKS.lock().unwrap_or_else(|p| p.into_inner());
    let tracks = guard.get_or_insert_with(HashMap::new);
    for (index, d) in s.devices.iter().enumerate() {
        for p in &d.processes {
            let Some(file) = &p.sm_util_file else {
                continue;
            };
            // The driver samples live contexts only: a dead process computes nothing, whatever
            // its marker file still says.
            let alive = std::path::Path::new(&format!("/proc/{}", p.pid)).exists();
            let value: u32 = std::fs::read_to_string(file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .filter(|_| alive)
                .unwrap_or(0);
            let t = tracks.entry((index, p.pid)).or_insert_with(|| Track {
                period_start_us: now,
                ..Default::default()
            });
            t.sum += u64::from(value.min(100));
            t.polls += 1;
            if now - t.period_start_us >= p.sample_period_ms.max(1) * 1000 {
                let mean = (t.sum / t.polls.max(1)) as u32;
                if mean > 0 {
                    t.samples.push_back((now, mean));
                }
                while t
                    .samples
                    .front()
                    .is_some_and(|(ts, _)| now - ts > HISTORY_US)
                {
                    t.samples.pop_front();
                }
                t.sum = 0;
                t.polls = 0;
                t.period_start_us = now;
            }
        }
    }
}

/// Appends the file-driven samples of device `index` newer than `last_seen`.
pub fn samples_since(index: usize, last_seen: u64, out: &mut Vec<nvmlProcessUtilizationSample_t>) {
    let guard = TRACKS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(tracks) = guard.as_ref() else { return };
    for ((i, pid), t) in tracks {
        if *i != index {
            continue;
        }
        for (ts, sm) in t.samples.iter().filter(|(ts, _)| *ts > last_seen) {
            out.push(nvmlProcessUtilizationSample_t {
                pid: *pid,
                timeStamp: *ts,
                smUtil: *sm,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            });
        }
    }
}
