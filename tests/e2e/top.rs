//! `gpuwatch top` driven like a person would, under tmux: real containers, keys sent with
//! `send-keys`, the screen read with `capture-pane`.

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// A tmux server of its own (its own socket), killed on drop. Each test gets its own: the
/// tests of this file run at once, and a shared socket let one kill the other's server.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            socket: format!("gpuwatch-top-{}-{n}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux (Debian package `tmux`, installed by `cargo xtask setup`)")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Waits until the screen satisfies `pred`; returns it.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "waiting for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The line index of the first line containing `needle`.
fn line_of(screen: &str, needle: &str) -> usize {
    screen
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} not on screen:\n{screen}"))
}

#[test]
fn live_view_sorts_filters_and_quits() {
    require_root();
    let big = Container::start(
        &unique("top-big"),
        &[("com.docker.compose.service", "big")],
        "sleep 3600",
    );
    let busy = Container::start(&unique("top-busy"), &[], "sleep 3600");
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&json!({"devices": [{"uuid": "GPU-top", "temperature": 61,
            "processes": [
                {"pid": big.pid, "used_memory_bytes": 40 * GIB, "sm_util": 10},
                {"pid": busy.pid, "used_memory_bytes": 2 * GIB, "sm_util": 90}]}]}))
        .unwrap(),
    )
    .unwrap();
    let tmux = Tmux::new();
    let command = format!(
        "env FAKE_NVML_SCENARIO={} NO_COLOR=1 {} top --nvml-lib {} --interval 500ms",
        scenario.display(),
        support::gpuwatch_bin().display(),
        fake_nvml_lib().display()
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "30",
        &command,
    ]);
    assert!(started.status.success(), "{started:?}");

    // Both containers, the GPU, sorted by GPU memory: the big one first.
    // (The first round has no window yet: BUSY fills in from the second.)
    let has_busy = |s: &str, name: &str| {
        s.lines()
            .find(|l| l.contains(name))
            .is_some_and(|l| l.split_whitespace().any(|w| w.ends_with('%')))
    };
    let s = tmux.wait_for("both containers with their GPU busy", |s| {
        has_busy(s, &big.name) && has_busy(s, &busy.name)
    });
    assert!(s.contains("Fake NVIDIA H200") && s.contains("61"), "{s}");
    // The data is drawn, not only the frame: the GPU row's memory (its processes' 40 + 2 GiB
    // and the driver's own) and its two processes; each container's GPU memory beside its name.
    let gpu_row = &s.lines().collect::<Vec<_>>()[line_of(&s, "Fake NVIDIA H200")];
    let cells: Vec<&str> = gpu_row.split_whitespace().collect();
    let used: f64 = cells
        .iter()
        .find_map(|c| c.split_once('/').and_then(|(u, _)| u.parse().ok()))
        .unwrap_or_else(|| panic!("no memory cell: {gpu_row}"));
    assert!((42.0..43.0).contains(&used), "{gpu_row}");
    assert!(cells.contains(&"61") && cells.contains(&"2"), "{gpu_row}");
    for (name, memory) in [(&big.name, "40.00 GiB"), (&busy.name, "2.00 GiB")] {
        let row = &s.lines().collect::<Vec<_>>()[line_of(&s, name)];
        assert!(row.contains(memory), "{name}: {row}");
    }
    assert!(s.contains("sorted by GPU memory"));
    assert!(line_of(&s, &big.name) < line_of(&s, &busy.name), "{s}");

    // s: sort by GPU busy — the busy one first.
    tmux.keys(&["s"]);
    let s = tmux.wait_for("sorted by GPU busy", |s| s.contains("sorted by GPU busy"));
    assert!(line_of(&s, &busy.name) < line_of(&s, &big.name), "{s}");

    // /: filter by part of a name; only that container stays.
    tmux.keys(&["/"]);
    tmux.keys(&["-l", "top-big"]);
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("the filter applied", |s| s.contains("filter \"top-big\""));
    assert!(s.contains(&big.name) && !s.contains(&busy.name), "{s}");

    // q: quits, and the terminal is given back (the session ends with the program).
    tmux.keys(&["q"]);
    let t = Instant::now();
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(t.elapsed() < Duration::from_secs(10), "top did not quit");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The terminal hangs up (a killed tmux, a closed SSH session) without a `q`: top ends
/// instead of spinning on a terminal that is gone.
#[test]
fn top_ends_when_its_terminal_hangs_up() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(&scenario, br#"{"devices": [{"uuid": "GPU-hup"}]}"#).unwrap();
    let tmux = Tmux::new();
    let command = format!(
        "env FAKE_NVML_SCENARIO={} NO_COLOR=1 {} top --nvml-lib {} --no-docker --no-ebpf --interval 500ms",
        scenario.display(),
        support::gpuwatch_bin().display(),
        fake_nvml_lib().display()
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "120",
        "-y",
        "30",
        &command,
    ]);
    assert!(started.status.success(), "{started:?}");
    tmux.wait_for("the GPU table", |s| s.contains("GPUs"));
    let pane = tmux.run(&["display-message", "-p", "-t", "top", "#{pane_pid}"]);
    let pid: i32 = String::from_utf8_lossy(&pane.stdout)
        .trim()
        .parse()
        .unwrap();
    let _ = tmux.run(&["kill-server"]);
    let t = Instant::now();
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if state.split(' ').nth(2) == Some("Z") {
            break; // ended; its parent has not reaped it yet
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "top still runs 5 s after its terminal hung up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
