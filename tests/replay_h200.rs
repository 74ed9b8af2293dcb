//! Replay of a real H200 timeline (tests/fixtures/h200-three-phase) through the agent itself:
//! the recorded utilisation series of each phase is played back by the fake NVML (one GPU per
//! phase, all three at once), and the real `Sampler` runs at its own cadence — a round every
//! second, the series fetched every 10 s, rounds held until it covers them. Each phase's busy
//! share must match the recording and, in the I/O-bound phase, the job's own data-wait; every
//! 1-s window must fall on the right side of the GPU-bound threshold; nothing may read more
//! busy than the recording ever was.
use gpuwatch::events::EventCounters;
use gpuwatch::model::Snapshot;
use gpuwatch::sampler::{Sampler, SamplerConfig};
use gpuwatch::sources::gpu::GpuSourceConfig;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn load(name: &str) -> Value {
    let path = format!(
        "{}/../tests/fixtures/h200-three-phase/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}

struct Phase {
    name: String,
    start: f64,
    end: f64,
    data_wait_fraction: f64,
}

fn phases(truth: &Value) -> Vec<Phase> {
    let mut out: Vec<Phase> = Vec::new();
    let mut waits: Vec<(f64, f64)> = Vec::new();
    for s in truth["steps"].as_array().unwrap() {
        let (name, t0, wait, compute) = (
            s[0].as_str().unwrap(),
            s[1].as_f64().unwrap(),
            s[2].as_f64().unwrap(),
            s[3].as_f64().unwrap(),
        );
        if out.last().is_none_or(|p| p.name != name) {
            out.push(Phase {
                name: name.to_owned(),
                start: t0,
                end: t0,
                data_wait_fraction: 0.0,
            });
            waits.push((0.0, 0.0));
        }
        let p = out.last_mut().unwrap();
        p.end = t0 + wait + compute;
        let w = waits.last_mut().unwrap();
        w.0 += wait;
        w.1 += compute;
    }
    for (p, (wait, compute)) in out.iter_mut().zip(waits) {
        p.data_wait_fraction = wait / (wait + compute);
    }
    out
}

/// The job's utilisation records in the phase, as (offset ms from the phase start, percent).
/// Polled every 100 ms, the job alone on the GPU: each returned per-process sample is one
/// 200-ms record of the device (NOT_FOUND between them), idle records at 0.
fn records(timeline: &Value, pid: u64, p: &Phase) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for tick in timeline["ticks"].as_array().unwrap() {
        for s in tick["process_util"].as_array().into_iter().flatten() {
            let ts = s[1].as_u64().unwrap() as f64 / 1e6;
            if s[0].as_u64() == Some(pid) && ts > p.start && ts <= p.end {
                out.push((
                    ((ts - p.start) * 1000.0) as u64,
                    s[2].as_u64().unwrap() as u32,
                ));
            }
        }
    }
    out.sort_unstable();
    out.dedup_by_key(|r| r.0);
    out
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// The recording's GetUtilizationRates readings (every 100 ms) over the phase, as a share.
fn readings_mean(timeline: &Value, p: &Phase) -> f64 {
    mean(
        timeline["ticks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| (p.start..p.end).contains(&t["t"].as_f64().unwrap()))
            .map(|t| t["gpu_util"].as_f64().unwrap() / 100.0),
    )
}

fn fake_lib() -> PathBuf {
    let exe = support::gpuwatch_bin();
    let lib = exe.parent().unwrap().join("libnvidia_ml_fake.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build -p fake-nvml",
        lib.display()
    );
    lib
}

#[test]
fn the_agent_replays_each_phase_at_its_own_cadence() {
    let (timeline, truth) = (load("timeline.json"), load("truth.json"));
    let pid = truth["pid"].as_u64().unwrap();
    let phases = phases(&truth);
    assert_eq!(
        phases.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["gpu_bound", "io_bound", "leak"]
    );
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id();
    // Playback and the windows below count from this one instant (the agent may take long to
    // start on a loaded machine; the fake would otherwise start its clock when it first polls).
    let started_unix_ms = now_ms();
    let devices: Vec<Value> = phases
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let file = dir.path().join(format!("{}.json", p.name));
            std::fs::write(
                &file,
                serde_json::to_vec(&records(&timeline, pid, p)).unwrap(),
            )
            .unwrap();
            json!({"uuid": format!("GPU-replay-{i}"), "replay_series": file,
                   "replay_started_unix_ms": started_unix_ms,
                   "processes": [{"pid": me, "used_memory_bytes": 1u64 << 30}]})
        })
        .collect();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, json!({ "devices": devices }).to_string()).unwrap();
    std::env::set_var("FAKE_NVML_SCENARIO", &scenario);

    let config = SamplerConfig {
        gpu: Some(GpuSourceConfig {
            lib_path: Some(fake_lib()),
            ..GpuSourceConfig::default()
        }),
        probes: false,
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::new(&config, None, Arc::new(EventCounters::default()));
    let longest = phases.iter().map(|p| p.end - p.start).fold(0.0, f64::max);
    let mut snaps: Vec<Snapshot> = sampler.round();
    let t0 = Instant::now();
    let mut k = 1;
    while t0.elapsed().as_secs_f64() < longest {
        std::thread::sleep((t0 + Duration::from_secs(k)).saturating_duration_since(Instant::now()));
        snaps.extend(sampler.round());
        k += 1;
    }
    snaps.extend(sampler.flush());
    assert!(
        snaps.len() as f64 >= longest - 1.0,
        "{} rounds",
        snaps.len()
    );

    for (i, p) in phases.iter().enumerate() {
        // (window start in the phase, busy share) of each round, skipping the phase's first
        // second (the DataLoader's start) and any window past its end.
        let windows: Vec<(f64, f64, f64)> = snaps
            .iter()
            .filter_map(|s| {
                let end = (s.taken_at_unix_ms.saturating_sub(started_unix_ms)) as f64 / 1000.0;
                let start = end - s.window_seconds?;
                let busy = s.gpus[i].busy?;
                assert_eq!(
                    busy.source,
                    gpuwatch::model::BusySource::UtilizationSamples,
                    "{}: {busy:?}",
                    p.name
                );
                (start >= 1.0 && end <= p.end - p.start).then_some((start, end, busy.fraction))
            })
            .collect();
        assert!(windows.len() >= 15, "{}: {} windows", p.name, windows.len());
        let peak = records(&timeline, pid, p)
            .iter()
            .map(|r| r.1)
            .max()
            .unwrap();
        for &(t, _, b) in &windows {
            assert!(
                b <= f64::from(peak) / 100.0 + 1e-9,
                "{} at {t:.1} s: busy {b} over the recording's peak {peak}%",
                p.name
            );
        }
        let busy = mean(windows.iter().map(|w| w.2));
        // The recording over the same windows (a record covers the 200 ms before its offset).
        let recs = records(&timeline, pid, p);
        // Each round's own window: under load a round comes late and covers more than 1 s.
        let recorded = mean(windows.iter().map(|&(start, end, _)| {
            mean(
                recs.iter()
                    .filter(|r| (start * 1000.0) < r.0 as f64 && r.0 as f64 <= end * 1000.0)
                    .map(|r| f64::from(r.1) / 100.0),
            )
        }));
        let readings = readings_mean(&timeline, p);
        eprintln!(
            "{}: {} windows, busy {busy:.3}, recorded series {recorded:.3}, readings {readings:.3}, idle {:.3}, job data-wait {:.3}",
            p.name,
            windows.len(),
            1.0 - busy,
            p.data_wait_fraction
        );
        assert!(
            (busy - recorded).abs() <= 0.02,
            "{}: {busy} vs {recorded}",
            p.name
        );
        assert!(
            (busy - readings).abs() <= 0.03,
            "{}: {busy} vs {readings}",
            p.name
        );
        // Every 1-s window on the right side of the GPU-bound threshold.
        let gpu_bound = p.name != "io_bound";
        let right = windows
            .iter()
            .filter(|w| (1.0 - w.2 < 0.25) == gpu_bound)
            .count();
        assert_eq!(right, windows.len(), "{}: {windows:?}", p.name);
        if !gpu_bound {
            // The GPU idles as long as the job waits for data.
            let idle = 1.0 - busy;
            assert!(
                (idle - p.data_wait_fraction).abs() <= 0.03,
                "idle {idle:.3} vs data-wait {:.3}",
                p.data_wait_fraction
            );
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
