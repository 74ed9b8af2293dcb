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
    assert!(run.status.success(), "{}", run.stderr);
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
    assert!(g[1]["errors"]["handle"].is_string(), "{:#}", g[1]);
    // Two failed calls a round (GPU a's temperature, GPU b's handle) in the baseline round and
    // the window's, and GPU b's when it was opened; NotSupported is no failure.
    assert_eq!(run.json["internal_events"]["nvml_call_failed"], 5);
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

/// `snapshot -l` on the fake NVML reading `scenario`, its JSON lines as they come.
fn snapshot_lines(
    scenario: &std::path::Path,
    every: &str,
) -> (
    Running,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    std::process::ChildStderr,
) {
    use std::io::BufRead;
    let mut child = gpuwatch_on(scenario)
        .args([
            "snapshot",
            "-l",
            every,
            "--json",
            "--no-docker",
            "--no-ebpf",
        ])
        .args(["--log", "warn"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let err = child.stderr.take().unwrap();
    (Running(child), out, err)
}

/// A sensor that fails in every round is counted every time and logged once (the agent logged
/// a line per round before: 1,504 lines in 25 minutes for one unreadable cgroup).
#[test]
fn a_call_failing_every_round_is_counted_each_time_and_logged_once() {
    use std::io::Read;
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-f", "errors": {"nvmlDeviceGetTemperature": "UNKNOWN"}}]})
            .to_string(),
    )
    .unwrap();
    let (agent, mut lines, mut stderr) = snapshot_lines(&scenario, "0.2");
    let rows: Vec<serde_json::Value> = (&mut lines)
        .take(12)
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    drop(agent);
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    let failed: Vec<u64> = rows
        .iter()
        .map(|r| r["internal_events"]["nvml_call_failed"].as_u64().unwrap())
        .collect();
    // One failed temperature read per round, each counted (and one more when the GPU was
    // opened, before the first round).
    let per_round: Vec<u64> = failed.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(per_round, [1; 11], "{failed:?} {log}");
    let logged = log.lines().filter(|l| l.contains("temperature")).count();
    assert_eq!(logged, 1, "{log}");
}

/// A GPU that falls off the bus while the agent runs reads lost within one round of it: the
/// round in progress may miss it, the next one may not.
#[test]
fn a_gpu_lost_while_running_reads_lost_in_the_next_round() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    let devices =
        |lost: bool| json!({"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "lost": lost}]});
    std::fs::write(&scenario, devices(false).to_string()).unwrap();
    let (_agent, mut lines, _stderr) = snapshot_lines(&scenario, "0.5");
    let mut next =
        || -> serde_json::Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let before = next();
    assert_eq!(before["gpus"][1]["lost"], false, "{:#}", before["gpus"]);
    swap_scenario(&scenario, &devices(true));
    let _in_progress = next();
    let after = next();
    assert_eq!(after["gpus"][1]["lost"], true, "{:#}", after["gpus"]);
    assert_eq!(after["gpus"][1]["index"], 1);
    assert_eq!(
        after["gpus"][0]["lost"], false,
        "the other GPU is unaffected"
    );
}

/// What a snapshot must show when one NVML call fails: a check on the JSON, `Err` saying what
/// is wrong.
type Degraded = fn(&serde_json::Value) -> Result<(), String>;

/// `gpus[0].errors[field]` names the failure and `gpus[0][value]` is empty (null), while the
/// GPU's other readings and its busy share from the series stay.
fn field_failed(s: &serde_json::Value, field: &str, value: &str) -> Result<(), String> {
    let g = &s["gpus"][0];
    if !g["errors"][field].is_string() {
        return Err(format!("errors.{field} missing: {}", g["errors"]));
    }
    if !value.is_empty() && !g[value].is_null() {
        return Err(format!("{value} is {} despite the failure", g[value]));
    }
    if field != "temperature" && g["temperature_celsius"] != 40 {
        return Err(format!(
            "temperature lost too: {}",
            g["temperature_celsius"]
        ));
    }
    busy_from(s, "utilization_samples")
}

fn busy_from(s: &serde_json::Value, source: &str) -> Result<(), String> {
    let busy = &s["gpus"][0]["busy"];
    let fraction = busy["fraction"].as_f64().unwrap_or(-1.0);
    if busy["source"] != source || (fraction - 0.6).abs() > 0.02 {
        return Err(format!("busy not 0.6 from {source}: {busy}"));
    }
    Ok(())
}

/// One failure per NVML function the agent calls, each with the degraded output it must give:
/// the field it reads empty and the failure named in the GPU's `errors` (or the source down,
/// for the calls without which there are no GPUs), everything else still read, and the
/// failure counted. Without this, a failed Xid watch, ECC read or persistence read was silent
/// in the snapshot: an empty `xid_events` read as "no Xid errors".
#[test]
fn each_nvml_call_that_fails_empties_its_own_field_and_says_so() {
    let table: &[(&str, Degraded)] = &[
        ("nvmlDeviceGetCount_v2", |s| {
            let nvml = &s["sources"]["nvml"];
            let detail = nvml["detail"].as_str().unwrap_or("");
            (nvml["up"] == false && detail.contains("cannot count GPUs") && s["gpus"] == json!([]))
                .then_some(())
                .ok_or(format!("{nvml}"))
        }),
        ("nvmlDeviceGetHandleByIndex_v2", |s| {
            let g = &s["gpus"][0];
            (g["errors"]["handle"].is_string()
                && g["busy"].is_null()
                && g["temperature_celsius"].is_null())
            .then_some(())
            .ok_or(format!("{g}"))
        }),
        ("nvmlDeviceGetUUID", |s| field_failed(s, "uuid", "uuid")),
        ("nvmlDeviceGetName", |s| field_failed(s, "name", "name")),
        ("nvmlDeviceGetMinorNumber", |s| {
            field_failed(s, "minor_number", "minor_number")
        }),
        ("nvmlDeviceGetUtilizationRates", |s| {
            field_failed(s, "utilization", "utilization_gpu_percent")
        }),
        ("nvmlDeviceGetMemoryInfo_v2", |s| {
            field_failed(s, "memory", "memory_used_bytes")
        }),
        ("nvmlDeviceGetTemperature", |s| {
            field_failed(s, "temperature", "temperature_celsius")
        }),
        ("nvmlDeviceGetPowerUsage", |s| {
            field_failed(s, "power", "power_watts")
        }),
        ("nvmlDeviceGetClockInfo", |s| {
            field_failed(s, "sm_clock", "sm_clock_mhz")
        }),
        ("nvmlDeviceGetCurrentClocksThrottleReasons", |s| {
            field_failed(s, "clocks_event_reasons", "")
        }),
        ("nvmlDeviceGetTotalEccErrors", |s| {
            field_failed(s, "ecc_errors", "ecc_uncorrected_volatile")
        }),
        ("nvmlDeviceGetPersistenceMode", |s| {
            field_failed(s, "persistence_mode", "persistence_mode")
        }),
        ("nvmlDeviceGetEnforcedPowerLimit", |s| {
            field_failed(s, "power_limit", "power_limit_watts")
        }),
        ("nvmlDeviceGetComputeRunningProcesses_v3", |s| {
            field_failed(s, "compute_processes", "")?;
            let n = s["gpus"][0]["processes"].as_array().map_or(0, Vec::len);
            (n == 0)
                .then_some(())
                .ok_or(format!("{n} processes listed"))
        }),
        ("nvmlDeviceGetGraphicsRunningProcesses_v3", |s| {
            field_failed(s, "graphics_processes", "")?;
            let n = s["gpus"][0]["processes"].as_array().map_or(0, Vec::len);
            (n == 1)
                .then_some(())
                .ok_or(format!("the compute list lost too: {n}"))
        }),
        ("nvmlDeviceGetSamples", |s| {
            let g = &s["gpus"][0];
            if !g["errors"]["utilization_samples"].is_string() {
                return Err(format!("{}", g["errors"]));
            }
            // GPM's engine activity stands in for the series.
            busy_from(s, "gpm_engine")
        }),
        ("nvmlGpmQueryDeviceSupport", |s| gpm_failed(s)),
        ("nvmlGpmSampleAlloc", |s| gpm_failed(s)),
        ("nvmlGpmSampleGet", |s| {
            field_failed(s, "gpm", "sm_activity")
        }),
        ("nvmlGpmMetricsGet", |s| {
            field_failed(s, "gpm", "sm_activity")
        }),
        ("nvmlDeviceRegisterEvents", |s| xid_failed(s, "registering")),
        ("nvmlEventSetCreate", |s| xid_failed(s, "creating")),
        ("nvmlEventSetWait_v2", |s| xid_failed(s, "reading")),
        ("nvmlSystemGetDriverVersion", |s| {
            let v = &s["host"]["nvml_driver_version"];
            v.is_null().then_some(()).ok_or(format!("{v}"))?;
            busy_from(s, "utilization_samples")
        }),
    ];
    let pid = std::process::id();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = table
            .chunks(table.len().div_ceil(4))
            .map(|chunk| {
                scope.spawn(move || {
                    let mut failed = Vec::new();
                    for (function, degraded) in chunk {
                        let run = snapshot(
                            &json!({"errors": {*function: "UNKNOWN"}, "devices": [{"uuid": "GPU-f",
                                "utilization_gpu": 60, "processes": [
                                    {"pid": pid, "used_memory_bytes": GIB, "sm_util": 60}]}]}),
                            &["--no-docker", "--no-ebpf"],
                        );
                        let counted = run.json["internal_events"]["nvml_call_failed"]
                            .as_u64()
                            .unwrap_or(0);
                        let gpm_open =
                            function.starts_with("nvmlGpm") && !function.ends_with("Get");
                        let outcome = if !run.status.success() {
                            Err(format!("exit {}: {}", run.status, run.stderr))
                        } else if counted == 0
                            && !gpm_open
                            && *function != "nvmlSystemGetDriverVersion"
                            // No GPUs: the source is down, and says why.
                            && *function != "nvmlDeviceGetCount_v2"
                        {
                            Err("not counted in internal_events".to_owned())
                        } else {
                            degraded(&run.json)
                        };
                        if let Err(e) = outcome {
                            failed.push(format!("{function}: {e}"));
                        }
                    }
                    failed
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// GPM that could not be opened: its state says so with the reason; the busy share still comes
/// from the series.
fn gpm_failed(s: &serde_json::Value) -> Result<(), String> {
    let gpm = &s["gpus"][0]["gpm"];
    if gpm["state"] != "failed" || !gpm["detail"].is_string() {
        return Err(format!("{gpm}"));
    }
    busy_from(s, "utilization_samples")
}

/// The Xid watch failed (`doing` it): the GPU's `errors.xid_events` says so, so an empty
/// `xid_events` is not read as "no Xid errors".
fn xid_failed(s: &serde_json::Value, doing: &str) -> Result<(), String> {
    let e = &s["gpus"][0]["errors"]["xid_events"];
    if !e.as_str().is_some_and(|e| e.starts_with(doing)) {
        return Err(format!("errors.xid_events: {e}"));
    }
    busy_from(s, "utilization_samples")
}

/// A GPU before Hopper has no GPM and may lack the series: the busy share then comes from the
/// instantaneous reading (and says so), PCIe traffic from the driver's throughput counter, and
/// GPM is `not_supported`, not failed.
#[test]
fn without_gpm_or_the_series_busy_comes_from_the_reading_and_pcie_from_the_counter() {
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-old", "gpm_supported": false, "utilization_gpu": 60,
            "errors": {"nvmlDeviceGetSamples": "NOT_SUPPORTED"},
            "processes": [{"pid": std::process::id(), "used_memory_bytes": GIB, "sm_util": 60,
                "pcie_rx_mib_s": 100.0}]}]}),
        &["--no-docker", "--no-ebpf"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let g = &run.json["gpus"][0];
    assert_eq!(
        g["errors"],
        json!({}),
        "NotSupported is absence, not failure"
    );
    assert_eq!(g["gpm"]["state"], "not_supported");
    assert_eq!(g["busy"]["source"], "utilization_reading", "{g:#}");
    assert_eq!(g["busy"]["fraction"], 0.6);
    assert_eq!(g["pcie"]["source"], "throughput_counter", "{g:#}");
    // 100 MiB/s as the counter reports it: KB/s (1,000 bytes), truncated to a whole KB/s.
    let rx = g["pcie"]["rx_bytes_per_second"].as_f64().unwrap();
    assert!((rx - 104_857_000.0).abs() < 2_000.0, "{rx}");

    let run = snapshot(
        &json!({"errors": {"nvmlDeviceGetPcieThroughput": "UNKNOWN"}, "devices": [{"uuid": "GPU-old",
            "gpm_supported": false, "processes": []}]}),
        &["--no-docker", "--no-ebpf"],
    );
    let g = &run.json["gpus"][0];
    assert!(g["errors"]["pcie_throughput"].is_string(), "{g:#}");
    assert!(g["pcie"].is_null(), "{g:#}");
}
