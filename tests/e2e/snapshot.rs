//! End to end: real dockerd, real containers, real eBPF, the real nvml-wrapper loading the fake
//! NVML; `gpuwatch snapshot --json` must attribute every GPU process correctly.
mod support;

use gpuwatch::cgroup::{classify, CgroupMembership};
use serde_json::{json, Value};
use support::*;

/// A loader-like busy loop: short sleeps make the scheduler switch it out constantly.
const BUSY: &str = "while :; do i=0; while [ $i -lt 200 ]; do i=$((i+1)); done; sleep 0.01; done";

#[test]
fn attributes_gpu_processes_to_containers_host_and_skips_vanished() {
    require_root();
    let trainer = Container::start(
        &unique("trainer"),
        &[
            ("com.docker.compose.project", "vision"),
            ("com.docker.compose.service", "trainer"),
        ],
        BUSY,
    );
    let eval = Container::start(&unique("eval"), &[], "sleep 3600");
    let idle = Container::start(&unique("idle"), &[], "sleep 3600");
    let host = HostProcess::spawn();
    let dead = dead_pid();
    // ends during the sampling window: alive in the first round, killed right after it, gone in
    // the second
    let mut short = std::process::Command::new("sleep")
        .arg("3600")
        .spawn()
        .unwrap();
    let short_pid = short.id();
    // reaped as soon as it exits (a zombie would still have a /proc entry)
    let reaper = std::thread::spawn(move || short.wait());

    let scenario = json!({
        "devices": [
            {
                "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                "utilization_gpu": 85,
                "processes": [
                    {"pid": trainer.pid, "used_memory_bytes": 8 * GIB, "sm_util": 80},
                    {"pid": host.pid(), "used_memory_bytes": GIB, "sm_util": 10},
                    {"pid": dead, "used_memory_bytes": 512 << 20},
                    {"pid": short_pid, "used_memory_bytes": 256 << 20}
                ]
            },
            {
                "uuid": "GPU-11111111-1111-1111-1111-111111111111",
                "processes": [
                    {"pid": eval.pid, "used_memory_bytes": 4 * GIB},
                    {"pid": trainer.pid, "used_memory_bytes": 2 * GIB, "sm_util": 40}
                ]
            }
        ]
    });
    let run = snapshot_around_baseline(&scenario, &[], || {
        // SAFETY: kill(2) on our own child, not yet reaped (the reaper waits for this signal).
        unsafe { libc::kill(short_pid as i32, libc::SIGKILL) };
    });
    let s = &run.json;
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(s["schema_version"], 1);
    // This kernel has every tracepoint the probes use; their own failure counters are shown.
    assert_eq!(s["probes"]["missing"], json!([]), "{:#}", s["probes"]);
    for counter in ["map_update_failed", "field_read_failed", "unmatched_end"] {
        assert!(
            s["probes"][counter].is_u64(),
            "{counter}: {:#}",
            s["probes"]
        );
    }
    for source in ["nvml", "docker", "ebpf"] {
        assert_eq!(
            s["sources"][source]["up"], true,
            "{source}: {:#}\n{}",
            s["sources"], run.stderr
        );
    }

    // The trainer: Docker identity, compose labels, both GPUs.
    let t = workload(s, &format!("docker:{}", trainer.id));
    assert_eq!(t["kind"], "docker");
    assert_eq!(t["name"], trainer.name);
    assert_eq!(t["container"]["image"], IMAGE);
    assert_eq!(t["container"]["compose_project"], "vision");
    assert_eq!(t["container"]["compose_service"], "trainer");
    assert_eq!(t["gpu"]["memory_bytes"], 10 * GIB);
    assert_eq!(t["gpu"]["processes"], 2);
    let per_gpu = t["gpu"]["per_gpu"].as_array().unwrap();
    assert_eq!(per_gpu.len(), 2);
    assert_eq!(per_gpu[0]["index"], 0);
    assert_eq!(per_gpu[0]["memory_bytes"], 8 * GIB);
    assert_eq!(per_gpu[0]["sm_util_percent"], 80.0);
    assert_eq!(
        per_gpu[1]["uuid"],
        "GPU-11111111-1111-1111-1111-111111111111"
    );
    assert_eq!(per_gpu[1]["sm_util_percent"], 40.0);
    assert!(t["cgroup_path"].as_str().unwrap().contains(&trainer.id));
    // Real cgroup counters of a busy container.
    assert!(t["cpu"]["cores"].as_f64().unwrap() > 0.0, "{:#}", t["cpu"]);
    assert!(t["memory"]["usage_bytes"].as_u64().unwrap() > 0);
    // The probes saw this container's busy loop: context switches and on-CPU time.
    let stalls = &t["stalls"];
    let switches: u64 = stalls["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["switches"].as_u64().unwrap())
        .sum();
    let on_cpu: f64 = stalls["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["on_cpu_seconds"].as_f64().unwrap())
        .sum();
    assert!(
        switches > 0 && on_cpu > 0.0,
        "no activity traced for a busy container: {stalls:#}"
    );
    assert_eq!(stalls["cgroup_id"], t["stalls"]["cgroup_id"]);

    // The eval container holds memory but has no samples: present, idle (no SM figure).
    let e = workload(s, &format!("docker:{}", eval.id));
    assert_eq!(e["gpu"]["memory_bytes"], 4 * GIB);
    assert_eq!(e["gpu"]["per_gpu"][0]["index"], 1);
    assert_eq!(e["gpu"]["per_gpu"][0]["sm_util_percent"], Value::Null);

    // A container without any GPU process is listed too.
    let i = workload(s, &format!("docker:{}", idle.id));
    assert_eq!(i["gpu"]["processes"], 0);
    assert_eq!(i["name"], idle.name);

    // The host process is the host's.
    let h = workload(s, "host:host");
    assert_eq!(h["gpu"]["memory_bytes"], GIB);
    assert_eq!(gpu_process(s, 0, host.pid())["workload"], "host:host");

    // Processes keyed on (pid, start time), with their command.
    let tp = gpu_process(s, 0, trainer.pid);
    assert!(tp["start_time_ticks"].as_u64().unwrap() > 0);
    assert_eq!(tp["command"], "sh");
    assert_eq!(tp["kind"], "compute");

    // A PID that was never alive is vanished and attributed to nobody; one that exited during
    // the window is vanished too but keeps the workload it had (its samples up to the exit are
    // its workload's). Both are counted.
    let d = gpu_process(s, 0, dead);
    assert_eq!(d["vanished"], true, "{d:#}");
    assert_eq!(d["workload"], Value::Null);
    let gone = gpu_process(s, 0, short_pid);
    assert_eq!(gone["vanished"], true, "{gone:#}");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = classify(CgroupMembership::parse(&own).identity_path()).to_string();
    assert_eq!(
        gone["workload"], own,
        "the workload of the test process that spawned it"
    );
    assert!(
        s["internal_events"]["gpu_process_vanished"]
            .as_u64()
            .unwrap()
            >= 2
    );
    let attributed: u64 = s["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["gpu"]["processes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        attributed, 5,
        "trainer x2, eval, host, the exited one; not the never-alive PID"
    );
    reaper.join().unwrap().unwrap();
}

#[test]
fn table_output_names_containers_and_gpus() {
    require_root();
    let c = Container::start(
        &unique("table"),
        &[("com.docker.compose.service", "loader")],
        "sleep 3600",
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(
            &json!({"devices": [{"uuid": "GPU-t", "name": "Fake H200", "utilization_gpu": 42,
            "processes": [{"pid": c.pid, "used_memory_bytes": 3 * GIB, "sm_util": 42}]}]}),
        )
        .unwrap(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["snapshot", "--window", "300ms", "--nvml-lib"])
        .arg(fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", &scenario)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.contains(&c.name))
        .unwrap_or_else(|| panic!("no row for {} in:\n{text}", c.name));
    assert!(row.starts_with("docker"), "{row}");
    assert!(
        row.contains("loader") && row.contains("3.00") && row.contains("0:42%"),
        "{row}"
    );
    assert!(text.contains("Fake H200"), "{text}");
}
