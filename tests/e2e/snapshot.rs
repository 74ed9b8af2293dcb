//! End to end: real dockerd, real containers, real eBPF, the real nvml-wrapper loading the fake
//! NVML; `gpuwatch snapshot --json` must attribute every GPU process correctly.

use gpuwatch::sources::host::cgroup::{classify, CgroupMembership};
use serde_json::{json, Value};
use std::time::Instant;
use support::*;

mod containerd;

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
    // The kernel's count of the trainer's CPU time from the window's start to the end of the
    // run: the reference for the cores the agent reports.
    let at_start = std::cell::Cell::new(None);
    let run = snapshot_around_baseline(&scenario, &[], || {
        // SAFETY: kill(2) on our own child, not yet reaped (the reaper waits for this signal).
        unsafe { libc::kill(short_pid as i32, libc::SIGKILL) };
        at_start.set(Some((Instant::now(), cgroup_cpu_usec(trainer.pid))));
    });
    let (started, usec) = at_start.get().expect("a baseline round");
    let kernel_cores =
        (cgroup_cpu_usec(trainer.pid) - usec) as f64 / 1e6 / started.elapsed().as_secs_f64();
    let s = &run.json;
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(s["schema_version"], 2);
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
    // GPU 0 reads 85 % busy; the host process and the dead ones hold memory there but did
    // nothing (no CPU, no period credited by the driver): all of the busy time is the
    // trainer's. GPU 1: the trainer at 40 %, the eval container idle beside it.
    assert_eq!(
        per_gpu[0]["split"], "sole_active_holder",
        "{:#}",
        per_gpu[0]
    );
    assert_close(&per_gpu[0]["busy_fraction"], 0.85, 0.01);
    assert_eq!(
        per_gpu[1]["uuid"],
        "GPU-11111111-1111-1111-1111-111111111111"
    );
    assert_close(&per_gpu[1]["busy_fraction"], 0.40, 0.01);
    let g0 = &s["gpus"][0]["busy"];
    assert_eq!(g0["source"], "utilization_samples", "{g0:#}");
    assert_close(&g0["coverage"], 1.0, 0.02);
    assert_close(&g0["fraction"], 0.85, 0.01);
    assert!(t["cgroup_path"].as_str().unwrap().contains(&trainer.id));
    // Real cgroup counters of a busy container: its cores as the kernel counted them (the
    // reference spans a little past the window's end).
    let cores = t["cpu"]["cores"].as_f64().unwrap();
    assert!(
        (cores - kernel_cores).abs() <= 0.3 * kernel_cores + 0.05,
        "{cores} cores against the kernel's {kernel_cores:.3}: {:#}",
        t["cpu"]
    );
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
    // The window is the trainer's own cgroup's: the id the kernel reported is that cgroup's
    // inode on the unified hierarchy (what bpf_get_current_cgroup_id() returns).
    let path = t["cgroup_path"].as_str().unwrap();
    let dir = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|root| format!("{root}{path}"))
        .find(|d| std::path::Path::new(d).is_dir())
        .unwrap_or_else(|| panic!("no unified cgroup directory for {path}"));
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dir).unwrap());
    assert_eq!(stalls["cgroup_id"], inode, "{dir}");

    // The eval container holds memory and did nothing: present, busy 0 of the GPU it shares.
    let e = workload(s, &format!("docker:{}", eval.id));
    assert_eq!(e["gpu"]["memory_bytes"], 4 * GIB);
    assert_eq!(e["gpu"]["per_gpu"][0]["index"], 1);
    assert_eq!(e["gpu"]["per_gpu"][0]["busy_fraction"], 0.0);

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
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", trainer.pid)).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    // Field 22 of stat, the 20th after the command.
    let start_ticks: u64 = after_comm.split(' ').nth(19).unwrap().parse().unwrap();
    assert_eq!(tp["start_time_ticks"], start_ticks);
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
    let out = std::process::Command::new(support::gpuwatch_bin())
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

fn assert_close(v: &Value, want: f64, tolerance: f64) {
    let got = v
        .as_f64()
        .unwrap_or_else(|| panic!("{v} is not a number (want {want})"));
    assert!(
        (got - want).abs() <= tolerance,
        "{got} is not within {tolerance} of {want}"
    );
}

#[test]
fn a_lone_busy_process_is_credited_with_its_gpus_busy_time() {
    // On the H200 a lone container at 99-100 % read busy 0.39 when each per-process sample was
    // credited for one 200-ms period of a 500-ms poll. Here the GPU's own series decides: a
    // process alone at 97 % must read at least 0.90, and never more than the GPU was busy.
    require_root();
    let c = Container::start(&unique("lone"), &[], "sleep 3600");
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-lone",
            "processes": [{"pid": c.pid, "used_memory_bytes": 20 * GIB, "sm_util": 97}]}]}),
        &["--window", "3s"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let w = workload(&run.json, &format!("docker:{}", c.id));
    let busy = w["gpu"]["busy_fraction"].as_f64().unwrap();
    assert!(
        busy >= 0.90,
        "a lone 97 % process read {busy}: {:#}",
        w["gpu"]
    );
    assert!(busy <= 0.97 + 1e-9, "over-counted: {busy}");
    assert_eq!(w["gpu"]["per_gpu"][0]["split"], "sole_holder");
    let g = &run.json["gpus"][0];
    assert_eq!(g["busy"]["source"], "utilization_samples", "{g:#}");
    // One workload holds the GPU: no per-process query was needed, none was made.
    assert_eq!(
        gpu_process(&run.json, 0, c.pid)["driver_sm_percent"],
        Value::Null
    );
    // GPM: the fake's matmul-like kernels keep 96 % of the SMs busy while they run.
    assert_close(&w["gpu"]["per_gpu"][0]["sm_activity_percent"], 96.0, 1.5);
    assert_eq!(g["gpm"]["state"], "available");
    assert_close(&g["sm_activity"]["engine_percent"], 97.0, 1.5);
}

#[test]
fn a_shared_gpu_the_driver_cannot_split_is_estimated_and_says_so() {
    // Two containers on one GPU, each a shell spinning in its own process (no children, so the
    // process's CPU time is its cgroup's), the first on a whole CPU, the second held to a fifth
    // of one; the driver would credit every period to the busier (70 %, as the H200 did beside
    // a 30 % job), so the other would have no driver share. Their split must come from host CPU
    // time, labelled an estimate, in the proportion of the CPU time the kernel counted for each
    // (`cpu.stat`); the two together are the GPU's busy share. Both ran on a CPU all the while,
    // so the driver's figures could not change the split: it was not asked (~2 ms a GPU).
    require_root();
    let spin = "while :; do :; done";
    let a = Container::start(&unique("share-a"), &[], spin);
    let b = Container::start_with(&unique("share-b"), &[], &["--cpus", "0.2"], spin);
    let cpu = |c: &Container| cgroup_cpu_usec(c.pid) as f64;
    let before = (cpu(&a), cpu(&b));
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-shared", "processes": [
            {"pid": a.pid, "used_memory_bytes": GIB, "sm_util": 70},
            {"pid": b.pid, "used_memory_bytes": GIB, "sm_util": 30}]}]}),
        &["--window", "2s"],
    );
    let used = (cpu(&a) - before.0, cpu(&b) - before.1);
    let kernel_b = used.1 / (used.0 + used.1);
    assert!(run.status.success(), "{}", run.stderr);
    let g = &run.json["gpus"][0];
    assert_eq!(g["busy"]["split"], "host_cpu_estimate", "{g:#}");
    assert_close(&g["busy"]["fraction"], 1.0, 0.01);
    for c in [&a, &b] {
        assert_eq!(
            gpu_process(&run.json, 0, c.pid)["driver_sm_percent"],
            Value::Null
        );
    }
    let part = |c: &Container| {
        workload(&run.json, &format!("docker:{}", c.id))["gpu"]["per_gpu"][0]["busy_fraction"]
            .as_f64()
            .unwrap()
    };
    let (pa, pb) = (part(&a), part(&b));
    assert!(
        (pb - kernel_b).abs() < 0.08,
        "the second's part {pb} against its share of the CPU time {kernel_b:.3} ({used:?} µs)"
    );
    assert!((pa + pb - 1.0).abs() < 0.01, "{pa} + {pb}");
    for c in [&a, &b] {
        let share = &workload(&run.json, &format!("docker:{}", c.id))["gpu"]["per_gpu"][0];
        assert_eq!(share["split"], "host_cpu_estimate");
        assert_eq!(
            share["sm_activity_percent"],
            Value::Null,
            "GPM is per GPU, not per holder"
        );
    }
}

#[test]
fn a_shared_gpu_with_a_holder_idle_on_its_cpu_asks_the_driver() {
    // One container spins on a CPU; the other sleeps on its CPU while the driver credits it
    // with the GPU (a job that waits on its kernels without spinning). CPU time alone would
    // give the sleeper nothing, so the driver is asked: the sleeper gets the driver's share, the
    // spinner, which the driver did not credit, an unknown one.
    require_root();
    let spinner = Container::start(&unique("idle-cpu-a"), &[], "while :; do :; done");
    let sleeper = Container::start(&unique("idle-cpu-b"), &[], "sleep 3600");
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-shared-idle", "processes": [
            {"pid": spinner.pid, "used_memory_bytes": GIB, "sm_util": 30},
            {"pid": sleeper.pid, "used_memory_bytes": GIB, "sm_util": 70}]}]}),
        &["--window", "2s"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let g = &run.json["gpus"][0];
    assert_eq!(g["busy"]["split"], "partial", "{g:#}");
    assert_eq!(
        gpu_process(&run.json, 0, sleeper.pid)["driver_sm_percent"],
        100
    );
    let part = |c: &Container| {
        workload(&run.json, &format!("docker:{}", c.id))["gpu"]["per_gpu"][0]["busy_fraction"]
            .clone()
    };
    assert_close(
        &part(&sleeper),
        g["busy"]["fraction"].as_f64().unwrap(),
        1e-9,
    );
    assert_eq!(part(&spinner), Value::Null, "{g:#}");
}

/// Two containers on one GPU: one busy on its CPU (and so given the larger part), one that
/// runs a little work now and then. The smaller one is told contention, with the other's name
/// and part; the parts add up to the GPU's busy share; without eBPF the verdict stands.
#[test]
fn the_smaller_holder_of_a_shared_gpu_is_told_contention_by_name() {
    require_root();
    let big = Container::start(&unique("contend-big"), &[], "while :; do :; done");
    let small = Container::start(
        &unique("contend-small"),
        &[],
        "while :; do i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; usleep 20000; done",
    );
    let scenario = json!({"devices": [{"uuid": "GPU-contended", "processes": [
        {"pid": big.pid, "used_memory_bytes": GIB, "sm_util": 70},
        {"pid": small.pid, "used_memory_bytes": GIB, "sm_util": 30}]}]});
    for extra in [
        &["--window", "2s"][..],
        &["--window", "2s", "--no-ebpf"][..],
    ] {
        let run = snapshot(&scenario, extra);
        assert!(run.status.success(), "{}", run.stderr);
        let device = run.json["gpus"][0]["busy"]["fraction"].as_f64().unwrap();
        let w = |c: &Container| workload(&run.json, &format!("docker:{}", c.id)).clone();
        let (b, s) = (w(&big), w(&small));
        let part = |w: &Value| w["gpu"]["per_gpu"][0]["busy_fraction"].as_f64().unwrap();
        eprintln!("{extra:?}: parts {} + {} of {device}", part(&b), part(&s));
        assert!(
            (part(&b) + part(&s) - device).abs() < 1e-9,
            "{} + {} != {device}",
            part(&b),
            part(&s)
        );
        let v = &s["verdict"];
        assert_eq!(v["kind"], "contention", "{extra:?}: {v:#}");
        let c = &v["contention"];
        assert_eq!(c["others"][0]["name"], big.name.as_str(), "{c:#}");
        assert_eq!(c["others"][0]["busy_fraction"], part(&b), "{c:#}");
        assert_close(&c["own_fraction"], part(&s), 1e-9);
        assert_close(&c["device_busy_fraction"], device, 1e-9);
        assert!(v["advice"].as_str().unwrap().contains(&big.name), "{v:#}");
        // The big one ran more than the others on its GPU: not contention.
        assert_ne!(b["verdict"]["kind"], "contention", "{:#}", b["verdict"]);
    }
    // The same in words, as a user reads it: `why NAME`, and below the table with -v.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.json");
    std::fs::write(&path, scenario.to_string()).unwrap();
    let out = gpuwatch_on(&path)
        .args(["why", &small.name, "--window", "2s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("{}: contention (GPU 0, busy ", small.name)),
        "{text}"
    );
    assert!(text.contains("  evidence:\n    - GPU busy"), "{text}");
    assert!(text.contains("  advice: Other workloads ("), "{text}");
    assert!(
        !text.contains(&format!("{}:", big.name)),
        "only the one asked for: {text}"
    );
    // As JSON for programs: the same verdict.
    let out = gpuwatch_on(&path)
        .args(["why", &small.name, "--window", "2s", "--json"])
        .output()
        .unwrap();
    let picked: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(picked.as_array().map(Vec::len), Some(1), "{picked:#}");
    assert_eq!(picked[0]["name"], small.name.as_str(), "{picked:#}");
    assert_eq!(
        picked[0]["id"],
        format!("docker:{}", small.id),
        "{picked:#}"
    );
    assert_eq!(picked[0]["verdict"]["kind"], "contention", "{picked:#}");
    let out = gpuwatch_on(&path)
        .args(["snapshot", "-v", "--window", "1s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("VERDICT") && text.contains("  advice: "),
        "{text}"
    );
}

/// A tenant's label reaches every output escaped: a compose service that holds a terminal
/// escape, a forged `FIRING` line and a spreadsheet formula. The table shows it inert on one
/// line; the CSV cell cannot run as a formula; the recording reads back exactly what was set.
#[test]
fn a_hostile_label_is_escaped_in_the_table_and_the_csv() {
    require_root();
    let hostile = "=HYPERLINK(\"http://x\")\x1b[2J\n2026-12-01T00:00:00Z FIRING critical forged";
    let c = Container::start(
        &unique("hostile"),
        &[("com.docker.compose.service", hostile)],
        "sleep 3600",
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&json!({"devices": [{"uuid": "GPU-h", "utilization_gpu": 10,
            "processes": [{"pid": c.pid, "used_memory_bytes": GIB, "sm_util": 10}]}]}))
        .unwrap(),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(support::gpuwatch_bin())
            .args(args)
            .arg("--nvml-lib")
            .arg(fake_nvml_lib())
            .env("FAKE_NVML_SCENARIO", &scenario)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run(&["snapshot", "--window", "300ms", "--no-ebpf"]);
    assert!(!table.contains('\x1b'), "{table:?}");
    let row = table
        .lines()
        .find(|l| l.contains(&c.name))
        .unwrap_or_else(|| panic!("no row for {} in:\n{table}", c.name));
    assert!(
        row.contains("\\u{1b}[2J\\u{a}2026-12-01T00:00:00Z FIRING"),
        "{row}"
    );
    assert!(
        !table
            .lines()
            .any(|l| l.starts_with("2026-12-01T00:00:00Z FIRING")),
        "no forged line:\n{table}"
    );

    let csv_path = dir.path().join("rec.csv");
    run(&[
        "record",
        "--interval",
        "300ms",
        "--duration",
        "700ms",
        "--no-ebpf",
        "-o",
        csv_path.to_str().unwrap(),
    ]);
    let csv = std::fs::read_to_string(&csv_path).unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (name_col, service_col) = (col("workload_name"), col("compose_service"));
    // This container's rows (other tests' containers run beside it).
    let cells: Vec<String> = reader
        .records()
        .map(Result::unwrap)
        .filter(|r| &r[name_col] == c.name.as_str())
        .map(|r| r[service_col].to_owned())
        .collect();
    assert!(!cells.is_empty(), "{csv}");
    for cell in &cells {
        assert!(
            cell.starts_with("'="),
            "a formula a spreadsheet would run: {cell:?}"
        );
    }
    let rec = gpuwatch::recording::read(&csv_path).unwrap();
    let w = rec
        .workloads
        .values()
        .find(|w| w.name == c.name)
        .expect("the container's series");
    assert_eq!(w.compose_service, hostile, "read back exactly");
}

/// A pod the kubelet started through Docker: its container carries the kubelet's
/// `io.kubernetes.*` labels and its cgroup sits under the pod's. The snapshot names the pod and
/// namespace, and keys the workload as the pod's container (the key its processes' cgroups
/// give). A plain container wearing the same labels is named by them but keeps its Docker key:
/// labels are the tenant's, the cgroup is not.
#[test]
fn a_pods_container_is_named_by_its_pod_and_keyed_by_its_cgroup() {
    require_root();
    let uid = "5d0f7f2e-1c2b-4c3d-9e8f-0a1b2c3d4e5f";
    let driver = docker(&["info", "--format", "{{.CgroupDriver}}"]);
    let parent = if driver == "systemd" {
        format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"))
    } else {
        format!("/kubepods/besteffort/pod{uid}")
    };
    let labels = [
        ("io.kubernetes.pod.name", "trainer-0"),
        ("io.kubernetes.pod.namespace", "ml"),
        ("io.kubernetes.pod.uid", uid),
        ("io.kubernetes.container.name", "trainer"),
    ];
    let pod = Container::start_with(
        &unique("pod"),
        &labels,
        &["--cgroup-parent", &parent],
        "sleep 3600",
    );
    let lookalike = Container::start(&unique("pod-lookalike"), &labels, "sleep 3600");
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-k", "utilization_gpu": 50, "processes": [
            {"pid": pod.pid, "used_memory_bytes": GIB, "sm_util": 30},
            {"pid": lookalike.pid, "used_memory_bytes": 2 * GIB, "sm_util": 20}]}]}),
        &[],
    );
    let w = workload(&run.json, &format!("kubernetes:{uid}/{}", pod.id));
    assert_eq!(w["name"], pod.name);
    assert_eq!(
        w["container"]["kubernetes"],
        json!({"namespace": "ml", "pod": "trainer-0", "container": "trainer"})
    );
    assert_eq!(w["gpu"]["memory_bytes"], GIB);
    let l = workload(&run.json, &format!("docker:{}", lookalike.id));
    assert_eq!(l["container"]["kubernetes"]["pod"], "trainer-0");
    assert_eq!(
        l["gpu"]["memory_bytes"],
        2 * GIB,
        "its GPU use stays its own"
    );
}

/// `gpuwatch snapshot --json` started through `wrapper` (a shell line ending in `exec "$@"`),
/// NVML faked with one GPU process `pid`; returns the snapshot and the log.
fn snapshot_wrapped(wrapper: &str, pid: u32) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.json");
    let devices = json!({"devices": [{"uuid": "GPU-ns", "processes": [
        {"pid": pid, "used_memory_bytes": GIB, "sm_util": 50}]}]});
    std::fs::write(&scenario, devices.to_string()).unwrap();
    let out = std::process::Command::new("sh")
        .args(["-c", wrapper, "sh"])
        .arg(support::gpuwatch_bin())
        .args(["snapshot", "--json", "--window", "300ms", "--no-docker"])
        .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", &scenario)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (serde_json::from_slice(&out.stdout).unwrap(), stderr)
}

/// An agent in a container started without the host's namespaces says what it cannot see, in
/// its log, its snapshot and doctor, instead of reporting an empty host: its own PID namespace
/// (no GPU process can be attributed), its own cgroup namespace where the host's hierarchy is
/// not mounted whole (cgroup paths are its own). On the host it says nothing. In a cgroup
/// namespace of its own with the host's hierarchy mounted whole (Docker's default on cgroup v2
/// and Compose v1, with the deployment's `/sys` mount) it finds its root there and attributes
/// as on the host.
#[test]
fn an_agent_without_the_host_namespaces_says_what_it_cannot_see() {
    require_root();
    let host = HostProcess::spawn();
    let (snap, _) = snapshot_wrapped(r#"exec "$@""#, host.pid());
    assert!(
        snap["host"].get("blind_spots").is_none(),
        "{:#}",
        snap["host"]
    );

    let (snap, log) =
        snapshot_wrapped(r#"exec unshare --pid --fork --mount-proc "$@""#, host.pid());
    assert_eq!(
        snap["host"]["blind_spots"],
        json!(["private_pid_namespace"])
    );
    assert!(
        log.contains("not in the host PID namespace") && log.contains("--pid=host"),
        "{log}"
    );

    // A cgroup namespace rooted at a cgroup of its own, as Docker's private cgroupns is, the
    // host's hierarchy mounted whole: a container's GPU process is the container's.
    let unified = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .find(|d| std::path::Path::new(d).join("cgroup.controllers").exists())
        .expect("a cgroup v2 hierarchy");
    let name = unique("cgroupns");
    let cgroup = std::path::Path::new(unified).join(&name);
    std::fs::create_dir(&cgroup).unwrap();
    let trainer = Container::start(&unique("cgroupns-trainer"), &[], "sleep 3600");
    let into_namespace = format!(
        "echo $$ > {}/cgroup.procs && exec unshare --cgroup",
        cgroup.display()
    );
    let (snap, log) = snapshot_wrapped(&format!(r#"{into_namespace} "$@""#), trainer.pid);
    assert!(
        snap["host"].get("blind_spots").is_none(),
        "{:#}\n{log}",
        snap["host"]
    );
    let w = workload(&snap, &format!("docker:{}", trainer.id));
    assert_eq!(w["gpu"]["memory_bytes"], GIB, "{w:#}");
    assert!(
        w["memory"]["usage_bytes"].as_u64() > Some(0),
        "its cgroup is read: {w:#}"
    );

    // The same namespace with only its own cgroup in view where the hierarchy was, as a
    // cgroup mount made inside it shows: the root cannot be found, and the agent says it
    // cannot see.
    let remounted = format!(
        r#"{into_namespace} --mount sh -c 'mount --bind {} {unified} && exec "$@"' sh "$@""#,
        cgroup.display()
    );
    let (snap, log) = snapshot_wrapped(&remounted, trainer.pid);
    std::fs::remove_dir(&cgroup).unwrap();
    assert_eq!(
        snap["host"]["blind_spots"],
        json!(["private_cgroup_namespace"])
    );
    assert!(
        log.contains("not mounted whole") && log.contains("--cgroupns=host"),
        "{log}"
    );

    let doctor = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(support::gpuwatch_bin())
        .args([
            "doctor",
            "--no-nvml",
            "--no-docker",
            "--no-ebpf",
            "--window",
            "1s",
            "--json",
        ])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&doctor.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&doctor.stderr)));
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "host_namespaces")
        .unwrap_or_else(|| panic!("no namespace check: {report:#}"));
    assert_eq!(check["status"], "risk", "{check:#}");
    assert!(check["action"].as_str().unwrap().contains("--pid=host"));
    assert_eq!(doctor.status.code(), Some(2), "doctor's at-risk status");
}

/// A cgroup of the unified hierarchy, made by hand as a tenant with a delegated cgroup could;
/// its processes go back to the root and its directories are removed on drop.
struct CraftedCgroup {
    root: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl CraftedCgroup {
    /// `relative` (its first segment unique to this test) under the unified hierarchy's root,
    /// with `pid` moved into it.
    fn with(relative: &str, pid: u32) -> Self {
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(std::path::PathBuf::from)
            .find(|d| d.join("cgroup.controllers").exists())
            .expect("a cgroup v2 hierarchy");
        let dir = root.join(relative.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        Self { root, dir }
    }
}

impl Drop for CraftedCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        for dir in self.dir.ancestors().take_while(|d| *d != self.root) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Cgroups a tenant names after someone else's: a directory called `docker-<victim id>.scope`
/// outside the victim's cgroup, a `session-*.scope` and a `kubepods` tree inside the tenant's
/// own. Each tenant process is its own workload, shown with its real path; the victim keeps only
/// its own GPU memory, nothing is charged to the host, and the look-alike is counted.
#[test]
fn a_cgroup_named_like_another_container_is_not_that_container() {
    require_root();
    let victim = Container::start(&unique("victim"), &[], "sleep 3600");
    let tenant = unique("tenant");
    let (a, b, c) = (
        HostProcess::spawn(),
        HostProcess::spawn(),
        HostProcess::spawn(),
    );
    let docker_like = format!("/{tenant}/docker-{}.scope", victim.id);
    let session_like = format!("/{tenant}-s/session-1.scope");
    let pod_like = format!(
        "/{tenant}-k/kubepods/besteffort/pod5d0f7f2e-1c2b-4c3d-9e8f-0a1b2c3d4e5f/{}",
        victim.id
    );
    let _cgroups = [
        CraftedCgroup::with(&docker_like, a.pid()),
        CraftedCgroup::with(&session_like, b.pid()),
        CraftedCgroup::with(&pod_like, c.pid()),
    ];
    let proc =
        |pid: u32, gib: u64| json!({"pid": pid, "used_memory_bytes": gib * GIB, "sm_util": 10});
    let run = snapshot(
        &json!({"devices": [{"uuid": "GPU-l", "processes": [
            proc(victim.pid, 1), proc(a.pid(), 2), proc(b.pid(), 3), proc(c.pid(), 4)]}]}),
        &["--no-ebpf"],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let v = workload(&run.json, &format!("docker:{}", victim.id));
    assert_eq!(
        v["gpu"]["memory_bytes"], GIB,
        "only the victim's own process"
    );
    for (path, gib) in [(&docker_like, 2), (&session_like, 3), (&pod_like, 4)] {
        let w = workload(&run.json, &format!("cgroup:{path}"));
        assert_eq!(w["gpu"]["memory_bytes"], gib * GIB, "{w:#}");
    }
    let host = run.json["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == "host");
    assert!(
        host.is_none_or(|h| h["gpu"]["memory_bytes"] == 0),
        "nothing charged to the host: {host:#?}"
    );
    assert!(
        run.json["internal_events"]["cgroup_lookalike"].as_u64() >= Some(1),
        "{:#}",
        run.json["internal_events"]
    );
    assert!(run.stderr.contains("looks like docker:"), "{}", run.stderr);
}

/// Docker's inspect bodies hold every container's environment; bollard logs them at DEBUG.
/// With `--log debug` (and `trace` asked for bollard itself), no output of gpuwatch carries a
/// container's secret.
#[test]
fn debug_logs_carry_no_containers_environment() {
    require_root();
    const SECRET: &str = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY";
    let c = Container::start_with(
        &unique("secret"),
        &[],
        &["-e", &format!("AWS_SECRET_ACCESS_KEY={SECRET}")],
        "sleep 3600",
    );
    for filter in ["debug", "trace,bollard=trace,hyper=trace"] {
        let out = std::process::Command::new(gpuwatch_bin())
            .args(["snapshot", "--json", "--no-nvml", "--window", "1s"])
            .env("GPUWATCH_LOG", filter)
            .output()
            .unwrap();
        assert!(out.status.success(), "{filter}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stdout.contains(&c.name),
            "{filter}: the container is seen: {stdout}"
        );
        assert!(
            stderr.contains("DEBUG"),
            "{filter}: debug logging is on: {stderr}"
        );
        assert!(!stdout.contains(SECRET), "{filter}: the secret in stdout");
        assert!(!stderr.contains(SECRET), "{filter}: the secret in the log");
    }
}

/// A GPU process in a cgroup whose name is not UTF-8 (a tenant with a delegated subtree, or a
/// rootless engine, can make one) is attributed, to a workload of its own named with escapes:
/// /proc/<pid>/cgroup was read as UTF-8, and such a process had no workload at all (only
/// `gpu_unattributed_memory_bytes`), no rule saw it, and a warning was logged every round.
#[test]
fn a_cgroup_named_with_bytes_that_are_not_utf8_is_a_workload() {
    use std::os::unix::ffi::OsStrExt;
    require_root();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let unified = mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| left.split(' ').nth(4).unwrap().to_owned())
        })
        .expect("a cgroup2 mount");
    let name = std::ffi::OsStr::from_bytes(b"gpuwatch-rt-bin\xff\xfe");
    let dir = std::path::Path::new(&unified).join(name);
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir(&dir).unwrap();
    struct Gone(std::path::PathBuf, std::process::Child);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = self.1.kill();
            let _ = self.1.wait();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let pid = child.id();
    let guard = Gone(dir.clone(), child);
    std::fs::write(guard.0.join("cgroup.procs"), pid.to_string()).unwrap();
    let scenario = json!({"devices": [{
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "processes": [{"pid": pid, "used_memory_bytes": 1u64 << 30, "sm_util": 50}],
    }]});
    let run = snapshot(&scenario, &["--no-docker", "--window", "1s"]);
    assert!(run.status.success(), "{}", run.stderr);
    let p = gpu_process(&run.json, 0, pid);
    let id = r"cgroup:bytes:/gpuwatch-rt-bin\xff\xfe";
    assert_eq!(p["workload"], id, "{p:#}");
    let w = workload(&run.json, id);
    assert_eq!(w["gpu"]["memory_bytes"], 1u64 << 30, "{w:#}");
    assert_eq!(
        run.json["gpus"][0]["processes"].as_array().unwrap().len(),
        1
    );
    assert!(
        !run.stderr.contains("proc_read_failed"),
        "no failed read: {}",
        run.stderr
    );
}

/// `--gpu LIST` (`-i`, as `nvidia-smi -i`): only those GPUs and the containers holding them,
/// in `snapshot` and `record`; a GPU the host does not have is an error that names it.
#[test]
fn gpu_selects_the_gpus_shown_and_the_containers_on_them() {
    require_root();
    let a = Container::start(&unique("on-gpu0"), &[], "sleep 3600");
    let b = Container::start(&unique("on-gpu1"), &[], "sleep 3600");
    let devices = json!({"devices": [
        {"uuid": "GPU-00000000-0000-0000-0000-0000000000d0", "processes": [{"pid": a.pid, "used_memory_bytes": GIB, "sm_util": 40}]},
        {"uuid": "GPU-00000000-0000-0000-0000-0000000000d1", "processes": [{"pid": b.pid, "used_memory_bytes": GIB, "sm_util": 60}]}]});
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, devices.to_string()).unwrap();
    let run = snapshot(
        &devices,
        &[
            "--window",
            "1s",
            "--no-ebpf",
            "-i",
            "GPU-00000000-0000-0000-0000-0000000000d1",
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let s = &run.json;
    // The `field` of each entry of the list `list`.
    let each = |list: &str, field: &str| -> Vec<String> {
        s[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[field].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        each("gpus", "uuid"),
        ["GPU-00000000-0000-0000-0000-0000000000d1"]
    );
    assert_eq!(each("workloads", "name"), [b.name.as_str()]);

    let csv = dir.path().join("rec.csv");
    let out = gpuwatch_on(&scenario)
        .args([
            "record",
            "--interval",
            "0.5",
            "--duration",
            "1.5",
            "--no-ebpf",
            "--gpu",
            "0",
        ])
        .arg("-o")
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.contains(&a.name) && !text.contains(&b.name), "{text}");
    assert!(
        !text.contains("GPU-00000000-0000-0000-0000-0000000000d1"),
        "{text}"
    );

    let out = gpuwatch_on(&scenario)
        .args(["snapshot", "--window", "0.3", "--no-ebpf", "--gpu", "7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--gpu 7: 7: no such GPU among the 2"), "{err}");
}

/// `why` on a host whose NVML cannot be loaded, or with NVML turned off: "cannot tell" on
/// stderr and a failing exit status, never "No workload holds a GPU." on stdout.
#[test]
fn why_without_nvml_says_it_cannot_tell_and_fails() {
    for nvml in [
        vec!["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        vec!["--no-nvml"],
    ] {
        let out = std::process::Command::new(support::gpuwatch_bin())
            .arg("why")
            .args(&nvml)
            .args(["--no-docker", "--no-ebpf", "--window", "300ms"])
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!out.status.success(), "{nvml:?}: {stdout}");
        assert!(stdout.is_empty(), "{nvml:?}: {stdout}");
        assert!(
            stderr.contains("cannot tell which workloads hold a GPU")
                && stderr.contains("(NVML) is down"),
            "{nvml:?}: {stderr}"
        );
    }
}
