//! CPU time per sampling round, on a real host: `sample_cost [--rounds N] [--interval-ms MS]
//! [--nvml-lib PATH] [--docker] [--no-ebpf]`.
//!
//! Runs N rounds of the GPU source's per-round reading alone, up to 8 series fetches alone (every
//! 2 s), then N full rounds (GPU +
//! attribution + cgroup files + probe map, and the series fetch every `series_interval`), at
//! the given interval, and prints a table of the sampling thread's CPU time per round: the mean
//! is the amortised cost, p99 a fetching round's. Built in release and carried to the GPU
//! machine (it has no cargo).
use gpuwatch::events::EventCounters;
use gpuwatch::runtime::{Agent, AgentConfig};
use gpuwatch::sampler::SamplerConfig;
use gpuwatch::sources::docker::DockerSourceConfig;
use gpuwatch::sources::gpu::{GpuSource, GpuSourceConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Now, in Unix milliseconds (0 before the epoch), as the sampler stamps a fetch.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Stats {
    cpu_ms: Vec<f64>,
    wall_ms: Vec<f64>,
}

impl Stats {
    fn row(&mut self, name: &str) -> String {
        let pct = |v: &mut Vec<f64>, p: f64| {
            v.sort_by(f64::total_cmp);
            v[((v.len() - 1) as f64 * p).round() as usize]
        };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (cm, wm) = (mean(&self.cpu_ms), mean(&self.wall_ms));
        format!(
            "{name:<28} {:>6} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            self.cpu_ms.len(),
            cm,
            pct(&mut self.cpu_ms, 0.5),
            pct(&mut self.cpu_ms, 0.99),
            wm
        )
    }
}

fn measure(rounds: usize, interval: Duration, mut f: impl FnMut()) -> Stats {
    f(); // warm-up: first NVML calls and /proc reads
    let mut s = Stats {
        cpu_ms: Vec::new(),
        wall_ms: Vec::new(),
    };
    for _ in 0..rounds {
        let (c0, w0) = (thread_cpu(), Instant::now());
        f();
        s.cpu_ms.push((thread_cpu() - c0).as_secs_f64() * 1e3);
        let wall = w0.elapsed();
        s.wall_ms.push(wall.as_secs_f64() * 1e3);
        std::thread::sleep(interval.saturating_sub(wall));
    }
    s
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut per_call_mode = false;
    let (mut rounds, mut interval_ms, mut lib, mut docker, mut probes) =
        (30usize, 1000u64, None, false, true);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().unwrap_or_default().parse()?,
            "--interval-ms" => interval_ms = args.next().unwrap_or_default().parse()?,
            "--nvml-lib" => lib = args.next().map(Into::into),
            "--docker" => docker = true,
            "--no-ebpf" => probes = false,
            "--per-call" => per_call_mode = true,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    if per_call_mode {
        return per_call(lib, rounds, interval_ms);
    }
    let interval = Duration::from_millis(interval_ms);
    let gpu_config = GpuSourceConfig {
        lib_path: lib,
        ..GpuSourceConfig::default()
    };

    let mut gpu = GpuSource::open(&gpu_config, Arc::new(EventCounters::default()))?;
    let mut procs = 0;
    let mut gpu_only = measure(rounds, interval, || {
        procs = gpu.collect().iter().map(|d| d.processes.len()).sum()
    });
    // The series fetch alone (GetSamples and GPM per GPU), every 2 s: its cost is the same
    // whatever the number of samples it returns.
    let mut fetch = measure(rounds.min(8), Duration::from_secs(2), || {
        gpu.fetch(unix_ms(), &[]);
    });
    // The same with the driver's per-process split asked for every GPU, as on a shared GPU
    // whose holders' CPU time cannot settle the split.
    let all: Vec<u32> = (0..gpu.device_count() as u32).collect();
    let mut fetch_split = measure(rounds.min(8), Duration::from_secs(2), || {
        gpu.fetch(unix_ms(), &all);
    });
    let devices = gpu.device_count();
    drop(gpu);

    let config = AgentConfig {
        sampler: SamplerConfig {
            gpu: Some(gpu_config),
            probes,
            ..SamplerConfig::default()
        },
        docker: docker.then(DockerSourceConfig::default),
        ..AgentConfig::default()
    };
    let mut agent = Agent::start(&config, Duration::from_secs(3))?;
    let mut workloads = 0;
    let mut full = measure(rounds, interval, || {
        if let Some(s) = agent.round().last() {
            workloads = s.workloads.len();
        }
    });

    println!("{devices} GPU(s), {procs} GPU process(es), {workloads} workload(s), interval {interval_ms} ms");
    println!(
        "{:<28} {:>6} {:>10} {:>10} {:>10} {:>10}",
        "phase", "rounds", "cpu ms", "cpu p50", "cpu p99", "wall ms"
    );
    println!("{}", gpu_only.row("NVML queries only"));
    println!("{}", fetch.row("series fetch (+GPM)"));
    println!("{}", fetch_split.row("series fetch (+GPM, split)"));
    println!("{}", full.row("full round (+attribution)"));
    Ok(())
}

/// Mean wall and CPU time of each NVML call the GPU source makes, through nvml-wrapper (which
/// sizes list calls with an extra call), to see where a round's time goes. Three passes of
/// `rounds` each, one call after the other as a round makes them, then `interval_ms` of sleep:
/// in the source's order, in reverse order, and without `utilization_rates` and the graphics
/// list. A call whose cost moves with its place pays for the driver waking up, not for itself.
fn per_call(
    lib: Option<std::path::PathBuf>,
    rounds: usize,
    interval_ms: u64,
) -> anyhow::Result<()> {
    use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
    let mut b = nvml_wrapper::Nvml::builder();
    if let Some(l) = &lib {
        b.lib_path(l.as_os_str());
    }
    let nvml = b.init()?;
    let d = nvml.device_by_index(0)?;
    let start_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros() as u64;
    type Call<'a> = (&'static str, Box<dyn FnMut() -> bool + 'a>);
    let calls = || -> Vec<Call<'_>> {
        vec![
            (
                "device_by_index",
                Box::new(|| nvml.device_by_index(0).is_ok()),
            ),
            (
                "utilization_rates",
                Box::new(|| d.utilization_rates().is_ok()),
            ),
            ("memory_info", Box::new(|| d.memory_info().is_ok())),
            (
                "temperature",
                Box::new(|| d.temperature(TemperatureSensor::Gpu).is_ok()),
            ),
            ("power_usage", Box::new(|| d.power_usage().is_ok())),
            (
                "enforced_power_limit",
                Box::new(|| d.enforced_power_limit().is_ok()),
            ),
            (
                "clock_info(SM)",
                Box::new(|| d.clock_info(Clock::SM).is_ok()),
            ),
            (
                "current_throttle_reasons",
                Box::new(|| d.current_throttle_reasons().is_ok()),
            ),
            (
                "running_compute_processes",
                Box::new(|| d.running_compute_processes().is_ok()),
            ),
            (
                "running_graphics_processes",
                Box::new(|| d.running_graphics_processes().is_ok()),
            ),
        ]
    };
    // Per pass: (name, wall µs, CPU µs, calls) per call, and the pass's CPU per round.
    type Totals<'a> = Vec<(&'a str, f64, f64, usize)>;
    let mut passes: Vec<(&str, Totals<'_>, f64)> = Vec::new();
    for pass in ["in order", "reversed", "no util/graphics"] {
        let mut list = calls();
        match pass {
            "reversed" => list.reverse(),
            "no util/graphics" => list
                .retain(|(n, _)| !matches!(*n, "utilization_rates" | "running_graphics_processes")),
            _ => {}
        }
        let mut totals: Totals<'_> = list.iter().map(|(n, _)| (*n, 0.0, 0.0, 0)).collect();
        let round_cpu = thread_cpu();
        for _ in 0..rounds {
            for ((_, f), t) in list.iter_mut().zip(totals.iter_mut()) {
                let (w, c) = (Instant::now(), thread_cpu());
                f();
                t.1 += w.elapsed().as_secs_f64() * 1e6;
                t.2 += (thread_cpu() - c).as_secs_f64() * 1e6;
                t.3 += 1;
            }
            std::thread::sleep(Duration::from_millis(interval_ms));
        }
        let per_round = (thread_cpu() - round_cpu).as_secs_f64() * 1e6 / rounds as f64;
        passes.push((pass, totals, per_round));
    }
    for (pass, totals, per_round) in &passes {
        println!("pass: {pass}, {rounds} rounds, CPU per round {per_round:.1} us");
        println!(
            "{:<34} {:>12} {:>12}",
            "call (nvml-wrapper)", "wall us", "cpu us"
        );
        for (name, wall, cpu, n) in totals {
            let n = *n as f64;
            println!("{name:<34} {:>12.1} {:>12.1}", wall / n, cpu / n);
        }
    }
    // The per-process call, for a GPU several workloads share.
    for (name, since) in [
        ("process_utilization(last 1s)", None),
        ("process_utilization(since start)", Some(start_us)),
    ] {
        let (mut wall, mut cpu) = (0.0, 0.0);
        let n = rounds.min(10);
        for _ in 0..n {
            let since = since.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |t| t.as_micros() as u64)
                    .saturating_sub(1_000_000)
            });
            let (w, c) = (Instant::now(), thread_cpu());
            let _ = d.process_utilization_stats(since);
            wall += w.elapsed().as_secs_f64() * 1e6;
            cpu += (thread_cpu() - c).as_secs_f64() * 1e6;
            std::thread::sleep(Duration::from_millis(interval_ms));
        }
        println!(
            "{name:<34} {:>12.1} {:>12.1}",
            wall / n as f64,
            cpu / n as f64
        );
    }
    Ok(())
}
