//! A container's own configuration, end to end with real Docker: a full `/dev/shm`, a CPU quota
//! below two busy loader processes, GPUs declared in every form Docker without the NVIDIA
//! toolkit accepts (`NVIDIA_VISIBLE_DEVICES` by UUID, index and `all`; `--device` of real
//! character nodes 195:N made with mknod) resolved against fake GPUs, and the
//! `gpu_allocated_idle` alert for a GPU given and not used. (`--gpus` needs the NVIDIA toolkit
//! in the daemon; its device-request forms are unit-tested on inspect responses.)

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use support::*;

const GIB: u64 = 1 << 30;

fn check<'a>(report: &'a Value, check: &str, subject: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["check"] == check && c["subject"] == subject)
        .unwrap_or_else(|| panic!("no {check} check for {subject} in {report:#}"))
}

#[test]
fn doctor_names_a_full_shm_and_a_quota_below_the_loaders_demand() {
    require_root();
    // Two loader-like workers hand 15 MiB of batches through a 16 MiB /dev/shm.
    let shm = Container::start_with(
        &unique("cfg-shm"),
        &[],
        &["--shm-size", "16m"],
        "(dd if=/dev/zero of=/dev/shm/w0 bs=1M count=8 2>/dev/null; sleep 3600) & \
         (dd if=/dev/zero of=/dev/shm/w1 bs=1M count=7 2>/dev/null; sleep 3600) & wait",
    );
    // Two busy loader processes under half a core.
    let quota = Container::start_with(
        &unique("cfg-cpus"),
        &[],
        &["--cpus", "0.5"],
        "(while :; do :; done) & (while :; do :; done) & wait",
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-00000000-0000-0000-0000-00000000c0f0"}]}).to_string(),
    )
    .unwrap();
    let out = gpuwatch_on(&scenario)
        .args(["doctor", "--json", "--window", "4s"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(2), "a risk gates the launch");

    let c = check(&report, "container_shm", &shm.name);
    assert_eq!(c["status"], "risk", "{c:#}");
    assert!(
        c["value"]
            .as_str()
            .unwrap()
            .starts_with("15 MiB of 16 MiB used"),
        "{c:#}"
    );
    assert!(
        c["action"].as_str().unwrap().contains("--shm-size"),
        "{c:#}"
    );

    let c = check(&report, "container_cpu_limit", &quota.name);
    assert_eq!(c["status"], "risk", "{c:#}");
    let value = c["value"].as_str().unwrap();
    assert!(value.contains("limit 0.50 cores"), "{c:#}");
    assert!(value.contains("2 busy loader processes"), "{c:#}");
    assert!(c["action"].as_str().unwrap().contains("--cpus 2"), "{c:#}");
    // The quota's container has the default 64 MiB /dev/shm but holds no GPU: not flagged.
    assert_eq!(check(&report, "container_shm", &quota.name)["status"], "ok");
}

#[test]
fn a_one_shot_doctor_sees_a_quota_that_throttled_workers_now_waiting() {
    require_root();
    // The training process (the container's main process, holding a fake GPU) and three
    // DataLoader workers it forked: they spin under a 0.5-core quota for 8 s, then wait, as
    // workers do while the training loop is busy elsewhere.
    let job = Container::start_with(
        &unique("cfg-quota-quiet"),
        &[],
        &["--cpus", "0.5"],
        "w() { end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do :; done; \
         exec sleep 3600; }; w & w & w & wait",
    );
    std::thread::sleep(std::time::Duration::from_secs(10));
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-00000000-0000-0000-0000-00000000c0f1",
            "processes": [{"pid": job.pid, "used_memory_bytes": GIB, "sm_util": 10}]}]})
        .to_string(),
    )
    .unwrap();
    let out = gpuwatch_on(&scenario)
        .args(["doctor", "--json", "--window", "3s"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let c = check(&report, "container_cpu_limit", &job.name);
    let value = c["value"].as_str().unwrap();
    assert_eq!(c["status"], "risk", "{c:#}");
    assert!(
        value.contains("limit 0.50 cores; 3 DataLoader workers"),
        "{c:#}"
    );
    // Nothing was throttled in the window; nearly every period before it was.
    assert!(value.contains("throttled 0% of the window"), "{c:#}");
    assert!(
        value.contains("% of its quota periods since it started"),
        "{c:#}"
    );
    let action = c["action"].as_str().unwrap();
    assert!(
        action.contains("3 DataLoader workers and the training loop share 0.50 CPUs")
            && action.contains("--cpus 4")
            && action.contains("num_workers=1"),
        "{c:#}"
    );
}

#[test]
fn doctor_checks_the_gpus_the_launch_will_use_and_calls_a_busy_one_busy() {
    require_root();
    // Another team's job keeps GPU 0 busy and warm; GPU 1 is free and cool.
    let other = Container::start(&unique("cfg-other-team"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [
            {"uuid": "GPU-00000000-0000-0000-0000-0000000000b0", "temperature": 62,
             "processes": [{"pid": other.pid, "used_memory_bytes": 20 * GIB, "sm_util": 94}]},
            {"uuid": "GPU-00000000-0000-0000-0000-0000000000b1", "temperature": 34}]})
        .to_string(),
    )
    .unwrap();
    let doctor = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = gpuwatch_on(&scenario);
        cmd.args(["doctor", "--json", "--window", "2s"]).args(args);
        cmd.env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("NVIDIA_VISIBLE_DEVICES");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), report)
    };
    let temperature_rows = |r: &Value| -> Vec<(String, String)> {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["check"] == "start_temperature")
            .map(|c| {
                (
                    c["subject"].as_str().unwrap().to_owned(),
                    c["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    // Every GPU: the busy one is busy, with whom; it does not hold the launch.
    let (_, all) = doctor(&[], &[]);
    let busy = check(&all, "gpu_in_use", "GPU 0");
    assert_eq!(busy["status"], "warning", "{busy:#}");
    assert_eq!(
        busy["value"],
        format!("busy 94% with {} (62 °C)", other.name),
        "{busy:#}"
    );
    assert!(
        temperature_rows(&all).iter().all(|(gpu, _)| gpu != "GPU 0"),
        "a GPU in use is not judged by its temperature: {all:#}"
    );
    // The launch's GPU only, from --gpu or the environment CUDA reads.
    for (args, env) in [
        (&["--gpu", "1"][..], &[][..]),
        (
            &[][..],
            &[(
                "CUDA_VISIBLE_DEVICES",
                "GPU-00000000-0000-0000-0000-0000000000b1",
            )][..],
        ),
    ] {
        let (_, r) = doctor(args, env);
        assert_eq!(
            temperature_rows(&r),
            [("GPU 1".to_owned(), "ok".to_owned())],
            "{args:?} {env:?}"
        );
        assert_eq!(check(&r, "launch_gpus", "host")["status"], "ok");
    }
    // A GPU the host does not have is a risk that names it.
    let (code, r) = doctor(&["--gpu", "7"], &[]);
    assert_eq!(code, Some(2));
    let c = check(&r, "launch_gpus", "host");
    assert_eq!(c["status"], "risk", "{c:#}");
    assert!(
        c["action"]
            .as_str()
            .unwrap()
            .contains("no such GPU among the 2"),
        "{c:#}"
    );
}

#[test]
fn a_page_cache_that_fills_is_not_the_containers_memory() {
    require_root();
    // A loader reading its 96 MiB dataset with ordinary reads, over and over: the page cache
    // charged to the container fills; the job's own memory stays small.
    let job = Container::start_with(
        &unique("cfg-cache"),
        &[],
        &["--memory", "512m"],
        "dd if=/dev/urandom of=/tmp/data bs=1M count=96 2>/dev/null; \
         while :; do cat /tmp/data > /dev/null; done",
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"devices": [{"uuid": "GPU-00000000-0000-0000-0000-00000000c0f2",
            "processes": [{"pid": job.pid, "used_memory_bytes": GIB, "sm_util": 50}]}]})
        .to_string(),
    )
    .unwrap();
    // Thresholds the cache passes: 32 MiB ok, 64 MiB risk.
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "doctor:\n  container_memory_ok: 32MiB\n  container_memory_risk: 64MiB\n",
    )
    .unwrap();
    let out = gpuwatch_on(&scenario)
        .arg("-c")
        .arg(&config)
        .args(["doctor", "--json", "--window", "3s"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let c = check(&report, "container_memory", &job.name);
    assert_eq!(c["status"], "ok", "{c:#}");
    let value = c["value"].as_str().unwrap();
    assert!(value.contains(" own (page cache "), "{c:#}");
}

/// A character device with NVIDIA's major, as the driver makes `/dev/nvidiaN`.
fn gpu_node(dir: &Path, minor: u32) -> String {
    let path = dir.join(format!("nvidia{minor}"));
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mknod(2) with a NUL-terminated path; makedev of two small numbers.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(195, minor)) };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    path.display().to_string()
}

#[test]
fn gpu_claims_resolve_and_a_given_gpu_left_unused_fires() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let uuid = |i: u32| format!("GPU-00000000-0000-0000-0000-0000000000a{i}");
    let (node0, node1) = (gpu_node(dir.path(), 0), gpu_node(dir.path(), 1));
    let used = Container::start_with(
        &unique("cfg-node0"),
        &[],
        &["--device", &format!("{node0}:/dev/nvidia0")],
        "sleep 3600",
    );
    let idle = Container::start_with(
        &unique("cfg-node1"),
        &[],
        &["--device", &format!("{node1}:/dev/nvidia1")],
        "sleep 3600",
    );
    let by_uuid = Container::start_with(
        &unique("cfg-env-uuid"),
        &[],
        &["-e", &format!("NVIDIA_VISIBLE_DEVICES={}", uuid(2))],
        "sleep 3600",
    );
    let by_index = Container::start_with(
        &unique("cfg-env-index"),
        &[],
        &["-e", "NVIDIA_VISIBLE_DEVICES=1,7"],
        "sleep 3600",
    );
    let all = Container::start_with(
        &unique("cfg-env-all"),
        &[],
        &["-e", "NVIDIA_VISIBLE_DEVICES=all"],
        "sleep 3600",
    );
    let garbage = Container::start_with(
        &unique("cfg-env-garbage"),
        &[],
        &["-e", "NVIDIA_VISIBLE_DEVICES=gpu0"],
        "sleep 3600",
    );
    let scenario = json!({"devices": [
        {"uuid": uuid(0), "processes": [{"pid": used.pid, "used_memory_bytes": 2 * GIB, "sm_util": 80}]},
        {"uuid": uuid(1)},
        {"uuid": uuid(2)},
    ]});
    let run = snapshot(&scenario, &["--no-ebpf"]);
    assert!(run.status.success(), "{}", run.stderr);
    let gpus =
        |c: &Container| workload(&run.json, &format!("docker:{}", c.id))["config"]["gpus"].clone();

    let g = gpus(&used);
    assert_eq!(g["claims"][0]["via"], "device_nodes", "{g:#}");
    assert_eq!(
        g["gpus"],
        json!([{"index": 0, "uuid": uuid(0), "in_use": true, "memory_bytes": 2 * GIB}])
    );
    let g = gpus(&idle);
    assert_eq!(g["gpus"][0]["index"], 1, "{g:#}");
    assert_eq!(g["gpus"][0]["in_use"], false);

    // Under runc the variable gives nothing, but what it names is resolved and said.
    let g = gpus(&by_uuid);
    assert_eq!(g["claims"][0]["applied"], false, "{g:#}");
    assert!(
        g["claims"][0]["note"].as_str().unwrap().contains("runc"),
        "{g:#}"
    );
    assert_eq!(g["claims"][0]["gpus"], json!([2]));
    assert_eq!(g["gpus"], json!([]));
    let g = gpus(&by_index);
    assert_eq!(g["claims"][0]["gpus"], json!([1]), "{g:#}");
    assert!(
        g["claims"][0]["unresolved"][0]
            .as_str()
            .unwrap()
            .starts_with("7: no such GPU among the 3"),
        "{g:#}"
    );
    assert_eq!(gpus(&all)["claims"][0]["gpus"], json!([0, 1, 2]));
    let g = gpus(&garbage);
    assert_eq!(g["claims"][0]["devices"]["kind"], "unparsed", "{g:#}");
    assert_eq!(g["claims"][0]["gpus"], json!([]));

    // The alert: the GPU given by --device and never used fires after its `for`; nothing else.
    let config = dir.path().join("gpuwatch.yaml");
    std::fs::write(
        &config,
        "interval: 250ms\nalerts:\n  rules:\n    gpu_allocated_idle: {for: 1s}\n",
    )
    .unwrap();
    let scenario_path = dir.path().join("scenario.json");
    std::fs::write(&scenario_path, scenario.to_string()).unwrap();
    let mut child = gpuwatch_on(&scenario_path)
        .arg("-c")
        .arg(&config)
        .args(["watch", "--json", "--no-ebpf", "--duration", "4s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines: Vec<Value> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "watch: {status}");
    // Of this test's containers (a host may run others with GPUs declared).
    let ours = [&used, &idle, &by_uuid, &by_index, &all, &garbage].map(|c| c.name.as_str());
    let fired: Vec<(String, u64)> = lines
        .iter()
        .filter(|n| n["status"] == "firing" && n["alert"]["rule"] == "gpu_allocated_idle")
        .filter(|n| {
            ours.contains(
                &n["alert"]["subject"]["container"]["name"]
                    .as_str()
                    .unwrap_or(""),
            )
        })
        .map(|n| {
            (
                n["alert"]["subject"]["container"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                n["alert"]["subject"]["gpu"]["index"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(fired, [(idle.name.clone(), 1)], "{lines:#?}");
}
