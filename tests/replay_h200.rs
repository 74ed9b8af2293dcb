//! Replay of a real H200 timeline (tests/fixtures/h200-three-phase): the GPU-side busy/idle
//! computation on real sample sparsity, against device utilisation and the job's own
//! data-wait ground truth.
use gpuwatch::gpu_activity::SampleIntegrator;
use serde_json::Value;

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

/// Busy seconds per sample, as the agent integrates them, with the sample's time (s).
fn integrate(timeline: &Value, pid: u64) -> Vec<(f64, f64)> {
    let mut integrator = SampleIntegrator::default();
    let mut out = Vec::new();
    for tick in timeline["ticks"].as_array().unwrap() {
        let Some(samples) = tick["process_util"].as_array() else {
            continue;
        }; // Not Found: no samples
        for s in samples {
            if s[0].as_u64() != Some(pid) {
                continue;
            }
            let (ts, sm) = (s[1].as_u64().unwrap(), s[2].as_u64().unwrap() as u32);
            out.push((ts as f64 / 1e6, integrator.add(pid as u32, ts, sm)));
        }
    }
    out
}

fn busy_between(busy: &[(f64, f64)], a: f64, b: f64) -> f64 {
    busy.iter()
        .filter(|(t, _)| *t > a && *t <= b)
        .map(|(_, s)| s)
        .sum::<f64>()
        / (b - a)
}

fn device_util_between(timeline: &Value, a: f64, b: f64) -> f64 {
    let u: Vec<f64> = timeline["ticks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| (a..b).contains(&t["t"].as_f64().unwrap()))
        .map(|t| t["gpu_util"].as_f64().unwrap() / 100.0)
        .collect();
    u.iter().sum::<f64>() / u.len() as f64
}

#[test]
fn per_phase_busy_matches_device_utilisation_and_idle_matches_the_jobs_data_wait() {
    let (timeline, truth) = (load("timeline.json"), load("truth.json"));
    let busy = integrate(&timeline, truth["pid"].as_u64().unwrap());
    let phases = phases(&truth);
    assert_eq!(
        phases.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["gpu_bound", "io_bound", "leak"]
    );
    for p in &phases {
        let b = busy_between(&busy, p.start, p.end);
        let util = device_util_between(&timeline, p.start, p.end);
        eprintln!(
            "{}: busy {b:.3}, device util {util:.3}, idle {:.3}, job data-wait {:.3}",
            p.name,
            1.0 - b,
            p.data_wait_fraction
        );
        // The job is alone on the GPU: its integrated samples must agree with the device.
        assert!(
            (b - util).abs() <= 0.03,
            "{}: busy {b:.3} vs device util {util:.3}",
            p.name
        );
    }
    // I/O-bound phase: the GPU idles as long as the job waits for data (±3 points).
    let io = &phases[1];
    let idle = 1.0 - busy_between(&busy, io.start, io.end);
    assert!(
        (idle - io.data_wait_fraction).abs() <= 0.03,
        "idle {idle:.3} vs data-wait {:.3}",
        io.data_wait_fraction
    );
    // GPU-bound phases: little data wait, and the GPU idle share stays under the GPU-bound
    // threshold (the rest of the idle is the step's own host-side time, not the loader).
    for p in [&phases[0], &phases[2]] {
        let idle = 1.0 - busy_between(&busy, p.start, p.end);
        assert!(
            p.data_wait_fraction < 0.1 && idle < 0.25,
            "{}: idle {idle:.3}, data-wait {:.3}",
            p.name,
            p.data_wait_fraction
        );
    }
}

#[test]
fn one_second_windows_classify_each_phase() {
    // The agent's default window is 1 s: about five samples. Check that real sparsity still puts
    // (nearly) every window of a phase on the right side of the GPU-bound threshold.
    let (timeline, truth) = (load("timeline.json"), load("truth.json"));
    let busy = integrate(&timeline, truth["pid"].as_u64().unwrap());
    for p in phases(&truth) {
        let (mut right, mut total) = (0, 0);
        let mut t = p.start + 1.0; // skip the phase's first second (DataLoader start-up)
        while t + 1.0 <= p.end {
            let idle = 1.0 - busy_between(&busy, t, t + 1.0);
            let gpu_bound = idle < 0.25;
            right += usize::from(gpu_bound == (p.name != "io_bound"));
            total += 1;
            t += 1.0;
        }
        eprintln!(
            "{}: {right}/{total} one-second windows classified right",
            p.name
        );
        assert!(
            total >= 15 && right * 10 >= total * 9,
            "{}: {right}/{total}",
            p.name
        );
    }
}
