//! The CUDA driver probes end to end: the fake driver library (`tests/fake-cuda`) bind-mounted
//! into real containers as the NVIDIA toolkit mounts the host's library, a job in each calling
//! it through `dlopen` as the CUDA runtime does, the real uprobes on the real kernel, and the
//! fake NVML listing the jobs as GPU processes.
//!
//! - exact counts per container, through one attachment to the one inode both containers map;
//! - the host-side verdicts of jobs scripted on what the H100 host measured
//!   (tests/fixtures/cuda-calls-h100): copies, launches, a synchronise held by a host
//!   function, the loop's own CPU work;
//! - adaptive attachment: nothing attached while no GPU idles under a busy loop, attached while
//!   one does, detached after the linger (a job that keeps launching is then counted no more).

use serde_json::{json, Value};
use support::*;

/// The tests that time spinning jobs hold this: on 2 CPUs, two of them at once would stretch
/// each other's copies and launches.
static CPU_TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cpu_timed() -> std::sync::MutexGuard<'static, ()> {
    CPU_TIMED.lock().unwrap_or_else(|p| p.into_inner())
}

/// One fake GPU per job, each job its only process at `sm_util` (the device figure the H100
/// showed for that kind of job).
fn scenario(jobs: &[(&Container, u32)]) -> Value {
    let devices: Vec<Value> = jobs
        .iter()
        .enumerate()
        .map(|(i, (c, sm))| {
            json!({
                "uuid": format!("GPU-00000000-0000-0000-0000-{i:012}"),
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_bytes": 85_899_345_920u64,
                "processes": [{"pid": c.pid, "used_memory_bytes": 2u64 << 30, "sm_util": sm}],
            })
        })
        .collect();
    json!({ "devices": devices })
}

fn cuda<'a>(snap: &'a Value, c: &Container) -> &'a Value {
    let w = workload(snap, &format!("docker:{}", c.id));
    assert!(
        w["cuda"].is_object(),
        "no cuda window for {}: {w:#}",
        c.name
    );
    &w["cuda"]
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{} missing in {v:#}", path.join(".")))
}

fn f(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{} missing in {v:#}", path.join(".")))
}

#[test]
fn calls_are_counted_per_container_through_one_attachment() {
    require_root();
    let go = tempfile::tempdir().unwrap();
    let trigger = format!("{}:/go", go.path().display());
    let a = cuda_container(
        &unique("cuda-a"),
        &[],
        &["-v", &trigger],
        "--wait /go/start launch:5000 h2d:1048576 h2d:1048576 d2h:4096 sync",
    );
    let b = cuda_container(
        &unique("cuda-b"),
        &[],
        &["-v", &trigger],
        "--wait /go/start launch:300 item item item",
    );
    let run = snapshot_around_baseline(
        &scenario(&[(&a, 30), (&b, 30)]),
        &["--window", "2s"],
        || std::fs::write(go.path().join("start"), "").unwrap(),
    );
    assert!(run.status.success(), "{}", run.stderr);
    let s = &run.json;
    assert_eq!(s["sources"]["cuda"]["up"], true, "{:#}", s["sources"]);
    let libs = s["cuda_tracing"]["libraries"]
        .as_array()
        .expect("libraries");
    assert_eq!(libs.len(), 1, "one inode for both containers: {libs:#?}");
    assert_eq!(libs[0]["attached"], true);
    assert_eq!(libs[0]["path"], "/opt/cuda/libcuda.so.1");
    // every entry point the fake exports that gpuwatch probes
    assert_eq!(libs[0]["entry_points"], 12, "{:#}", libs[0]);

    let ca = cuda(s, &a);
    assert_eq!(ca["traced"], true, "{ca:#}");
    let t = &ca["total"];
    assert_eq!(u(t, &["launches"]), 5000);
    assert_eq!(u(t, &["h2d", "count"]), 2);
    assert_eq!(u(t, &["h2d", "bytes"]), 2 << 20);
    assert_eq!(u(t, &["d2h", "count"]), 1);
    assert_eq!(u(t, &["d2h", "bytes"]), 4096);
    // The stream synchronise after each MiB copy waited for that copy, and so did the one after
    // the 4-KiB copy (no kernel was launched since the last synchronise: the stream held only
    // the copy); the context synchronise is a synchronisation.
    assert_eq!(u(t, &["syncs"]), 1);
    assert!(f(t, &["d2h", "wait_seconds"]) > 0.0, "{t:#}");
    // The copies ran back to back: the job's own time between them is counted as issuing them.
    assert!(f(t, &["h2d", "between_seconds"]) > 0.0, "{t:#}");
    // 1 MiB at the fake's 8.2 GB/s: 128 µs in each call
    let call = f(t, &["h2d", "call_seconds"]);
    assert!((0.000_2..0.05).contains(&call), "{call}");
    // a single-threaded job: its main thread made every call
    assert_eq!(
        ca["processes"][0]["main_thread"],
        ca["processes"][0]["calls"]
    );
    assert_eq!(u(&ca["processes"][0], &["pid"]), u64::from(a.pid));

    let cb = cuda(s, &b);
    let t = &cb["total"];
    assert_eq!(u(t, &["launches"]), 303, "300 and one per .item(): {t:#}");
    assert_eq!(u(t, &["d2h", "count"]), 3);
    assert_eq!(u(t, &["d2h", "bytes"]), 12);
    assert_eq!(u(t, &["syncs"]), 3);
    assert_eq!(u(t, &["h2d", "count"]), 0);
}

/// The verdict of each job of `jobs` (container, sm_util) over one 3-s window.
fn verdicts(jobs: &[(&Container, u32)]) -> Value {
    let run = snapshot(&scenario(jobs), &["--window", "3s"]);
    assert!(run.status.success(), "{}", run.stderr);
    run.json
}

fn verdict<'a>(s: &'a Value, c: &Container) -> &'a Value {
    let v = &workload(s, &format!("docker:{}", c.id))["verdict"];
    assert!(v.is_object(), "no verdict for {}", c.name);
    v
}

/// A folder the jobs write their reports to (`cuda_job --report /r/NAME`), and the `docker
/// run` arguments that mount it.
fn reports() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let mount = format!("{}:/r", dir.path().display());
    (dir, mount)
}

/// Within `tolerance` (absolute): gpuwatch's figure against the job's own.
fn near(what: &str, agent: f64, job: f64, tolerance: f64, v: &Value) {
    assert!(
        (agent - job).abs() <= tolerance,
        "{what}: gpuwatch {agent:.3}, the job's own {job:.3} (tolerance {tolerance}): {v:#}"
    );
}

#[test]
fn pageable_copies_and_the_loops_own_cpu_work_get_their_verdicts() {
    require_root();
    let _cpu = cpu_timed();
    let (dir, mount) = reports();
    // The H100's pageable-copy step: 256 MiB copied (32.8 ms, the fake's 8.2 GB/s), then 13
    // matmuls of 1.4 ms the loop waits for; the device read 44 % busy.
    let copies = cuda_container(
        &unique("cuda-copies"),
        &[("FAKE_CUDA_KERNEL_US", "1400")],
        &["-v", &mount],
        "--report /r/copies --seconds 600 h2d:268435456 launch:13 sync",
    );
    // The H100's trainer_cpu step: 25 ms of its own work, ~2 ms of GPU work, .item(); 6 %.
    let cpu = cuda_container(
        &unique("cuda-cpu"),
        &[("FAKE_CUDA_KERNEL_US", "400")],
        &["-v", &mount],
        "--report /r/cpu --seconds 600 cpu:25000 launch:5 item",
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = verdicts(&[(&copies, 44), (&cpu, 6)]);
    let window = f(&s, &["window_seconds"]);

    // Copying ~32.8 of every ~51 ms, whatever this machine's speed: the share the job timed
    // itself in the same window.
    let v = verdict(&s, &copies);
    assert_eq!(v["kind"], "host-bound: transfers", "{v:#}");
    let job = JobReport::read(&dir.path().join("copies")).in_window(&s);
    near(
        "copy share",
        f(v, &["host_bound_share"]),
        job.copy_s / window,
        0.1,
        v,
    );
    assert!(v["advice"].as_str().unwrap().contains("pageable"), "{v:#}");
    let t = &cuda(&s, &copies)["total"];
    // (the job reports between its 33-ms copies: a copy at each end of the window either way)
    near("copies", u(t, &["h2d", "count"]) as f64, job.h2d, 2.0, t);
    assert_eq!(
        u(t, &["h2d", "bytes"]),
        u(t, &["h2d", "count"]) * (256 << 20)
    );

    let v = verdict(&s, &cpu);
    assert_eq!(v["kind"], "host-bound: CPU", "{v:#}");
    let job = JobReport::read(&dir.path().join("cpu")).in_window(&s);
    near(
        "own CPU share",
        f(v, &["host_bound_share"]),
        job.cpu_s / window,
        0.1,
        v,
    );
}

#[test]
fn launch_bound_and_sync_held_jobs_get_their_verdicts() {
    require_root();
    let _cpu = cpu_timed();
    let (dir, mount) = reports();
    // The H100's one-element-kernel loop: 7.5 µs of host time a launch, 2.7 µs of GPU; 31 %.
    let launches = cuda_container(
        &unique("cuda-launch"),
        &[],
        &["-v", &mount],
        "--report /r/launch --seconds 600 launch:1000:7.5 sync",
    );
    // The H100's sync job: 1.3 ms of matmul, a host function holding the stream 8 ms, then
    // torch.cuda.synchronize(); 14 %.
    let sync = cuda_container(
        &unique("cuda-sync"),
        &[("FAKE_CUDA_KERNEL_US", "1300")],
        &["-v", &mount],
        "--report /r/sync --seconds 600 launch:1 hostfn:8000 sync",
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = verdicts(&[(&launches, 31), (&sync, 14)]);
    let window = f(&s, &["window_seconds"]);

    // As many launches as the job made in the window, however fast this machine let it make
    // them (a probe's hit costs ~9 µs on the development VM, ~1 on the H100 host).
    let v = verdict(&s, &launches);
    assert_eq!(v["kind"], "host-bound: launches", "{v:#}");
    let job = JobReport::read(&dir.path().join("launch")).in_window(&s);
    let counted = u(&cuda(&s, &launches)["total"], &["launches"]) as f64;
    near("launches", counted, job.launches, 0.05 * job.launches, v);
    near(
        "launches a second",
        f(v, &["host", "launches_per_second"]),
        job.launches / window,
        0.05 * job.launches / window,
        v,
    );
    assert!(v["advice"].as_str().unwrap().contains("CUDA graphs"));

    // In the synchronise ~9.3 of every ~9.3 ms, the GPU busy 14 % of it: the share of the
    // window it waited with nothing to run is the job's own sync time less the GPU's.
    let v = verdict(&s, &sync);
    assert_eq!(v["kind"], "host-bound: sync", "{v:#}");
    let job = JobReport::read(&dir.path().join("sync")).in_window(&s);
    near(
        "sync share",
        f(v, &["host", "sync_share"]),
        job.sync_s / window,
        0.1,
        v,
    );
    near(
        "sync share while the GPU idled",
        f(v, &["host", "sync_idle_share"]),
        job.sync_s / window - 0.14,
        0.1,
        v,
    );
}

/// `record` rows as JSON, one per line.
fn rows(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn probes_attach_while_a_gpu_idles_under_a_busy_loop_and_detach_after() {
    require_root();
    let _cpu = cpu_timed();
    let dir = tempfile::tempdir().unwrap();
    // A GPU-bound job that keeps launching (never needs the probes), and a launch-bound job
    // that starts 4 s into the recording and stops 6 s later (needs them, then no longer).
    let go = tempfile::tempdir().unwrap();
    let trigger = format!("{}:/go", go.path().display());
    let (job_reports, mount) = reports();
    let busy = cuda_container(
        &unique("cuda-busy"),
        &[],
        &[],
        "--seconds 600 launch:100:50",
    );
    let bound = cuda_container(
        &unique("cuda-bound"),
        &[],
        &["-v", &trigger, "-v", &mount],
        "--wait /go/start --report /r/bound --seconds 6 launch:1000:7.5 sync",
    );
    let scen = dir.path().join("scenario.json");
    std::fs::write(&scen, scenario(&[(&busy, 98), (&bound, 31)]).to_string()).unwrap();
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "sources:\n  nvml_series_interval: 1s\n  cuda_tracing: {linger: 2s}\n",
    )
    .unwrap();
    let out = dir.path().join("rec.jsonl");
    let mut record = gpuwatch_on(&scen)
        .args([
            "record",
            "--format",
            "jsonl",
            "--interval",
            "1s",
            "--duration",
            "17s",
        ])
        .arg("--config")
        .arg(&config)
        .arg("-o")
        .arg(&out)
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(4));
    std::fs::write(go.path().join("start"), "").unwrap();
    assert!(record.wait().unwrap().success());
    let rows = rows(&out);
    assert!(rows.len() >= 12, "{} rows", rows.len());
    let attached: Vec<bool> = rows
        .iter()
        .map(|r| r["cuda_tracing"]["attached"] == true)
        .collect();
    assert!(
        !attached[0] && !attached[1],
        "attached while only the GPU-bound job ran: {attached:?}"
    );
    let on = attached.iter().position(|a| *a).expect("never attached");
    let off = on
        + attached[on..]
            .iter()
            .position(|a| !a)
            .expect("never detached");
    assert!(attached[off..].iter().all(|a| !a), "{attached:?}");
    let timeline: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "attached {} traced {} bound {} busy {} verdict {}",
                r["cuda_tracing"]["attached"],
                cuda(r, &bound)["traced"],
                cuda(r, &bound)["total"]["launches"],
                cuda(r, &busy)["total"]["launches"],
                verdict(r, &bound)["kind"]
            )
        })
        .collect();
    // While attached and the launch-bound job ran through the window: traced, its launches
    // as many as it made, with its verdict; the GPU-bound job's launches counted too. (The
    // windows it starts or ends in hold only part of its run.)
    let job = JobReport::read(&job_reports.path().join("bound"));
    let working: Vec<&Value> = rows[on..off]
        .iter()
        .filter(|r| cuda(r, &bound)["traced"] == true)
        .filter(|r| job.covers(r))
        .collect();
    assert!(!working.is_empty(), "{timeline:#?}");
    for r in &working {
        let made = job.in_window(r).launches;
        let counted = u(cuda(r, &bound), &["total", "launches"]) as f64;
        assert!(
            made > 0.0 && (counted - made).abs() <= 0.05 * made,
            "counted {counted}, the job's own {made}: {timeline:#?}"
        );
        assert_eq!(
            verdict(r, &bound)["kind"],
            "host-bound: launches",
            "{timeline:#?}"
        );
        assert!(
            u(cuda(r, &busy), &["total", "launches"]) > 0,
            "{timeline:#?}"
        );
    }
    // Detached: the busy job launches on, and the kernel counts nothing more.
    for r in &rows[off + 1..] {
        assert_eq!(cuda(r, &busy)["traced"], false);
        assert_eq!(
            u(cuda(r, &busy), &["total", "launches"]),
            0,
            "{:#}",
            cuda(r, &busy)
        );
    }
    assert!(
        rows.len() - off >= 3,
        "detached only at row {off} of {}",
        rows.len()
    );
}

#[test]
fn without_cuda_calls_the_gpus_pcie_traffic_names_the_copies() {
    require_root();
    let _cpu = cpu_timed();
    let copies = cuda_container(
        &unique("cuda-pcie"),
        &[("FAKE_CUDA_KERNEL_US", "1400")],
        &[],
        "--seconds 600 h2d:268435456 launch:13 sync",
    );
    // The H100's pageable-copy step under GPM: 5,070 MiB/s received, 305 sent; 44 % busy.
    // Once with GPM, once on a GPU without it (the driver's throughput counter).
    for gpm in [true, false] {
        let scenario = json!({"devices": [{
            "uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "gpm_supported": gpm,
            "processes": [{"pid": copies.pid, "used_memory_bytes": 2u64 << 30, "sm_util": 44,
                           "pcie_rx_mib_s": 5070.0, "pcie_tx_mib_s": 305.0}],
        }]});
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gpuwatch.yaml");
        std::fs::write(&config, "sources:\n  cuda_tracing: {mode: off}\n").unwrap();
        let run = snapshot(
            &scenario,
            &["--window", "3s", "--config", config.to_str().unwrap()],
        );
        assert!(run.status.success(), "{}", run.stderr);
        let s = &run.json;
        assert_eq!(s["sources"]["cuda"]["up"], false);
        let pcie = &s["gpus"][0]["pcie"];
        let source = if gpm { "gpm" } else { "throughput_counter" };
        assert_eq!(pcie["source"], source, "{pcie:#}");
        let rx = f(pcie, &["rx_bytes_per_second"]) / f64::from(1u32 << 20);
        let tx = f(pcie, &["tx_bytes_per_second"]) / f64::from(1u32 << 20);
        assert!(
            (rx - 5070.0).abs() < 5070.0 * 0.02,
            "{source}: rx {rx} MiB/s"
        );
        assert!((tx - 305.0).abs() < 305.0 * 0.02, "{source}: tx {tx} MiB/s");
        let v = verdict(s, &copies);
        assert_eq!(v["kind"], "host-bound: transfers", "{source}: {v:#}");
        assert!(
            v["host_bound_share"].is_null(),
            "no share without the calls"
        );
        assert!(
            v["evidence"].as_array().unwrap().iter().any(|e| e
                .as_str()
                .unwrap()
                .starts_with("PCIe traffic of its GPUs: 5")),
            "{v:#}"
        );
    }
}

/// The calls of one GPU process of a workload's CUDA window.
fn process_calls(w: &Value, pid: u32) -> &Value {
    w["processes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("no calls of process {pid}: {w:#}"))
}

/// A loop whose backward pass launches from a thread of its own, as autograd's does (the main
/// thread waits on it), and a step copying both ways: every thread's calls are counted, its
/// own; copies from the GPU count as copying as much as copies to it.
#[test]
fn a_second_launching_thread_and_copies_both_ways_are_counted_as_they_were_made() {
    require_root();
    let _cpu = cpu_timed();
    let (dir, mount) = reports();
    let autograd = cuda_container(
        &unique("cuda-autograd"),
        &[],
        &["-v", &mount],
        "--report /r/autograd --seconds 600 launch:500:7.5 bg:launch:500:7.5 item",
    );
    let both = cuda_container(
        &unique("cuda-both-ways"),
        &[("FAKE_CUDA_KERNEL_US", "1400")],
        &["-v", &mount],
        "--report /r/both --seconds 600 h2d:134217728 d2h:134217728 launch:13 sync",
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = verdicts(&[(&autograd, 31), (&both, 44)]);
    let window = f(&s, &["window_seconds"]);

    let c = cuda(&s, &autograd);
    let job = JobReport::read(&dir.path().join("autograd")).in_window(&s);
    let all = u(&c["total"], &["launches"]) as f64;
    near("launches", all, job.launches, 0.05 * job.launches, c);
    // Half of them from the main thread, half from the other.
    let p = process_calls(c, autograd.pid);
    let main = u(p, &["main_thread", "launches"]) as f64;
    near("main thread's launches", main / all, 0.5, 0.02, p);
    let v = verdict(&s, &autograd);
    assert_eq!(v["kind"], "host-bound: launches", "{v:#}");
    near(
        "launches from other threads",
        f(v, &["host", "other_threads_launch_share"]),
        0.5,
        0.02,
        v,
    );
    // The loop is the process: the main thread waits while the other launches.
    assert!(
        f(v, &["host", "trainer_busy_fraction"]) > 0.8,
        "the loop at work: {v:#}"
    );

    let v = verdict(&s, &both);
    assert_eq!(v["kind"], "host-bound: transfers", "{v:#}");
    let job = JobReport::read(&dir.path().join("both")).in_window(&s);
    near(
        "copy share",
        f(v, &["host_bound_share"]),
        job.copy_s / window,
        0.1,
        v,
    );
    let t = &cuda(&s, &both)["total"];
    assert!(f(t, &["d2h", "call_seconds"]) > 0.0, "{t:#}");
    near(
        "copies back",
        u(t, &["d2h", "count"]) as f64,
        job.d2h,
        2.0,
        t,
    );
}

/// Two GPU processes in one container: each runs its own loop, so the container's shares are
/// each loop's (their mean), not their sum, and a loop's work per kernel is over its own
/// kernels.
#[test]
fn two_gpu_processes_of_one_container_are_read_as_two_loops() {
    require_root();
    let _cpu = cpu_timed();
    let (dir, mount) = reports();
    let job = "--seconds 600 h2d:67108864 launch:13 sync";
    let c = cuda_container(
        &unique("cuda-two"),
        &[("FAKE_CUDA_KERNEL_US", "1400")],
        &["-v", &mount],
        &format!("--report /r/one {job} & /opt/cuda/cuda_job --report /r/two {job}"),
    );
    std::thread::sleep(std::time::Duration::from_millis(800));
    // The two loops: the container's first process (its shell exec'ed the second) and the
    // child it started.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", c.pid)).unwrap_or_default();
    let mut loops: Vec<u32> = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", c.pid)).unwrap_or_default();
    if comm.trim() == "cuda_job" {
        loops.push(c.pid);
    }
    assert_eq!(loops.len(), 2, "two loops under {}: {children:?}", c.pid);
    let scenario = json!({"devices": [{
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "processes": loops
            .iter()
            .map(|pid| json!({"pid": pid, "used_memory_bytes": 2u64 << 30, "sm_util": 22}))
            .collect::<Vec<_>>(),
    }]});
    let run = snapshot(&scenario, &["--window", "3s"]);
    assert!(run.status.success(), "{}", run.stderr);
    let s = &run.json;
    let window = f(s, &["window_seconds"]);
    let v = verdict(s, &c);
    assert_eq!(v["kind"], "host-bound: transfers", "{v:#}");
    let one = JobReport::read(&dir.path().join("one")).in_window(s);
    let two = JobReport::read(&dir.path().join("two")).in_window(s);
    let each = (one.copy_s + two.copy_s) / 2.0 / window;
    near(
        "copy share, each loop's",
        f(v, &["host_bound_share"]),
        each,
        0.1,
        v,
    );
    assert_eq!(cuda(s, &c)["processes"].as_array().unwrap().len(), 2);
}
