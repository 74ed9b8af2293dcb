//! One sampling round against the fake NVML at 8 GPUs × 200 processes (200 live processes, each
//! on all 8 GPUs, as DDP jobs are), with and without attribution. Run with `cargo xtask bench`.
//!
//! eBPF and Docker are off: the bench measures the agent's own per-round work, needs no root,
//! and a Docker request never happens per round anyway (the cache is event-driven). The fake
//! answers at no cost, so the figures are gpuwatch's own work; the round fetches the GPU series
//! every time (the worst case: by default it does every 10 s), which also keeps the rounds held
//! for their series to one or two. The ghost checks run in rotation, as in production.
// A benchmark's set-up that fails is a failed run: it unwraps.
#![allow(clippy::unwrap_used)]
use criterion::{criterion_group, criterion_main, Criterion};
use gpuwatch::events::EventCounters;
use gpuwatch::sampler::{Sampler, SamplerConfig};
use gpuwatch::sources::gpu::{GpuSource, GpuSourceConfig};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;

const GPUS: usize = 8;
const PROCESSES: usize = 200;

fn fake_lib() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("libnvidia_ml_fake.so"))
        .find(|p| p.exists())
        .expect("build the fake NVML first: cargo build --release -p fake-nvml (cargo xtask bench does)")
}

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn bench(c: &mut Criterion) {
    let procs = Processes(
        (0..PROCESSES)
            .map(|_| {
                Command::new("sleep")
                    .arg("600")
                    .spawn()
                    .expect("spawn sleep")
            })
            .collect(),
    );
    let devices: Vec<serde_json::Value> = (0..GPUS)
        .map(|g| {
            let processes: Vec<serde_json::Value> = procs
                .0
                .iter()
                .enumerate()
                .map(|(i, p)| serde_json::json!({"pid": p.id(), "used_memory_bytes": (i as u64 + 1) << 24, "sm_util": i % 100}))
                .collect();
            serde_json::json!({"uuid": format!("GPU-bench-{g}"), "processes": processes})
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&serde_json::json!({ "devices": devices })).unwrap(),
    )
    .unwrap();
    std::env::set_var("FAKE_NVML_SCENARIO", &scenario);
    let gpu_config = GpuSourceConfig {
        lib_path: Some(fake_lib()),
        ..GpuSourceConfig::default()
    };

    let mut group = c.benchmark_group(format!("{GPUS}gpus_x_{PROCESSES}procs"));
    let mut gpu = GpuSource::open(&gpu_config, Arc::new(EventCounters::default())).unwrap();
    let n: usize = gpu.collect().iter().map(|d| d.processes.len()).sum();
    assert_eq!(n, GPUS * PROCESSES);
    group.bench_function("nvml_collect", |b| b.iter(|| gpu.collect()));

    let config = SamplerConfig {
        gpu: Some(gpu_config),
        probes: false,
        series_interval: std::time::Duration::ZERO,
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::new(&config, None, Arc::new(EventCounters::default()));
    let first = sampler.round();
    assert!(first[0]
        .gpus
        .iter()
        .all(|g| g.processes.iter().all(|p| p.workload.is_some())));
    group.bench_function("sampler_round", |b| b.iter(|| sampler.round()));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
