//! Faults: each source degrades alone, says why, and loses nothing the others can still tell.

use serde_json::json;
use std::os::unix::process::CommandExt;
use support::*;

fn one_gpu(pid: u32) -> serde_json::Value {
    json!({"devices": [{"uuid": "GPU-f", "processes": [{"pid": pid, "used_memory_bytes": 2 * GIB, "sm_util": 50}]}]})
}

#[test]
fn without_nvml_containers_are_still_listed() {
    require_root();
    let c = Container::start(&unique("nonvml"), &[], "sleep 3600");
    let run = snapshot(
        &json!({}),
        &["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let nvml = &run.json["sources"]["nvml"];
    assert_eq!(nvml["up"], false);
    assert!(
        nvml["detail"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/libnvidia-ml.so.1"),
        "{nvml}"
    );
    assert!(
        run.stderr.contains("GPU source unavailable"),
        "{}",
        run.stderr
    );
    assert_eq!(run.json["gpus"], json!([]));
    let w = workload(&run.json, &format!("docker:{}", c.id));
    assert_eq!(w["name"], c.name);
    assert!(w["memory"]["usage_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn nvml_init_failure_and_per_call_errors_are_reported() {
    require_root();
    let run = snapshot(
        &json!({"init_error": "DRIVER_NOT_LOADED"}),
        &["--no-docker"],
    );
    assert!(run.status.success());
    let detail = run.json["sources"]["nvml"]["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(detail.contains("driver"), "{detail}");

    let run = snapshot(
        &json!({"devices": [
            {"uuid": "GPU-a", "errors": {"nvmlDeviceGetTemperature": "UNKNOWN", "nvmlDeviceGetPowerUsage": "NOT_SUPPORTED"}},
            {"uuid": "GPU-b", "lost": true}
        ]}),
        &["--no-docker"],
    );
    let g = &run.json["gpus"];
    assert_eq!(g[0]["temperature_celsius"], serde_json::Value::Null);
    assert!(g[0]["errors"]["temperature"].is_string(), "{:#}", g[0]);
    assert_eq!(g[0]["power_watts"], serde_json::Value::Null);
    assert!(
        g[0]["errors"].get("power").is_none(),
        "NotSupported is absence, not an error"
    );
    assert_eq!(g[0]["utilization_gpu_percent"], 0);
    assert_eq!(g[1]["lost"], true);
    assert!(
        run.json["internal_events"]["nvml_call_failed"]
            .as_u64()
            .unwrap()
            >= 2
    );
}

fn assert_cgroup_only(run: &Run, c: &Container, why: &str) {
    let docker = &run.json["sources"]["docker"];
    assert_eq!(docker["up"], false);
    assert!(docker["detail"].as_str().unwrap().contains(why), "{docker}");
    assert!(
        run.stderr.contains("identifying containers by cgroup only"),
        "{}",
        run.stderr
    );
    // Still attributed to the right container, from the cgroup path alone.
    let w = workload(&run.json, &format!("docker:{}", c.id));
    assert_eq!(w["name"], &c.id[..12]);
    assert_eq!(w["container"], serde_json::Value::Null);
    assert_eq!(w["gpu"]["memory_bytes"], 2 * GIB);
}

#[test]
fn docker_socket_missing_gives_cgroup_only_identities() {
    require_root();
    let c = Container::start(&unique("nosock"), &[], "sleep 3600");
    let run = snapshot(
        &one_gpu(c.pid),
        &["--docker-socket", "/nonexistent/docker.sock"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_cgroup_only(&run, &c, "/nonexistent/docker.sock");
}

#[test]
fn docker_socket_refused_gives_cgroup_only_identities() {
    require_root();
    let c = Container::start(&unique("refused"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("docker.sock");
    // A socket file nobody listens on: connecting is refused.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let run = snapshot(
        &one_gpu(c.pid),
        &["--docker-socket", sock.to_str().unwrap()],
    );
    assert!(run.status.success(), "{}", run.stderr);
    assert_cgroup_only(&run, &c, sock.to_str().unwrap());
}

#[test]
fn without_bpf_capabilities_stall_tracing_is_off_and_says_why() {
    require_root();
    let c = Container::start(&unique("nocaps"), &[], "sleep 3600");
    let run = snapshot_with(&one_gpu(c.pid), &[], |cmd| {
        // SAFETY: only async-signal-safe prctl calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                for cap in [21, 38, 39] {
                    // CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF out of the bounding set: root's exec
                    // then gets none of them.
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    });
    assert!(run.status.success(), "{}", run.stderr);
    let ebpf = &run.json["sources"]["ebpf"];
    assert_eq!(ebpf["up"], false);
    let detail = ebpf["detail"].as_str().unwrap();
    assert!(
        detail.contains("stall tracing unavailable")
            && detail.contains("CAP_BPF")
            && detail.contains("CAP_PERFMON"),
        "{detail}"
    );
    assert!(run.stderr.contains("CAP_BPF"), "{}", run.stderr);
    // Everything else still works.
    let w = workload(&run.json, &format!("docker:{}", c.id));
    assert_eq!(w["gpu"]["memory_bytes"], 2 * GIB);
    assert_eq!(w["stalls"], serde_json::Value::Null);
    // The verdict falls back to GPU-side evidence and says why.
    let v = &w["verdict"];
    assert!(
        v["advice"]
            .as_str()
            .unwrap()
            .contains("stall tracing unavailable")
            || v["kind"] == "GPU-bound",
        "{v:#}"
    );
}

/// `record` with NVML's series call hung: SIGTERM ends it within seconds, naming the step,
/// instead of waiting on the driver forever.
#[test]
fn a_hung_nvml_call_does_not_hold_record_past_a_stop() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"delays_ms": {"nvmlDeviceGetSamples": 3_600_000}, "devices": [{"uuid": "GPU-hung"}]})
            .to_string(),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let out = dir.path().join("gpu_log.csv");
    let mut child = gpuwatch_on(&scenario)
        .args([
            "record",
            "--interval",
            "1s",
            "--no-docker",
            "--no-ebpf",
            "-o",
        ])
        .arg(&out)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert!(
        child.try_wait().unwrap().is_none(),
        "record ended by itself"
    );
    let (status, took) = sigterm_and_wait(&mut child);
    assert!(
        took < std::time::Duration::from_secs(6),
        "exit took {took:?}"
    );
    assert_eq!(status.code(), Some(3), "{status}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("stopping without") && text.contains("utilisation series"),
        "{text}"
    );
}

/// NVML that fails at start (a driver still loading) is tried again with back-off: once it
/// answers, the agent has its GPUs without a restart.
#[test]
fn nvml_that_failed_at_start_is_picked_up_once_it_answers() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let devices = json!([{"uuid": "GPU-late", "processes": []}]);
    std::fs::write(
        &scenario,
        json!({"init_error": "DRIVER_NOT_LOADED", "devices": devices}).to_string(),
    )
    .unwrap();
    let out = dir.path().join("rows.jsonl");
    let child = record_jsonl(gpuwatch_on(&scenario), "7s", &out);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    // The driver finishes loading.
    swap_scenario(&scenario, &json!({"devices": devices}));
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let rows = jsonl_rows(&out);
    let first = rows.first().expect("rows");
    assert_eq!(first["sources"]["nvml"]["up"], false, "{first:#}");
    let last = rows.last().unwrap();
    assert_eq!(last["sources"]["nvml"]["up"], true, "{stderr}");
    assert_eq!(last["gpus"][0]["uuid"], "GPU-late");
    assert!(
        stderr.contains("trying again") && stderr.contains("GPU source up"),
        "{stderr}"
    );
}

/// A GPU bound to the driver after the agent opened NVML (NVML enumerates only at open): the
/// driver's list shows it, the agent completes what it had, opens NVML again, and reports both
/// GPUs from then on, with no round lost.
#[test]
fn a_gpu_bound_after_start_is_picked_up_without_a_restart() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let gpu = |uuid: &str| json!({"uuid": uuid, "processes": []});
    std::fs::write(
        &scenario,
        json!({"devices": [gpu("GPU-first")]}).to_string(),
    )
    .unwrap();
    let list = dir.path().join("driver-gpus");
    std::fs::create_dir_all(list.join("0000:18:00.0")).unwrap();
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        format!("sources:\n  nvml_driver_list: {}\n", list.display()),
    )
    .unwrap();
    let out = dir.path().join("rows.jsonl");
    let mut cmd = gpuwatch_on(&scenario);
    cmd.arg("-c").arg(&config);
    let child = record_jsonl(cmd, "9s", &out);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // The second GPU is bound: the driver has it, and lists it.
    swap_scenario(
        &scenario,
        &json!({"devices": [gpu("GPU-first"), gpu("GPU-bound-later")]}),
    );
    std::fs::create_dir(list.join("0000:2a:00.0")).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let rows = jsonl_rows(&out);
    let uuids = |row: &serde_json::Value| -> Vec<String> {
        row["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["uuid"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(uuids(&rows[0]), ["GPU-first"], "{stderr}");
    assert_eq!(
        uuids(rows.last().unwrap()),
        ["GPU-first", "GPU-bound-later"],
        "{stderr}"
    );
    assert!(
        stderr.contains("the driver's GPUs changed (bound since: 0000:2a:00.0; gone since: none)")
            && stderr.contains("GPU source up: 2 GPU(s)"),
        "{stderr}"
    );
    // Every round is there: 9 s at 500 ms, each once, in order.
    assert!(rows.len() >= 16, "{} rows: {stderr}", rows.len());
    let taken: Vec<u64> = rows
        .iter()
        .map(|r| r["taken_at_unix_ms"].as_u64().unwrap())
        .collect();
    assert!(taken.windows(2).all(|w| w[0] < w[1]), "{taken:?}");
}

/// `cmd` (gpuwatch on a fake scenario) recording JSON lines into `out` every 500 ms for
/// `duration`, without Docker or eBPF, its log on a pipe.
fn record_jsonl(
    mut cmd: std::process::Command,
    duration: &str,
    out: &std::path::Path,
) -> std::process::Child {
    cmd.args(["record", "--interval", "500ms", "--duration", duration])
        .args([
            "--no-docker",
            "--no-ebpf",
            "--log",
            "info",
            "--format",
            "jsonl",
            "-o",
        ])
        .arg(out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Replaces the scenario: written whole, then renamed (the fake never reads half a file).
fn swap_scenario(scenario: &std::path::Path, value: &serde_json::Value) {
    let tmp = scenario.with_extension("tmp");
    std::fs::write(&tmp, value.to_string()).unwrap();
    std::fs::rename(&tmp, scenario).unwrap();
}

fn jsonl_rows(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
