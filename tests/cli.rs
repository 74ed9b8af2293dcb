//! The command line as a whole: help, shell completions, the man page.
use std::process::Command;

fn gpuwatch(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(support::gpuwatch_bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const COMMANDS: [&str; 12] = [
    "snapshot",
    "why",
    "record",
    "doctor",
    "watch",
    "serve",
    "top",
    "plot",
    "report",
    "completions",
    "man",
    "check-config",
];

#[test]
fn help_lists_every_command() {
    let (ok, help, _) = gpuwatch(&["--help"]);
    assert!(ok);
    for c in COMMANDS {
        assert!(
            help.contains(&format!("  {c} ")),
            "{c} missing from\n{help}"
        );
    }
    let (ok, serve, _) = gpuwatch(&["serve", "--help"]);
    assert!(ok);
    assert!(serve.contains("--web.listen-address") && serve.contains("--web.config.file"));
}

#[test]
fn bash_completion_is_valid_shell_and_knows_the_commands() {
    let (ok, script, err) = gpuwatch(&["completions", "bash"]);
    assert!(ok, "{err}");
    for c in COMMANDS {
        assert!(script.contains(c), "{c}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuwatch.bash");
    std::fs::write(&path, &script).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    for shell in ["zsh", "fish"] {
        let (ok, s, _) = gpuwatch(&["completions", shell]);
        assert!(ok && s.contains("serve"), "{shell}");
    }
}

#[test]
fn man_page_is_roff_for_section_1() {
    let (ok, page, err) = gpuwatch(&["man"]);
    assert!(ok, "{err}");
    assert!(page.contains(".TH gpuwatch 1"), "{page}");
    let page = page.replace("\\-", "-"); // roff escapes hyphens
    for c in COMMANDS {
        assert!(page.contains(c), "{c}");
    }
}

/// `man --dir` writes a page per subcommand, each with that subcommand's own options.
#[test]
fn man_dir_holds_a_page_for_each_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let (ok, _, err) = gpuwatch(&["man", "--dir", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    let main = std::fs::read_to_string(out.join("gpuwatch.1")).unwrap();
    assert!(main.contains(".TH gpuwatch 1"), "{main}");
    for c in COMMANDS {
        let file = out.join(format!("gpuwatch-{c}.1"));
        let page = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .replace("\\-", "-");
        assert!(page.contains(&format!(".TH gpuwatch-{c} 1")), "{page}");
    }
    let snapshot = std::fs::read_to_string(out.join("gpuwatch-snapshot.1"))
        .unwrap()
        .replace("\\-", "-");
    assert!(snapshot.contains("--json"), "{snapshot}");
    let serve = std::fs::read_to_string(out.join("gpuwatch-serve.1"))
        .unwrap()
        .replace("\\-", "-");
    assert!(serve.contains("--web.listen-address"), "{serve}");
}

/// DOCKER_HOST names the socket when no flag does: rootless Docker and Podman's compatible
/// socket are found the way the docker CLI finds them.
#[test]
fn docker_host_names_the_socket() {
    let out = Command::new(support::gpuwatch_bin())
        .args([
            "snapshot",
            "--json",
            "--no-nvml",
            "--no-ebpf",
            "--window",
            "1s",
        ])
        .env("DOCKER_HOST", "unix:///nonexistent/gpuwatch-test.sock")
        .env_remove("GPUWATCH_DOCKER_SOCKET")
        .output()
        .unwrap();
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let docker = &snap["sources"]["docker"];
    assert_eq!(docker["up"], false, "{docker}");
    assert!(
        docker["detail"]
            .as_str()
            .is_some_and(|d| d.contains("/nonexistent/gpuwatch-test.sock")),
        "{docker}"
    );
}

/// Habits from nvidia-smi and gpustat: bare `gpuwatch` is a snapshot (exit 0), and a bare
/// number after `--interval`, `--duration` or `--window` is seconds; units still work. A usage
/// error exits 64, apart from doctor's "at risk" (2).
#[test]
fn bare_gpuwatch_is_a_snapshot_and_bare_numbers_are_seconds() {
    let quiet = ["--no-nvml", "--no-docker", "--no-ebpf"];
    let run = |args: &[&str]| {
        Command::new(support::gpuwatch_bin())
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    // No arguments at all: a snapshot, its table on stdout.
    let bare = run(&[]);
    assert!(
        bare.status.success(),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    assert!(String::from_utf8_lossy(&bare.stdout).contains("VERDICT"));
    // Global flags only: still a snapshot, its table on stdout.
    let bare = run(&["--log", "error"]);
    let table = String::from_utf8_lossy(&bare.stdout);
    assert!(
        bare.status.success(),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    assert!(
        table.contains("KIND") && table.contains("VERDICT"),
        "{table}"
    );

    let mut snapshot = vec!["snapshot", "--json", "--window", "0.3"];
    snapshot.extend(quiet);
    let out = run(&snapshot);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let window = json["window_seconds"].as_f64().unwrap();
    assert!(
        (0.25..1.0).contains(&window),
        "--window 0.3 is 0.3 s: {window}"
    );

    let mut record = vec![
        "record",
        "--format",
        "jsonl",
        "--interval",
        "0.2",
        "--duration",
        "1",
    ];
    record.extend(quiet);
    let out = run(&record);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!((2..=6).contains(&rows), "1 s at 0.2 s: {rows} rows");

    for bad in [&["--bogus"][..], &["snapshot", "--window", "soon"][..]] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(64), "{bad:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}

/// `gpuwatch ARGS` for 2 s, then SIGTERM: its status and stdout.
fn for_two_seconds(args: &[&str]) -> (std::process::ExitStatus, String) {
    let child = Command::new(support::gpuwatch_bin())
        .args(args)
        .args(["--no-nvml", "--no-docker", "--no-ebpf"])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2000));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `snapshot -l SECONDS` prints again every interval until SIGTERM, as `nvidia-smi -l` does,
/// and ends with status 0; each print is a whole snapshot, the later ones covering about the
/// interval: JSON one line each (JSON Lines), a table after a line with its time. Bare
/// `gpuwatch -l 0.4` is the same, as `nvidia-smi -l 1` is.
#[test]
fn snapshot_loop_prints_every_interval_until_stopped() {
    let (status, text) = for_two_seconds(&["snapshot", "--json", "--window", "0.3", "-l", "0.4"]);
    assert!(status.success(), "{status:?}");
    let docs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: a line is a document: {l}"))
        })
        .collect();
    assert!(
        (3..=6).contains(&docs.len()),
        "{} snapshots in 2 s",
        docs.len()
    );
    for d in &docs[1..] {
        let w = d["window_seconds"].as_f64().unwrap();
        assert!(
            (0.3..0.8).contains(&w),
            "a later window covers the interval: {w}"
        );
    }
    let (status, text) = for_two_seconds(&["-l", "0.4", "--window", "0.3"]);
    assert!(status.success(), "{status:?}");
    let frames: Vec<&str> = text.split("KIND ").collect();
    assert!((4..=7).contains(&frames.len()), "{text}");
    // Each table after its time: an RFC 3339 line ending the frame before.
    let stamps = text
        .lines()
        .filter(|l| l.starts_with("20") && l.ends_with('Z') && l.contains('T'))
        .count();
    assert_eq!(stamps, frames.len() - 1, "{text}");
}

/// `--version` names the release, the git revision and the build date.
#[test]
fn version_names_the_revision_and_build_date() {
    let (ok, out, err) = gpuwatch(&["--version"]);
    assert!(ok, "{err}");
    let rest = out
        .trim()
        .strip_prefix(&format!("gpuwatch {} (", gpuwatch::VERSION))
        .unwrap_or_else(|| panic!("{out}"));
    let (revision, date) = rest
        .strip_suffix(')')
        .and_then(|r| r.split_once(", built "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        revision == "unknown"
            || (revision.len() == 12 && revision.chars().all(|c| c.is_ascii_hexdigit())),
        "{out}"
    );
    let parts: Vec<u32> = date.split('-').map(|p| p.parse().unwrap()).collect();
    assert!(
        parts.len() == 3 && parts[0] >= 2026 && (1..=12).contains(&parts[1]),
        "{out}"
    );
}

/// One idea, one spelling: every command that prints takes `--format`, and `--json` is its
/// JSON form; giving both is a usage error.
#[test]
fn json_is_short_for_format_json_everywhere() {
    let quiet = ["--no-nvml", "--no-docker", "--no-ebpf", "--log", "error"];
    let run = |args: &[&str]| {
        Command::new(support::gpuwatch_bin())
            .args(args)
            .output()
            .unwrap()
    };
    for cmd in [
        &["snapshot", "--window", "0.1"][..],
        &["doctor", "--window", "1"],
    ] {
        for spelling in [&["--json"][..], &["--format", "json"]] {
            let out = run(&[cmd, spelling, &quiet].concat());
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{cmd:?} {spelling:?}: {e}"));
            assert!(doc.is_object(), "{cmd:?} {spelling:?}");
        }
        let text = run(&[cmd, &["--format", "text"], &quiet].concat());
        assert!(serde_json::from_slice::<serde_json::Value>(&text.stdout).is_err());
        let both = run(&[cmd, &["--json", "--format", "text"], &quiet].concat());
        assert_eq!(both.status.code(), Some(64), "{cmd:?}: both spellings");
    }
    // doctor takes -i for --gpu, as snapshot, record and top do.
    let short = run(&[
        &["doctor", "-i", "0", "--json", "--window", "0.2"][..],
        &quiet,
    ]
    .concat());
    let long = run(&[
        &["doctor", "--gpu", "0", "--json", "--window", "0.2"][..],
        &quiet,
    ]
    .concat());
    assert_eq!(short.status.code(), long.status.code());
    let doc: serde_json::Value = serde_json::from_slice(&short.stdout).expect("doctor -i: JSON");
    assert!(
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["check"] == "launch_gpus"),
        "{doc:#}"
    );
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("r.csv");
    std::fs::write(
        &csv,
        "unix_ms,record,gpu_index,temperature_celsius\n1000,gpu,0,40\n2000,gpu,0,41\n",
    )
    .unwrap();
    let csv = csv.to_str().unwrap();
    let short = run(&["report", csv, "--json"]);
    let long = run(&["report", csv, "--format", "json"]);
    assert!(
        short.status.success(),
        "{}",
        String::from_utf8_lossy(&short.stderr)
    );
    assert_eq!(short.stdout, long.stdout);
    serde_json::from_slice::<serde_json::Value>(&short.stdout).expect("JSON");
    let lines = run(&[
        &["record", "--json", "--interval", "0.2", "--duration", "0.5"][..],
        &quiet,
    ]
    .concat());
    let text = String::from_utf8_lossy(&lines.stdout);
    assert!(
        lines.status.success() && text.lines().count() >= 1,
        "{text}"
    );
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).expect("a JSON line");
    }
}

/// Intervals outside 100 ms to 24 h are refused before anything starts: `1ns` made `watch`
/// spin a CPU and grow 175 MB/s, `300000000000y` passed `check-config` and then panicked.
#[test]
fn absurd_intervals_are_refused_where_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.yaml");
    let out = dir.path().join("rec.csv");
    // `record` with no source but the clock, for a second, and `extra`.
    let record = |extra: &[&str]| {
        let mut args = vec!["record", "--no-nvml", "--no-docker", "--no-ebpf"];
        args.extend(["--duration", "1s", "-o", out.to_str().unwrap()]);
        args.extend(extra);
        gpuwatch(&args)
    };
    for (value, shown) in [("1ns", "1ns"), ("300000000000y", "300000000000years")] {
        std::fs::write(&config, format!("# sampling\ninterval: {value}\n")).unwrap();
        let (ok, _, err) = gpuwatch(&["check-config", config.to_str().unwrap()]);
        assert!(!ok, "{value} passed check-config");
        assert!(
            err.contains("line 2") && err.contains("field `interval`"),
            "{value}: {err}"
        );
        assert!(
            err.contains(&format!("{shown} is outside 100ms to 24h")),
            "{err}"
        );
        let (ok, _, err) = record(&["--config", config.to_str().unwrap()]);
        assert!(!ok, "record ran with interval {value}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (ok, _, err) = record(&["--interval", "1ns"]);
    assert!(!ok, "record --interval 1ns ran");
    assert!(
        err.contains("--interval: 1ns is outside 100ms to 24h"),
        "{err}"
    );
}

/// SIGTERM ends `watch`, `record` and `serve` within 2 s at either end of the interval's range
/// (`100us` took 70 s to stop before intervals were bounded; a 24-h interval must not wait
/// out its sleep).
#[test]
fn sigterm_ends_a_run_promptly_at_either_end_of_the_interval_range() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rec.csv");
    let out = out.to_str().unwrap();
    for interval in ["100ms", "24h"] {
        for command in [
            &["watch"][..],
            &["record", "-o", out],
            &["serve", "--web.listen-address", "127.0.0.1:0"],
        ] {
            let mut child = Command::new(support::gpuwatch_bin())
                .args(command)
                .args([
                    "--interval",
                    interval,
                    "--no-nvml",
                    "--no-docker",
                    "--no-ebpf",
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let (status, took) = support::sigterm_and_wait(&mut child);
            assert!(
                took < std::time::Duration::from_secs(2),
                "{command:?} at {interval}: {took:?}"
            );
            assert_eq!(status.code(), Some(0), "{command:?} at {interval}");
        }
    }
}

/// `report` and `plot` read the shipped H100 recording (JSON Lines): every labelled job's main
/// verdict is the one its label names, and the findings come first, worst first.
#[test]
fn report_and_plot_read_the_shipped_h100_recording() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/h100-jobs.jsonl");
    let example = example.to_str().unwrap();
    let (ok, json, err) = gpuwatch(&["report", example, "--format", "json"]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    let main = |label: &str| -> String {
        r["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == format!("/gw-acc-{label}"))
            .unwrap_or_else(|| panic!("no job {label}"))["main_verdict"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for (label, verdict) in [
        ("gpu_bound", "GPU-bound"),
        ("pinned", "GPU-bound"),
        ("idle", "idle"),
        ("launch", "host-bound: launches"),
        ("loader_cpu", "input-bound: CPU"),
        ("quota", "input-bound: CPU"),
        ("loader_io", "input-bound: I/O"),
        ("low_sm", "low SM activity"),
        ("pageable", "host-bound: transfers"),
        ("sync", "host-bound: sync"),
        ("trainer_cpu", "host-bound: CPU"),
    ] {
        assert_eq!(main(label), verdict, "{label}");
    }
    let findings = r["findings"].as_array().unwrap();
    assert_eq!(findings[0]["name"], "/gw-acc-loader_io", "{findings:#?}");
    let idle: Vec<f64> = findings
        .iter()
        .map(|f| f["idle_gpu_hours"].as_f64().unwrap())
        .collect();
    assert!(idle.windows(2).all(|p| p[0] >= p[1]), "{idle:?}");
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let (ok, _, err) = gpuwatch(&["plot", example, "-o", plots.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(plots.join("gpu0-temperature-memory.png").exists());
    assert!(plots.join("container-gw-acc-loader_io.png").exists());
}

/// `compare` on two recordings cut from the shipped H100 one: a job copying from pageable
/// memory, then the same model with pinned copies, renamed alike so they match.
#[test]
fn compare_matches_a_job_across_recordings_and_gives_its_busy_gain() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/h100-jobs.jsonl");
    let text = std::fs::read_to_string(&example).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = |job: &str, file: &str| {
        let mut out = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut row: serde_json::Value = serde_json::from_str(line).unwrap();
            let ws = row["workloads"].as_array_mut().unwrap();
            ws.retain(|w| w["name"] == job);
            for w in ws.iter_mut() {
                w["name"] = "/job".into();
            }
            out.push_str(&row.to_string());
            out.push('\n');
        }
        let path = dir.path().join(file);
        std::fs::write(&path, out).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let before = cut("/gw-acc-pageable", "before.jsonl");
    let after = cut("/gw-acc-pinned", "after.jsonl");
    // The expected figures from `report` of the whole recording.
    let (ok, json, err) = gpuwatch(&["report", example.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    let busy = |name: &str| {
        r["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()["gpu_busy"]["mean"]
            .as_f64()
            .unwrap()
    };
    let (pageable, pinned) = (busy("/gw-acc-pageable"), busy("/gw-acc-pinned"));
    let (ok, json, err) = gpuwatch(&["compare", &before, &after, "--json"]);
    let (_, long, _) = gpuwatch(&["compare", &before, &after, "--format", "json"]);
    assert_eq!(json, long, "--json is short for --format json");
    assert!(ok, "{err}");
    let c: serde_json::Value = serde_json::from_str(&json).unwrap();
    let pair = &c["containers"][0];
    assert_eq!(pair["key"], "/job", "{c:#}");
    assert_eq!(pair["before"]["main_verdict"], "host-bound: transfers");
    assert_eq!(pair["after"]["main_verdict"], "GPU-bound");
    let ratio = pair["gpu_busy_ratio"].as_f64().unwrap();
    assert!(
        (ratio - pinned / pageable).abs() < 1e-9,
        "{ratio} vs {pinned}/{pageable}"
    );
    assert!(ratio > 2.0, "pinned copies doubled the GPU's work: {ratio}");
    let (ok, table, err) = gpuwatch(&["compare", &before, &after]);
    assert!(ok, "{err}");
    assert!(table.contains(&format!("{ratio:.2}×")), "{table}");
}

/// `gpuwatch … | head`: a reader that closes the pipe before the command writes ends the
/// command quietly with status 0, as it asked for no more (it printed "Broken pipe (os error
/// 32)" with status 1, and `completions` panicked).
#[test]
fn a_reader_that_closes_the_pipe_ends_the_command_quietly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let example = root.join("examples/h100-jobs.jsonl");
    let config = root.join("deploy/gpuwatch.yaml");
    let (example, config) = (example.to_str().unwrap(), config.to_str().unwrap());
    // The Markdown report writes its charts beside where it runs.
    let cwd = tempfile::tempdir().unwrap();
    for args in [
        &["report", example, "--format", "json"][..],
        &["report", example],
        &["completions", "bash"],
        &["man"],
        &["check-config", config],
    ] {
        let mut child = Command::new(support::gpuwatch_bin())
            .args(args)
            .current_dir(cwd.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // closed before it writes a byte
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// A recording without GPU data (as made while NVML was down: containers with CPU and memory,
/// no GPU rows): `plot` fails saying so, instead of writing nothing and succeeding.
#[test]
fn plot_of_a_recording_without_gpu_data_fails_and_says_why() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/h100-jobs.jsonl");
    let text = std::fs::read_to_string(example).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.jsonl");
    let mut out = String::new();
    for line in text.lines().take(200) {
        let mut snap: serde_json::Value = serde_json::from_str(line).unwrap();
        snap["gpus"] = serde_json::json!([]);
        for w in snap["workloads"].as_array_mut().unwrap() {
            w["gpu"] = serde_json::json!({"memory_bytes": 0, "processes": 0, "per_gpu": []});
            w["verdict"] = serde_json::Value::Null;
        }
        out.push_str(&snap.to_string());
        out.push('\n');
    }
    std::fs::write(&rec, out).unwrap();
    let (ok, report, err) = gpuwatch(&["report", rec.to_str().unwrap()]);
    assert!(ok, "the recording reads: {err}");
    assert!(report.contains("0 GPU(s)"), "{report}");
    let plots = dir.path().join("plots");
    let (ok, out, err) = gpuwatch(&["plot", rec.to_str().unwrap(), "-o", plots.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("no GPU data to plot") && err.contains("rec.jsonl"),
        "{err}"
    );
}

/// A missing file: the error names it, and its cause once (it was printed twice).
#[test]
fn a_missing_file_is_named_with_its_cause_once() {
    for command in ["report", "plot", "check-config"] {
        let (ok, _, err) = gpuwatch(&[command, "/nonexistent/rec.csv"]);
        assert!(!ok, "{command}");
        assert!(err.contains("/nonexistent/rec.csv"), "{command}: {err}");
        assert_eq!(
            err.matches("No such file or directory").count(),
            1,
            "{command}: {err}"
        );
    }
}

/// Runs gpuwatch with `args`; its exit status, stderr and peak RSS in KiB (from `wait4`, this
/// child's alone).
#[allow(clippy::zombie_processes)] // reaped by wait4, which also gives its usage
fn gpuwatch_peak(args: &[&str]) -> (i32, String, i64) {
    use std::io::Read;
    let mut child = Command::new(support::gpuwatch_bin())
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // SAFETY: wait4 on this test's own child, writing the status and usage it is given.
    let (status, peak) = unsafe {
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(
            libc::wait4(child.id() as i32, &mut status, 0, &mut usage),
            child.id() as i32
        );
        (status, usage.ru_maxrss)
    };
    (status, err, peak)
}

/// A file that is no recording and has no line break (`/dev/zero`, a sparse file, a blob):
/// `report`, `compare` and `plot` stop at the first row past the bound with an error naming the
/// line, holding one row's memory (`/dev/zero` took 10.9 GB in 30 s, a 4-GB sparse file
/// 12.6 GB, before rows were bounded).
#[test]
fn a_file_without_line_breaks_is_refused_with_flat_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("sparse.csv");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let sparse = sparse.to_str().unwrap();
    let plots = dir.path().join("plots");
    for args in [
        &["report", "/dev/zero"][..],
        &["report", sparse, "--json"],
        &["compare", sparse, sparse],
        &["plot", "/dev/zero", "-o", plots.to_str().unwrap()],
    ] {
        let (status, err, peak_kib) = gpuwatch_peak(args);
        assert_ne!(status, 0, "{args:?}");
        assert!(
            err.contains("line 1: a row longer than 32 MiB"),
            "{args:?}: {err}"
        );
        assert!(peak_kib < 256 << 10, "{args:?} peaked at {peak_kib} KiB");
    }
}

/// Each command's help lists its own flags first and the flags every command takes after, under
/// their own heading (they came first, interleaved with the command's own).
#[test]
fn each_commands_help_lists_its_own_flags_before_the_global_ones() {
    for c in COMMANDS {
        let (ok, help, err) = gpuwatch(&[c, "--help"]);
        assert!(ok, "{c}: {err}");
        let global = help
            .find("\nGlobal options:\n")
            .unwrap_or_else(|| panic!("{c}: no global options heading in\n{help}"));
        for flag in ["--log-format", "--log <LOG>", "--config"] {
            let at = help.find(flag).unwrap_or_else(|| panic!("{c}: no {flag}"));
            assert!(at > global, "{c}: {flag} before the heading\n{help}");
        }
        assert!(
            help[..global].contains("-h, --help"),
            "{c}: its own options first\n{help}"
        );
    }
}
