//! `/metrics` (and the web page's) render time for 1,000 containers × 8 GPUs (each container on all 8 GPUs: 8,000
//! per-GPU container series per family, about 60,000 lines). The target: p99 < 50 ms.
//! Prints p50/p99/max over 200 renders, then lets criterion measure the mean. Run with
//! `cargo xtask bench`.
// A benchmark's set-up that fails is a failed run: it unwraps.
#![allow(clippy::unwrap_used)]
use criterion::{criterion_group, criterion_main, Criterion};
use gpuwatch::model::test_support::{container, gpu, snapshot};
use gpuwatch::model::WorkloadGpuShare;
use gpuwatch::output::prometheus::render;
use gpuwatch::output::published::Published;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

const CONTAINERS: usize = 1_000;
const GPUS: u32 = 8;

fn exported() -> Arc<Published> {
    let gpus = (0..GPUS).map(gpu).collect();
    let workloads: Vec<gpuwatch::model::Workload> = (0..CONTAINERS)
        .map(|i| {
            let mut w = container(&format!("train-{i:04}"));
            w.gpu.processes = GPUS as usize;
            w.gpu.memory_bytes = u64::from(GPUS) << 30;
            w.gpu.busy_fraction = Some(0.8);
            w.gpu.per_gpu = (0..GPUS)
                .map(|g| WorkloadGpuShare {
                    memory_bytes: 1 << 30,
                    busy_fraction: Some(0.8),
                    split: Some(gpuwatch::model::SplitMethod::SoleHolder),
                    device_busy_fraction: Some(0.8),
                    sm_activity_percent: Some(90.0),
                    pids: vec![1000 + i as u32],
                    ..WorkloadGpuShare::new(g, Some(format!("GPU-{g:08}")))
                })
                .collect();
            w
        })
        .collect();
    // The accounting counters as a day of running gives them: busy, idle under two verdicts,
    // the loader's three states.
    let mut accounting = gpuwatch::output::accounting::Accounting::default();
    for w in &workloads {
        let t = accounting.workloads.entry(w.id.clone()).or_default();
        t.gpu_busy_seconds = 3600.0;
        t.loader_on_cpu_seconds = 600.0;
        for kind in [
            gpuwatch::model::VerdictKind::GpuBound,
            gpuwatch::model::VerdictKind::InputBoundIo,
        ] {
            t.gpu_idle_seconds.insert(kind, 1800.0);
        }
    }
    // The web page's charts full: every series at its most points.
    let mut recent = gpuwatch::output::recent::Recent::default();
    let mut snap = snapshot(1_700_000_000_000, gpus, workloads);
    for i in 0..gpuwatch::output::recent::POINTS as u64 {
        snap.taken_at_unix_ms = 1_700_000_000_000 + i * 5_000;
        recent.add(&snap);
    }
    Arc::new(Published {
        snapshot: snap,
        alerts: Vec::new(),
        xid_totals: BTreeMap::new(),
        accounting,
        recent,
    })
}

fn bench(c: &mut Criterion) {
    let e = exported();
    let mut times: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            let text = render(&e).expect("render");
            std::hint::black_box(text.len());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let bytes = render(&e).expect("render").len();
    println!(
        "\n/metrics, {CONTAINERS} containers x {GPUS} GPUs ({:.1} MiB): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over 200 renders\n",
        bytes as f64 / 1048576.0,
        times[100],
        times[197],
        times[199]
    );
    c.bench_function("metrics_render_1000x8", |b| {
        b.iter(|| render(&e).expect("render"))
    });
    let refresh = std::time::Duration::from_secs(5);
    let t = Instant::now();
    let page = gpuwatch::output::web_page::render(&e, refresh);
    println!(
        "\nweb page, {CONTAINERS} containers x {GPUS} GPUs, charts full: {:.1} MiB in {:.1} ms\n",
        page.len() as f64 / 1048576.0,
        t.elapsed().as_secs_f64() * 1000.0
    );
    c.bench_function("web_page_1000x8", |b| {
        b.iter(|| gpuwatch::output::web_page::render(&e, refresh))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
