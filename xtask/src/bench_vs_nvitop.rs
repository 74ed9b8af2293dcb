//! `xtask bench-vs-nvitop`: what gpuwatch costs beside nvitop, measured side by side over the
//! same GPU load, one tool after the other, on a GPU machine (run the carried xtask binary
//! there, as root, from the repository root; `cargo xtask gpu-bundle` makes it).
//!
//! Method: a load of CUDA processes (tests/gpu/torch_job.py, a 4096² matmul loop each) in child
//! cgroups; each tool runs alone for `--seconds`: gpuwatch as users run it — `serve` in its
//! default configuration (5-s rounds, Docker on where a daemon answers, eBPF on, the default
//! series interval) scraped every 15 s and every second — and `record --no-docker` at 1 Hz; and
//! nvitop's API refreshing every device's processes with their SM, CPU and memory figures at
//! 1 Hz. `--also-interval 1s` adds `serve` sampling every second. Steady state is
//! the on-CPU time of all the tool's threads (`/proc/<pid>/task/*/schedstat`) from `--warmup`
//! seconds in to the end, per second (the window is printed; a whole number of the agent's 10-s
//! series fetches, or the run is refused); peak RSS is `VmHWM`. Two loads:
//! one workload holding the GPU, and two sharing it. What a round gathers depends on the load
//! (adaptive read and CUDA tracing, the driver's per-process split on a shared GPU), so each
//! `serve` row is printed with what it had switched on at the end of its window, and when.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds each tool runs; less `--warmup`, a whole number of series fetches.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds of start-up left out of the steady state.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    #[arg(long, default_value = ".device/gpuwatch")]
    gpuwatch: PathBuf,
    /// Where nvitop's wheel is (installed into a private folder if nvitop is missing).
    #[arg(long, default_value = ".device/wheels")]
    wheels: PathBuf,
    /// CUDA processes in the load.
    #[arg(long, default_value_t = 4)]
    procs: usize,
    /// Also measure gpuwatch with its eBPF probes off.
    #[arg(long)]
    no_ebpf_too: bool,
    /// Where `serve` listens while it is measured.
    #[arg(long, default_value = "127.0.0.1:19879")]
    listen: String,
    /// Also measure `serve` sampling at this interval (e.g. `5s`), scraped every 15 s; repeat
    /// for several. What a longer round interval saves, beside the 1-s rows.
    #[arg(long = "also-interval")]
    also_intervals: Vec<String>,
    /// Instead: how each tool's cost grows from `--procs` CUDA processes in one cgroup to this
    /// many in eight (`serve` scraped every 15 s, and nvitop).
    #[arg(long)]
    growth_to: Option<usize>,
}

/// Scrapes `/metrics` every `every` until dropped, as Prometheus would.
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Scraper {
    fn start(address: String, every: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut answered = 0;
            let mut next = Instant::now() + Duration::from_secs(2);
            while !flag.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    answered += u64::from(scrape(&address));
                    next += every;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            answered
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops scraping; how many scrapes were answered.
    fn finish(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

/// One `GET /metrics`; whether it was answered 200.
fn scrape(address: &str) -> bool {
    metrics(address).is_some()
}

/// One `GET /metrics`: the body, when answered 200.
fn metrics(address: &str) -> Option<String> {
    get(address, "/metrics")
}

/// One `GET path` as HTTP/1.0, so that the body comes whole, not in chunks: the body, when
/// answered 200.
fn get(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(address).ok()?;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    conn.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_owned())
}

/// What `serve` had switched on at the end of a window, from its snapshot: the evidence a
/// round gathers (and pays for) depends on what the load looks like, so a row's cost is read
/// beside it. `None` when the snapshot is not answered.
/// A switch thrown inside the window (`window_from_ms`, Unix ms) put its one-time cost there
/// (attaching the CUDA probes to every process mapping the library), so the row says when.
fn evidence(address: &str, window_from_ms: u64) -> Option<String> {
    let snap: serde_json::Value = serde_json::from_str(&get(address, "/api/v1/snapshot")?).ok()?;
    evidence_of(&snap, window_from_ms)
}

/// [`evidence`] from a snapshot's JSON.
fn evidence_of(snap: &serde_json::Value, window_from_ms: u64) -> Option<String> {
    let cuda = &snap["cuda_tracing"];
    let cuda_on = match (
        cuda["attached"].as_bool(),
        cuda["on_since_unix_ms"].as_u64(),
    ) {
        (Some(true), Some(since)) if since >= window_from_ms => format!(
            "on {:.1} s into the window",
            (since - window_from_ms) as f64 / 1e3
        ),
        (Some(true), _) => "on before the window".to_owned(),
        _ => "off".to_owned(),
    };
    let reads = &snap["probes"]["io_tracing"];
    let splits: Vec<String> = snap["gpus"]
        .as_array()?
        .iter()
        .map(|g| {
            let asked = g["processes"].as_array().map_or(0, |ps| {
                ps.iter()
                    .filter(|p| !p["driver_sm_percent"].is_null())
                    .count()
            });
            format!(
                "GPU {} split {} (driver figures for {asked} processes)",
                g["index"],
                g["busy"]["split"].as_str().unwrap_or("none"),
            )
        })
        .collect();
    Some(format!(
        "CUDA tracing {cuda_on} ({}), read tracing {} ({}); {}",
        cuda["reason"].as_str().unwrap_or("not wanted"),
        reads["state"].as_str().unwrap_or("?"),
        reads["reason"].as_str().unwrap_or("not wanted"),
        splits.join("; ")
    ))
}

/// The sampling thread's CPU seconds by step of a round (`gpuwatch_sampling_cpu_seconds_total`)
/// as of the last published round, and that round's time.
struct Steps {
    seconds: std::collections::BTreeMap<String, f64>,
    round_at: f64,
}

impl Steps {
    fn read(address: &str) -> Option<Self> {
        let text = metrics(address)?;
        let mut seconds = std::collections::BTreeMap::new();
        let mut round_at = None;
        for line in text.lines() {
            let value = || line.rsplit_once(' ')?.1.parse::<f64>().ok();
            if let Some(rest) = line.strip_prefix("gpuwatch_sampling_cpu_seconds_total{") {
                let step = rest.split('"').nth(1)?;
                seconds.insert(step.to_owned(), value()?);
            } else if line.starts_with("gpuwatch_last_collection_timestamp_seconds ") {
                round_at = value();
            }
        }
        Some(Self {
            seconds,
            round_at: round_at?,
        })
    }

    /// ms of CPU per second by step between two readings, over the span between their rounds
    /// (rounds are published in batches, when the series covers them).
    fn rates(&self, later: &Self) -> Vec<(String, f64)> {
        let span = later.round_at - self.round_at;
        if span <= 0.0 {
            return Vec::new();
        }
        later
            .seconds
            .iter()
            .map(|(step, s)| {
                let before = self.seconds.get(step).copied().unwrap_or(0.0);
                (step.clone(), (s - before) * 1e3 / span)
            })
            .collect()
    }
}

/// Whether a Docker daemon answers on the default socket (the user's default configuration
/// then has Docker on).
fn docker_answers() -> bool {
    std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok()
}

const NVITOP_REFRESH: &str = r#"
import time
from nvitop import Device
devices = Device.all()
while True:
    for d in devices:
        d.gpu_utilization(); d.memory_used()
        for p in d.processes().values():
            p.gpu_sm_utilization(); p.gpu_memory(); p.cpu_percent(); p.host_memory()
    time.sleep(1)
"#;

struct Measured {
    tool: String,
    load: String,
    steady_ms_per_s: f64,
    peak_rss_mib: f64,
    /// Resident anonymous and file-backed MiB at the end (the steady state's).
    end_rss_mib: (f64, f64),
    /// (thread name, ms of CPU per second) of the threads that ran, busiest first.
    threads: Vec<(String, f64)>,
    /// `serve`'s sampling thread by step of a round, ms of CPU per second.
    steps: Vec<(String, f64)>,
    /// `serve`'s tracing and split at the end of the window ([`evidence`]).
    evidence: Option<String>,
}

/// On-CPU nanoseconds of each thread of `pid`, by thread id, with its name.
fn thread_cpu_ns(pid: u32) -> std::collections::HashMap<String, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if let Some(ns) = ns {
            let tid = t.file_name().to_string_lossy().into_owned();
            out.insert(tid, (name.trim().to_owned(), ns));
        }
    }
    out
}

/// A `/proc/<pid>/status` figure in KiB (`VmHWM`, `RssAnon`, ...); 0 where it is missing.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn measure(
    tool: &str,
    load: &str,
    mut cmd: Command,
    scrape_every: Option<Duration>,
    args: &Args,
) -> Result<Measured> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    let pid = child.id();
    let started = Instant::now();
    let scraper = scrape_every.map(|every| Scraper::start(args.listen.clone(), every));
    std::thread::sleep(Duration::from_secs(args.warmup));
    // The agent's own step counters, read outside the window: the read is a scrape.
    let steps_at_start = scrape_every.and_then(|_| Steps::read(&args.listen));
    let (c0, t0) = (thread_cpu_ns(pid), Instant::now());
    let window_from_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    std::thread::sleep(Duration::from_secs(
        args.seconds.saturating_sub(args.warmup),
    ));
    let (c1, t1) = (thread_cpu_ns(pid), Instant::now());
    let steps = match (
        steps_at_start,
        scrape_every.and_then(|_| Steps::read(&args.listen)),
    ) {
        (Some(a), Some(b)) => a.rates(&b),
        _ => Vec::new(),
    };
    let evidence = scrape_every.and_then(|_| evidence(&args.listen, window_from_ms));
    let secs = (t1 - t0).as_secs_f64();
    // A thread that started in the window counts from 0.
    let mut threads: Vec<(String, f64)> = c1
        .iter()
        .map(|(tid, (name, ns))| {
            let before = c0.get(tid).map_or(0, |b| b.1);
            (name.clone(), ns.saturating_sub(before) as f64 / 1e6 / secs)
        })
        .filter(|(_, ms)| *ms > 0.0)
        .collect();
    threads.sort_by(|a, b| b.1.total_cmp(&a.1));
    let rss = status_kib(pid, "VmHWM");
    let mib = |field| status_kib(pid, field) as f64 / 1024.0;
    let end_rss_mib = (mib("RssAnon"), mib("RssFile"));
    let scrapes = scraper.map(Scraper::finish);
    if let Ok(Some(status)) = child.try_wait() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        bail!(
            "{tool} exited early ({status}) after {:?}: {err}",
            started.elapsed()
        );
    }
    if scrapes == Some(0) {
        bail!(
            "{tool}: no scrape of http://{}/metrics was answered",
            args.listen
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(Measured {
        tool: tool.to_owned(),
        load: load.to_owned(),
        steady_ms_per_s: threads.iter().map(|t| t.1).sum(),
        peak_rss_mib: rss as f64 / 1024.0,
        end_rss_mib,
        threads,
        steps,
        evidence,
    })
}

/// Waits (up to 90 s) until no process holds a GPU, and says which still do after that: a load
/// left from an earlier job (a killed parent's workers run on to their own end) would be
/// measured as part of this one's, and would make the GPU look shared.
fn wait_for_an_empty_gpu() -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = Command::new("nvidia-smi")
            .args(["--query-compute-apps=pid", "--format=csv,noheader"])
            .output()
            .context("running nvidia-smi")?;
        if !out.status.success() {
            bail!(
                "nvidia-smi: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let holders = compute_pids(&String::from_utf8_lossy(&out.stdout));
        if holders.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("processes {holders:?} still hold a GPU after 90 s; stop them before the bench");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The PIDs of `nvidia-smi --query-compute-apps=pid --format=csv,noheader`.
fn compute_pids(csv: &str) -> Vec<u32> {
    csv.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The load: `procs` CUDA processes split over `groups` child cgroups.
struct Load(Vec<Child>);

impl Load {
    fn start(procs: usize, groups: usize) -> Result<Self> {
        Self::start_holding(procs, groups, None)
    }

    /// `hold_gib`: what each process holds (by default process i of a group holds i GiB).
    fn start_holding(procs: usize, groups: usize, hold_gib: Option<f64>) -> Result<Self> {
        wait_for_an_empty_gpu()?;
        let mut children = Vec::new();
        let per = procs.div_ceil(groups);
        let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu +memory");
        for g in 0..groups {
            let cg = format!("/sys/fs/cgroup/gpuwatch-bench-{g}");
            std::fs::create_dir_all(&cg).with_context(|| format!("creating {cg}"))?;
            let child = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {cg}/cgroup.procs && exec python3 tests/gpu/torch_job.py --procs {per} --seconds 600{hold}",
                    hold = hold_gib.map_or(String::new(), |g| format!(" --hold-gib {g}"))
                ))
                .stdout(Stdio::piped())
                .spawn()
                .context("starting tests/gpu/torch_job.py")?;
            children.push(child);
        }
        let mut load = Self(children);
        load.wait_ready(per)?;
        Ok(load)
    }

    /// Waits until each group's `per` workers say they are ready, then a little longer; an
    /// error after four minutes (a worker that died, out of GPU memory say, never says so).
    fn wait_ready(&mut self, per: usize) -> Result<()> {
        use std::io::{BufRead, BufReader};
        let deadline = Instant::now() + Duration::from_secs(240);
        for c in &mut self.0 {
            let out = c.stdout.take().context("the load's stdout")?;
            let (tx, rx) = std::sync::mpsc::channel();
            // Reads on, so the workers never block on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if line.contains("worker ready") {
                        // Once nobody counts, the send fails: keep draining all the same.
                        let _ = tx.send(());
                    }
                }
            });
            for _ in 0..per {
                let left = deadline.saturating_duration_since(Instant::now());
                if rx.recv_timeout(left).is_err() {
                    bail!("the GPU load's workers were not all ready within four minutes");
                }
            }
        }
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("pkill").args(["-f", "torch_job.py"]).status();
    }
}

fn nvitop_path(wheels: &Path) -> Result<Option<PathBuf>> {
    let have = Command::new("python3")
        .args(["-c", "import nvitop"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if have {
        return Ok(None);
    }
    let target = std::env::temp_dir().join("gpuwatch-nvitop");
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--target",
    ])
    .arg(&target);
    for w in std::fs::read_dir(wheels)
        .with_context(|| format!("no nvitop here and no wheels in {}", wheels.display()))?
        .flatten()
    {
        cmd.arg(w.path());
    }
    if !cmd.status().context("pip install nvitop")?.success() {
        bail!("installing nvitop from {} failed", wheels.display());
    }
    Ok(Some(target))
}

/// `gpuwatch serve` as users run it (the default configuration), sampling every `interval`
/// where one is given, listening where the scraper looks.
fn serve_command(args: &Args, interval: Option<&str>) -> Command {
    let mut c = Command::new(&args.gpuwatch);
    c.args(["serve", "--web.listen-address", &args.listen]);
    if let Some(interval) = interval {
        c.args(["--interval", interval]);
    }
    c
}

/// nvitop's API refreshing at 1 Hz, from `site` where it was installed privately.
fn nvitop_command(site: Option<&Path>) -> Command {
    let mut c = Command::new("python3");
    c.args(["-c", NVITOP_REFRESH]);
    if let Some(site) = site {
        c.env("PYTHONPATH", site);
    }
    c
}

/// How often the agent fetches the GPU series in its default configuration
/// (`sources.nvml_series_interval`, `sampler::DEFAULT_SERIES_INTERVAL`).
const SERIES_EVERY_SECONDS: u64 = 10;

/// The steady window, when it holds a whole number of series fetches. A fetch costs ~4 ms of
/// CPU in one burst (`GetSamples` and GPM), so a window of 14 s holds one or two of them as
/// it falls and its total moves by ~0.3 ms/s between runs of the same load.
fn steady_window(seconds: u64, warmup: u64) -> Result<u64> {
    let window = seconds.saturating_sub(warmup);
    if window == 0 || !window.is_multiple_of(SERIES_EVERY_SECONDS) {
        bail!(
            "--seconds less --warmup is {window} s: make it a multiple of {SERIES_EVERY_SECONDS} s, \
             the agent's series interval, so every window holds the same number of fetches"
        );
    }
    Ok(window)
}

pub fn run(args: Args) -> Result<()> {
    steady_window(args.seconds, args.warmup)?;
    if let Some(to) = args.growth_to {
        return growth(&args, to);
    }
    let nvitop_site = nvitop_path(&args.wheels)?;
    let docker = docker_answers();
    let record = |extra: &[&str]| {
        let mut c = Command::new(&args.gpuwatch);
        c.args([
            "record",
            "--interval",
            "1s",
            "-o",
            "/dev/null",
            "--no-docker",
        ])
        .args(extra);
        c
    };
    let serve = || serve_command(&args, None);
    let nvitop = || nvitop_command(nvitop_site.as_deref());
    let docker_words = if docker {
        "Docker on"
    } else {
        "no Docker daemon"
    };
    let serve_15 = format!("gpuwatch serve ({docker_words}), scraped 15 s");
    let serve_1 = format!("gpuwatch serve ({docker_words}), scraped 1 s");
    let mut results = Vec::new();
    for (load, groups) in [("one workload", 1), ("two workloads sharing", 2)] {
        let _load = Load::start(args.procs, groups)?;
        let fifteen = Some(Duration::from_secs(15));
        results.push(measure(&serve_15, load, serve(), fifteen, &args)?);
        let one = Some(Duration::from_secs(1));
        results.push(measure(&serve_1, load, serve(), one, &args)?);
        for interval in &args.also_intervals {
            let name = format!("gpuwatch serve --interval {interval}, scraped 15 s");
            let command = serve_command(&args, Some(interval));
            results.push(measure(&name, load, command, fifteen, &args)?);
        }
        let no_docker = "gpuwatch record --no-docker";
        results.push(measure(no_docker, load, record(&[]), None, &args)?);
        results.push(measure("nvitop API refresh", load, nvitop(), None, &args)?);
        if args.no_ebpf_too {
            let m = measure(
                "gpuwatch record --no-docker --no-ebpf",
                load,
                record(&["--no-ebpf"]),
                None,
                &args,
            )?;
            results.push(m);
        }
    }
    println!(
        "steady window: {} s to {} s after each tool's start ({} s); serve at its default \
         interval unless named, record and nvitop at 1 Hz",
        args.warmup,
        args.seconds,
        args.seconds.saturating_sub(args.warmup)
    );
    println!(
        "{:<24} {:<52} {:>18} {:>14} {:>20}",
        "load", "tool", "steady ms CPU / s", "peak RSS MiB", "end anon/file MiB"
    );
    for r in &results {
        println!(
            "{:<24} {:<52} {:>18.3} {:>14.1} {:>13.1} / {:>4.1}",
            r.load, r.tool, r.steady_ms_per_s, r.peak_rss_mib, r.end_rss_mib.0, r.end_rss_mib.1
        );
    }
    for load in ["one workload", "two workloads sharing"] {
        let of = |tool: &str| results.iter().find(|r| r.load == load && r.tool == tool);
        let Some(n) = of("nvitop API refresh") else {
            continue;
        };
        let also = args
            .also_intervals
            .iter()
            .map(|i| format!("gpuwatch serve --interval {i}, scraped 15 s"));
        let tools = [serve_15.clone(), serve_1.clone()]
            .into_iter()
            .chain(also)
            .chain(["gpuwatch record --no-docker".to_owned()]);
        for tool in tools {
            if let Some(g) = of(&tool) {
                println!(
                    "{load}: {tool} / nvitop = {:.2} (CPU), {:.2} (peak RSS)",
                    g.steady_ms_per_s / n.steady_ms_per_s,
                    g.peak_rss_mib / n.peak_rss_mib
                );
            }
        }
    }
    print_threads(&results);
    print_steps(&results);
    Ok(())
}

/// Each row's busiest threads, so a total's change can be put on the thread that made it.
fn print_threads(rows: &[Measured]) {
    println!("per thread (ms CPU / s):");
    for r in rows {
        let top: Vec<String> = r
            .threads
            .iter()
            .take(8)
            .map(|(n, ms)| format!("{n} {ms:.3}"))
            .collect();
        println!("  {} / {}: {}", r.load, r.tool, top.join(", "));
    }
}

/// `serve`'s sampling thread by step, for the rows that have it.
fn print_steps(rows: &[Measured]) {
    println!("serve's sampling thread by step (ms CPU / s, between the published rounds):");
    for r in rows.iter().filter(|r| !r.steps.is_empty()) {
        let steps: Vec<String> = r
            .steps
            .iter()
            .map(|(step, ms)| format!("{step} {ms:.3}"))
            .collect();
        println!("  {} / {}: {}", r.load, r.tool, steps.join(", "));
    }
    println!("serve's evidence at the end of the window:");
    for r in rows {
        if let Some(e) = &r.evidence {
            println!("  {} / {}: {e}", r.load, r.tool);
        }
    }
}

/// Each tool's cost at `--procs` processes in one cgroup and at `to` in eight, and the ratio.
fn growth(args: &Args, to: usize) -> Result<()> {
    let nvitop_site = nvitop_path(&args.wheels)?;
    let serve = || serve_command(args, None);
    let nvitop = || nvitop_command(nvitop_site.as_deref());
    let fifteen = Some(Duration::from_secs(15));
    let serve_name = if docker_answers() {
        "gpuwatch serve (Docker on), scraped 15 s"
    } else {
        "gpuwatch serve (no Docker daemon), scraped 15 s"
    };
    let mut rows = Vec::new();
    for (procs, groups) in [(args.procs, 1), (to, 8)] {
        let load = format!("{procs} processes in {groups} cgroup(s)");
        // Half a GiB each: 32 processes holding 1-4 GiB each do not fit an 80-GB GPU.
        let _load = Load::start_holding(procs, groups, Some(0.5))?;
        rows.push(measure(serve_name, &load, serve(), fifteen, args)?);
        rows.push(measure("nvitop API refresh", &load, nvitop(), None, args)?);
    }
    println!(
        "steady window: {} s to {} s after each tool's start; serve at its default interval, \
         nvitop at 1 Hz",
        args.warmup, args.seconds
    );
    println!(
        "{:<32} {:<48} {:>13} {:>14} {:>20}",
        "load", "tool", "steady ms/s", "peak RSS MiB", "end anon/file MiB"
    );
    for r in &rows {
        println!(
            "{:<32} {:<48} {:>13.3} {:>14.1} {:>13.1} / {:>4.1}",
            r.load, r.tool, r.steady_ms_per_s, r.peak_rss_mib, r.end_rss_mib.0, r.end_rss_mib.1
        );
    }
    for tool in [serve_name, "nvitop API refresh"] {
        let of: Vec<&Measured> = rows.iter().filter(|r| r.tool == tool).collect();
        if let [small, large] = of[..] {
            println!(
                "{tool}: {} -> {} processes grows {:.2}x",
                args.procs,
                to,
                large.steady_ms_per_s / small.steady_ms_per_s
            );
        }
    }
    print_threads(&rows);
    print_steps(&rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpus_holders_are_read_from_nvidia_smis_list() {
        assert_eq!(compute_pids("1234\n 5678\n"), vec![1234, 5678]);
        assert_eq!(compute_pids(""), Vec::<u32>::new());
        assert_eq!(
            compute_pids("No running processes found\n"),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn evidence_says_what_the_round_switched_on() {
        let snap = serde_json::json!({
            "cuda_tracing": {"attached": true, "on_since_unix_ms": 1_004_200_u64,
                             "reason": "GPU 0 idle 60 % while busy"},
            "probes": {"io_tracing": {"state": "off", "reason": null}},
            "gpus": [{"index": 0, "busy": {"split": "process_samples"},
                      "processes": [{"driver_sm_percent": 12}, {"driver_sm_percent": null}]}]
        });
        assert_eq!(
            evidence_of(&snap, 1_000_000).as_deref(),
            Some(
                "CUDA tracing on 4.2 s into the window (GPU 0 idle 60 % while busy), read tracing off (not wanted); \
                 GPU 0 split process_samples (driver figures for 1 processes)"
            )
        );
        let mut early = snap.clone();
        early["cuda_tracing"]["on_since_unix_ms"] = serde_json::json!(999_000_u64);
        assert!(evidence_of(&early, 1_000_000)
            .is_some_and(|e| e.starts_with("CUDA tracing on before the window (")));
        let quiet = serde_json::json!({
            "cuda_tracing": {"attached": false, "on_since_unix_ms": 900_000_u64, "reason": null},
            "probes": {"io_tracing": {"state": "on", "reason": "loader reads"}},
            "gpus": [{"index": 1, "busy": null, "processes": []}]
        });
        assert_eq!(
            evidence_of(&quiet, 1_000_000).as_deref(),
            Some(
                "CUDA tracing off (not wanted), read tracing on (loader reads); \
                 GPU 1 split none (driver figures for 0 processes)"
            )
        );
    }

    #[test]
    fn the_steady_window_holds_whole_series_fetches() {
        assert_eq!(steady_window(30, 10).ok(), Some(20));
        assert_eq!(steady_window(28, 8).ok(), Some(20));
        for (seconds, warmup) in [(22, 8), (35, 10), (10, 10), (5, 10)] {
            let e = steady_window(seconds, warmup).expect_err("a part window");
            assert!(e.to_string().contains("multiple of 10 s"), "{e}");
        }
    }
}
