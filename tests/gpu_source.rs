//! The GPU source against the fake NVML: when a round reuses the last process lists and when it
//! must ask the driver again.
use gpuwatch::events::EventCounters;
use gpuwatch::sources::gpu::{GpuSource, GpuSourceConfig, LISTS_AT_MOST_EVERY};
use serde_json::json;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

const GIB: u64 = 1 << 30;

fn fake_lib() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/libnvidia_ml_fake.so")
}

fn sleeper() -> Child {
    Command::new("sleep").arg("600").spawn().unwrap()
}

/// Rewrites the scenario and waits until the fake can see the change (it compares size and
/// modification time).
fn write(path: &std::path::Path, scenario: &serde_json::Value) {
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(path, scenario.to_string()).unwrap();
    // The fake's driver thread looks every 10 ms.
    std::thread::sleep(Duration::from_millis(50));
}

fn pids(gpu: &mut GpuSource) -> Vec<u32> {
    let mut p: Vec<u32> = gpu.collect()[0].processes.iter().map(|p| p.pid).collect();
    p.sort_unstable();
    p
}

#[test]
fn process_lists_are_read_again_whenever_they_may_have_changed() {
    let (mut a, mut b) = (sleeper(), sleeper());
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let proc_ = |pid: u32, mem: u64| json!({"pid": pid, "used_memory_bytes": mem});
    let one = |procs: Vec<serde_json::Value>| json!({"devices": [{"uuid": "GPU-lists", "processes": procs}]});
    write(&scenario, &one(vec![proc_(a.id(), 2 * GIB)]));
    let _lock = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("FAKE_NVML_SCENARIO", &scenario);
    let config = GpuSourceConfig {
        lib_path: Some(fake_lib()),
        ..GpuSourceConfig::default()
    };
    let mut gpu = GpuSource::open(&config, Arc::new(EventCounters::default())).unwrap();

    // Steady: the device's used memory does not move, so the lists are reused.
    for _ in 0..5 {
        assert_eq!(pids(&mut gpu), [a.id()]);
    }
    assert_eq!(gpu.list_reads(), (1, 4));

    // A second process allocates: the device's memory moves and it is listed at once.
    write(
        &scenario,
        &one(vec![proc_(a.id(), 2 * GIB), proc_(b.id(), GIB)]),
    );
    let mut both = vec![a.id(), b.id()];
    both.sort_unstable();
    assert_eq!(pids(&mut gpu), both);
    assert_eq!(gpu.list_reads().0, 2);

    // A listed process dies and the driver stops listing it, its memory not yet freed in the
    // device figure: the lists stand until the sampler, which checks every listed PID, says
    // one is gone.
    let used_by_both = gpu.collect()[0].memory_used_bytes.unwrap();
    b.kill().unwrap();
    b.wait().unwrap();
    write(
        &scenario,
        &json!({"devices": [{"uuid": "GPU-lists", "memory_used_bytes": used_by_both,
            "processes": [proc_(a.id(), 2 * GIB)]}]}),
    );
    assert_eq!(pids(&mut gpu), both, "the device figure did not move");
    gpu.relist(0);
    assert_eq!(pids(&mut gpu), [a.id()]);
    assert_eq!(gpu.list_reads().0, 3);

    // Whatever the memory says, the lists are read at least every LISTS_AT_MOST_EVERY rounds:
    // here the device figure is pinned while a process changes (no real driver does that).
    let pinned = |mem: u64| {
        json!({"devices": [{"uuid": "GPU-lists", "memory_used_bytes": 5 * GIB,
            "processes": [proc_(a.id(), mem)]}]})
    };
    write(&scenario, &pinned(2 * GIB));
    let mem = |gpu: &mut GpuSource| gpu.collect()[0].processes[0].used_memory_bytes;
    assert_eq!(
        mem(&mut gpu),
        Some(2 * GIB),
        "the device figure moved: read"
    );
    write(&scenario, &pinned(3 * GIB));
    let seen: Vec<Option<u64>> = (0..LISTS_AT_MOST_EVERY).map(|_| mem(&mut gpu)).collect();
    let stale = seen.iter().take_while(|m| **m == Some(2 * GIB)).count();
    assert_eq!(stale as u32, LISTS_AT_MOST_EVERY - 1, "{seen:?}");
    assert_eq!(seen.last(), Some(&Some(3 * GIB)));
    a.kill().unwrap();
    a.wait().unwrap();
}

/// The sampler asks for the lists again when a listed process is gone: the round after it died
/// no longer lists it, though the device's figure never moved.
#[test]
fn the_sampler_relists_a_gpu_whose_listed_process_is_gone() {
    use gpuwatch::sampler::{Sampler, SamplerConfig};
    let (mut a, mut b) = (sleeper(), sleeper());
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let procs = |pids: &[u32]| {
        json!({"devices": [{"uuid": "GPU-relist", "memory_used_bytes": 4 * GIB,
            "processes": pids.iter().map(|p| json!({"pid": p, "used_memory_bytes": GIB})).collect::<Vec<_>>()}]})
    };
    write(&scenario, &procs(&[a.id(), b.id()]));
    let config = SamplerConfig {
        gpu: Some(GpuSourceConfig {
            lib_path: Some(fake_lib()),
            ..GpuSourceConfig::default()
        }),
        probes: false,
        ..SamplerConfig::default()
    };
    // Another test in this binary sets the variable to its own file: take it for this one.
    let _lock = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("FAKE_NVML_SCENARIO", &scenario);
    let mut sampler = Sampler::new(&config, None, Arc::new(EventCounters::default()));
    // One round, published at once: its GPU processes, and whether each was found gone.
    let listed = |sampler: &mut Sampler| -> Vec<(u32, bool)> {
        let mut snaps = sampler.round();
        snaps.extend(sampler.flush());
        let mut p: Vec<(u32, bool)> = snaps.last().unwrap().gpus[0]
            .processes
            .iter()
            .map(|p| (p.reading.pid, p.vanished))
            .collect();
        p.sort_unstable();
        p
    };
    let mut both = vec![(a.id(), false), (b.id(), false)];
    both.sort_unstable();
    assert_eq!(listed(&mut sampler), both);
    b.kill().unwrap();
    b.wait().unwrap();
    write(&scenario, &procs(&[a.id()]));
    let gone: Vec<(u32, bool)> = listed(&mut sampler);
    assert!(gone.contains(&(b.id(), true)), "{gone:?}");
    assert_eq!(listed(&mut sampler), [(a.id(), false)]);
    a.kill().unwrap();
    a.wait().unwrap();
}

static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
