//! `gpuwatch record`: rows per sample per GPU and per container, nothing lost on SIGTERM, a clear
//! error on a full disk.

use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

fn record_cmd(scenario: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(support::gpuwatch_bin());
    cmd.arg("record")
        .args(args)
        .env("GPUWATCH_NVML_LIB", fake_nvml_lib())
        .env("FAKE_NVML_SCENARIO", scenario)
        .env("NO_COLOR", "1");
    cmd
}

fn write_scenario(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    let path = dir.join("scenario.json");
    let s = json!({"devices": [{"uuid": "GPU-rec", "utilization_gpu": 60,
        "processes": [{"pid": pid, "used_memory_bytes": 3 * GIB, "sm_util": 60}]}]});
    std::fs::write(&path, serde_json::to_vec(&s).unwrap()).unwrap();
    path
}

#[test]
fn csv_has_a_row_per_sample_per_gpu_and_per_container() {
    require_root();
    let c = Container::start(
        &unique("rec"),
        &[("com.docker.compose.service", "rec-svc")],
        "sleep 3600",
    );
    let dir = tempfile::tempdir().unwrap();
    let scenario = write_scenario(dir.path(), c.pid);
    let out = dir.path().join("gpu_log.csv");
    let status = record_cmd(
        &scenario,
        &["--interval", "300ms", "--duration", "1500ms", "-o"],
    )
    .arg(&out)
    .status()
    .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&out).unwrap();
    // Read as CSV: the advice cells hold commas, quoted.
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(header[0], "timestamp");
    let rows: Vec<Vec<String>> = reader
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect();
    assert!(rows.iter().all(|r| r.len() == header.len()), "{text}");
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let gpu_rows: Vec<_> = rows.iter().filter(|r| r[col("record")] == "gpu").collect();
    assert!(gpu_rows.len() >= 4, "one GPU row per sample: {text}");
    assert!(gpu_rows
        .iter()
        .all(|r| r[col("gpu_uuid")] == "GPU-rec" && r[col("utilization_gpu_percent")] == "60"));
    // Every row after the baseline has the window's busy share from the device's series.
    for r in &gpu_rows {
        let busy: f64 = r[col("gpu_busy_fraction")].parse().unwrap();
        assert!((busy - 0.6).abs() < 0.01, "{r:?}");
        assert_eq!(r[col("busy_source")], "utilization_samples");
        assert_eq!(r[col("busy_split")], "sole_holder");
    }
    let mine: Vec<_> = rows
        .iter()
        .filter(|r| r[col("workload_name")] == c.name)
        .collect();
    assert_eq!(
        mine.len(),
        gpu_rows.len(),
        "one row per sample for the container: {text}"
    );
    assert!(mine.iter().all(|r| r[col("compose_service")] == "rec-svc"
        && r[col("gpu_memory_bytes")] == (3 * GIB).to_string()));
    let ms: Vec<u64> = gpu_rows
        .iter()
        .map(|r| r[col("unix_ms")].parse().unwrap())
        .collect();
    assert!(
        ms.windows(2).all(|w| w[1] > w[0]),
        "timestamps increase: {ms:?}"
    );
}

#[test]
fn sigterm_stops_cleanly_with_every_line_complete() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = write_scenario(dir.path(), std::process::id());
    let out = dir.path().join("log.jsonl");
    let mut child = record_cmd(
        &scenario,
        &[
            "--no-docker",
            "--interval",
            "200ms",
            "--format",
            "jsonl",
            "-o",
        ],
    )
    .arg(&out)
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.ends_with('\n'));
    let docs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(docs.len() >= 3, "{} samples", docs.len());
    assert!(docs
        .iter()
        .all(|d| d["schema_version"] == 2 && d["gpus"][0]["uuid"] == "GPU-rec"));
    // Rounds waiting for the GPU series when the signal came were completed and written.
    let last = docs.last().unwrap();
    assert_eq!(
        last["gpus"][0]["busy"]["source"], "utilization_samples",
        "{last:#}"
    );
}

#[test]
fn a_full_disk_is_a_clear_error_and_keeps_what_was_written() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = write_scenario(dir.path(), std::process::id());
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(ok.success(), "mounting a 16 KiB tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let out = mnt.join("log.csv");
    let run = record_cmd(
        &scenario,
        &[
            "--no-docker",
            "--interval",
            "100ms",
            "--duration",
            "60s",
            "-o",
        ],
    )
    .arg(&out)
    .stderr(Stdio::piped())
    .output()
    .unwrap();
    assert!(!run.status.success(), "a full disk must fail the recording");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("No space left on device") && err.contains("log.csv"),
        "{err}"
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let complete: Vec<&str> = text
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .collect();
    assert!(
        complete.len() > 10,
        "the rows before the disk filled are kept"
    );
    assert!(
        complete.iter().skip(1).all(|l| l.starts_with("20")),
        "complete rows are intact"
    );
    // The error counts the samples written whole: those whose every row is in the file (a
    // sample is a row per GPU and per workload, all with its time first).
    let mut rows_per_sample: Vec<(&str, usize)> = Vec::new();
    for l in complete.iter().skip(1) {
        let time = l.split(',').next().unwrap();
        match rows_per_sample.last_mut() {
            Some((t, n)) if *t == time => *n += 1,
            _ => rows_per_sample.push((time, 1)),
        }
    }
    let whole_rows = rows_per_sample[0].1;
    let whole = rows_per_sample
        .iter()
        .filter(|(_, n)| *n == whole_rows)
        .count();
    assert!(
        err.contains(&format!("(the {whole} samples before were written)")),
        "{whole} samples of {whole_rows} rows written whole: {err}"
    );
    // What the full disk left is a recording `report` reads: every whole row, the cut one left
    // out and named (it refused the whole file: "line 69: found record with 18 fields").
    let copy = dir.path().join("log.csv");
    std::fs::copy(&out, &copy).unwrap();
    let report = Command::new(gpuwatch_bin())
        .args(["report", "--format", "json", "-o"])
        .arg(dir.path().join("report.json"))
        .arg(&copy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&report.stderr);
    assert!(report.status.success(), "report refused it: {err}");
    if !text.ends_with('\n') {
        let cut = text.lines().count();
        assert!(
            err.contains(&format!("line {cut} is cut off")),
            "the cut line is named: {err}"
        );
    }
}

#[test]
fn rounds_further_apart_than_a_fetch_keep_their_whole_window_covered() {
    // Rounds 2.5 s apart, the series fetched at each: every window must still find its series
    // from its own start, not from whatever the last fetch left.
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = write_scenario(dir.path(), std::process::id());
    let out = dir.path().join("log.jsonl");
    let status = record_cmd(
        &scenario,
        &[
            "--no-docker",
            "--no-ebpf",
            "--interval",
            "2500ms",
            "--duration",
            "6s",
            "--format",
            "jsonl",
            "-o",
        ],
    )
    .arg(&out)
    .status()
    .unwrap();
    assert!(status.success());
    let docs: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(docs.len() >= 2, "{} rounds", docs.len());
    for d in &docs {
        let busy = &d["gpus"][0]["busy"];
        assert_eq!(busy["source"], "utilization_samples", "{busy:#}");
        assert!(busy["coverage"].as_f64().unwrap() > 0.95, "{busy:#}");
        assert!(
            (busy["fraction"].as_f64().unwrap() - 0.6).abs() < 0.01,
            "{busy:#}"
        );
    }
}

/// OOM headroom from the driver's figures to every output: a container's process holds 20 GiB
/// of a 100-GiB GPU beside 10 GiB of others', then 40 GiB. The article's rule with its 2000-MiB
/// baseline gives the batch room to grow (90 GiB - 2000 MiB) / (20 GiB - 2000 MiB) = 4.879×,
/// then 2.314×: each CSV row holds one or the other, `report` takes the tightest (2.314), and
/// `snapshot` and `/metrics` show the one in force.
#[test]
fn oom_headroom_reaches_the_rows_the_report_the_snapshot_and_metrics() {
    require_root();
    let c = Container::start(&unique("oom"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.json");
    const MIB: u64 = 1 << 20;
    let holding = |gib: u64| {
        json!({"devices": [{"uuid": "GPU-oom", "utilization_gpu": 60,
            "memory_total_bytes": 100 * GIB, "memory_used_bytes": (gib + 10) * GIB,
            "processes": [{"pid": c.pid, "used_memory_bytes": gib * GIB, "sm_util": 60}]}]})
    };
    let scale = |gib: u64| (90.0 * 1024.0 - 2000.0) / ((gib * GIB / MIB) as f64 - 2000.0);
    let (wide, tight) = (scale(20), scale(40));
    std::fs::write(&path, holding(20).to_string()).unwrap();
    let csv = dir.path().join("oom.csv");
    let mut rec = record_cmd(
        &path,
        &["--no-ebpf", "--interval", "500ms", "--duration", "8s"],
    )
    .arg("-o")
    .arg(&csv)
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(4));
    let tmp = dir.path().join("scenario.tmp");
    std::fs::write(&tmp, holding(40).to_string()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert!(rec.wait().unwrap().success());

    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (name_col, scale_col) = (col("workload_name"), col("oom_batch_scale"));
    let seen: Vec<f64> = reader
        .records()
        .map(|r| r.unwrap())
        .filter(|r| r[name_col].trim_start_matches('/') == c.name)
        .filter_map(|r| r[scale_col].parse().ok())
        .collect();
    let near = |v: f64, want: f64| (v - want).abs() < 0.005;
    assert!(
        seen.iter().all(|v| near(*v, wide) || near(*v, tight)),
        "{seen:?} against {wide:.3} and {tight:.3}"
    );
    assert!(
        seen.iter().any(|v| near(*v, wide)) && seen.iter().any(|v| near(*v, tight)),
        "{seen:?}"
    );

    let report = Command::new(gpuwatch_bin())
        .args(["report", "--format", "json"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let mine = report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"].as_str().unwrap().trim_start_matches('/') == c.name)
        .unwrap();
    let min = mine["min_oom_batch_scale"].as_f64().unwrap();
    assert!(
        near(min, tight),
        "the report's tightest {min}, want {tight:.3}"
    );

    let snap = snapshot(&holding(40), &["--no-ebpf"]);
    let w = workload(&snap.json, &format!("docker:{}", c.id));
    let h = w["oom_headroom"]["batch_scale"].as_f64().unwrap();
    assert!(near(h, tight), "snapshot {h}");

    let (_agent, url) = serve_via(&[], &path, &["--no-ebpf"]);
    let started = std::time::Instant::now();
    loop {
        let body = ureq::get(&format!("{url}/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        let line = body.lines().find(|l| {
            l.starts_with("gpuwatch_container_oom_headroom_batch_scale{") && l.contains(&c.name)
        });
        if let Some(v) = line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()) {
            assert!(near(v, tight), "/metrics {v}");
            break;
        }
        assert!(
            started.elapsed().as_secs() < 30,
            "no headroom in /metrics:\n{body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}
