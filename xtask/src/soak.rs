//! `cargo xtask soak`: the agent over time under churn. `gpuwatch serve` (release build, the
//! fake NVML with one GPU, real Docker and eBPF) runs while a container is started every second
//! and each lives a few seconds; `/metrics` is scraped every second. Its resident memory, open
//! files, series count, probe map entries and internal events are printed at the start (after a
//! warm-up) and at the end, so growth shows as a ratio. A benchmark, not a test: it needs root,
//! dockerd and minutes.
use crate::cargo;
use crate::image::BASE;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// How long to churn, in minutes.
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,
    /// How long each container lives, in seconds.
    #[arg(long, default_value_t = 5)]
    pub lifetime: u64,
}

fn say(msg: &str) {
    eprintln!("[soak] {msg}");
}

/// What is measured of the agent at one moment.
#[derive(Debug, Default)]
struct Sample {
    rss_kib: u64,
    open_files: usize,
    series: usize,
    container_series: usize,
    task_map_entries_used: u64,
    internal_events: u64,
}

pub fn run(args: &Args) -> Result<()> {
    cargo(&["build", "--release", "-p", "gpuwatch", "-p", "fake-nvml"])?;
    crate::image::base()?;
    let dir = std::env::temp_dir().join(format!("gpuwatch-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let scenario = dir.join("scenario.json");
    std::fs::write(
        &scenario,
        r#"{"devices": [{"uuid": "GPU-00000000-0000-0000-0000-00000000500a"}]}"#,
    )?;
    let agent = crate::fake_agent::FakeAgent::start(&scenario, "127.0.0.1:0", "1s")?;
    let url = agent.url.clone();
    let addr = agent.addr().to_owned();
    let pid = agent.pid();

    let churn_for = Duration::from_secs(args.minutes * 60);
    let warm_up = Duration::from_secs(30);
    say(&format!(
        "{url}: a container a second (each living {} s) for {} min, /metrics every second",
        args.lifetime, args.minutes
    ));
    let started = Instant::now();
    let mut first: Option<Sample> = None;
    let mut scrapes = 0u64;
    let mut containers = 0u64;
    while started.elapsed() < churn_for {
        let tick = Instant::now();
        let status = Command::new("docker")
            .args([
                "run",
                "-d",
                "--rm",
                "--label",
                "gpuwatch.soak=1",
                BASE,
                "sleep",
            ])
            .arg(args.lifetime.to_string())
            .stdout(Stdio::null())
            .status()
            .context("docker run")?;
        if status.success() {
            containers += 1;
        }
        if http_get(&addr, "/metrics").is_ok() {
            scrapes += 1;
        }
        if first.is_none() && started.elapsed() >= warm_up {
            first = Some(sample(&addr, pid)?);
        }
        std::thread::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed()));
    }
    let last = sample(&addr, pid)?;
    let _ = Command::new("sh")
        .args([
            "-c",
            "docker rm -f $(docker ps -aq --filter label=gpuwatch.soak=1) 2>/dev/null",
        ])
        .status();
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    let first = first.context("the churn ended before the warm-up")?;
    println!(
        "{} containers started, {scrapes} scrapes, over {:.0} s (first sample after {} s)",
        containers,
        started.elapsed().as_secs_f64(),
        warm_up.as_secs()
    );
    println!("{:<28} {:>10} {:>10} {:>7}", "", "start", "end", "ratio");
    let rows: [(&str, f64, f64); 6] = [
        ("RSS (KiB)", first.rss_kib as f64, last.rss_kib as f64),
        (
            "open files",
            first.open_files as f64,
            last.open_files as f64,
        ),
        ("series", first.series as f64, last.series as f64),
        (
            "container series",
            first.container_series as f64,
            last.container_series as f64,
        ),
        (
            "task map entries in use",
            first.task_map_entries_used as f64,
            last.task_map_entries_used as f64,
        ),
        (
            "internal events",
            first.internal_events as f64,
            last.internal_events as f64,
        ),
    ];
    for (name, a, b) in rows {
        let ratio = if a > 0.0 { b / a } else { f64::NAN };
        println!("{name:<28} {a:>10.0} {b:>10.0} {ratio:>7.2}");
    }
    Ok(())
}

fn sample(addr: &str, pid: u32) -> Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let metrics = http_get(addr, "/metrics")?;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let snapshot: serde_json::Value = serde_json::from_str(&http_get(addr, "/api/v1/snapshot")?)
        .context("the snapshot API's JSON")?;
    let internal_events = snapshot["internal_events"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum());
    Ok(Sample {
        rss_kib,
        open_files,
        series: series.len(),
        container_series: series
            .iter()
            .filter(|l| l.starts_with("gpuwatch_container_"))
            .count(),
        task_map_entries_used: snapshot["probes"]["task_map_entries_used"]
            .as_u64()
            .unwrap_or(0),
        internal_events,
    })
}

/// A plain HTTP/1.0 GET (the agent's own endpoints; no client library in xtask).
pub(crate) fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("an HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}
