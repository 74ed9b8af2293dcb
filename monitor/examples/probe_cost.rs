//! The cost of stall tracing: `probe_cost [--seconds N] [--rounds N] [--unwatched]` (root).
//!
//! Two loads, each in a cgroup of its own and pinned to one CPU (so a run's throughput depends on
//! the probes, not on where the scheduler put it). Each round runs a load four times: without
//! probes, with empty programs on the same tracepoints (the tracing mechanism's own cost, the
//! floor no program can go below), with the stall probes loaded and watching that cgroup, and
//! with them as adaptive tracing leaves them when no workload needs read evidence (scheduler
//! programs only):
//! - **ping-pong**, the syscall- and switch-heavy load: two processes pass one byte back and forth
//!   over a pair of pipes (each round trip: two reads, two writes, two context switches; the
//!   reads and switches are traced). Gives the average kernel time per traced event (BPF
//!   statistics: run_time_ns / run_cnt, per program, for the stall probes and for the empty
//!   programs).
//! - **loader**, the read-heavy load: a data loader's reads, one process opening and reading
//!   32 MiB of files whole from the page cache, again and again, at three file sizes: 16 KiB,
//!   128 KiB (a typical training image) and 1 MiB (a shard). Gives the throughput with the probes
//!   and with the empty programs over without, from the same run. (Page-cache reads are the
//!   worst case: the fixed cost per traced system call is weighed against a memory copy, not a
//!   disk.) Its 16 KiB files also get a pass with statistics on, for its time per event: a
//!   loader's reads rarely block, where every ping-pong read does.
//!
//! With `--unwatched` the probes watch another cgroup: the cost the rest of the host pays.
use gpuwatch::cgroup::CgroupLayout;
use gpuwatch::sources::stall_probe::{Accumulate, ProbeTotals, StallProbe};
use monitor_common::IoStats;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The loader's file sizes, and the bytes of each set of files.
const LOADER_FILE_KIB: [usize; 3] = [16, 128, 1024];
const LOADER_SET_BYTES: usize = 32 << 20;

/// Child mode: ping-pong for `secs`, print round trips.
fn pingpong(secs: f64) -> anyhow::Result<()> {
    let (mut a_r, mut a_w) = std::io::pipe()?;
    let (mut b_r, mut b_w) = std::io::pipe()?;
    // SAFETY: fork in a single-threaded child process; the child only does pipe I/O and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // the parent's ends: without closing them here the child never sees EOF
        drop(a_w);
        drop(b_r);
        let mut byte = [0u8; 1];
        while a_r.read_exact(&mut byte).is_ok() {
            if b_w.write_all(&byte).is_err() {
                break;
            }
        }
        std::process::exit(0);
    }
    drop(a_r);
    drop(b_w);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut trips = 0u64;
    let mut byte = [1u8; 1];
    while Instant::now() < end {
        for _ in 0..1000 {
            a_w.write_all(&byte)?;
            b_r.read_exact(&mut byte)?;
        }
        trips += 1000;
    }
    drop(a_w);
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    println!("{trips}");
    Ok(())
}

/// Child mode: read every file of `dir` whole, again and again, for `secs`; print bytes read.
fn loader(dir: &Path, secs: f64) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let size = files
        .first()
        .map_or(Ok(0), |f| std::fs::metadata(f).map(|m| m.len()))?;
    // room for the whole file: one read for it, one to see its end
    let mut buf = vec![0u8; size as usize + 1];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut bytes = 0u64;
    while Instant::now() < end {
        for f in &files {
            let mut file = std::fs::File::open(f)?;
            // one read for the file, one to see its end: as a loader reading an image
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                bytes += n as u64;
            }
        }
    }
    println!("{bytes}");
    Ok(())
}

/// The loader's files of `kib` KiB, written once (and so in the page cache).
fn loader_files(kib: usize) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpuwatch-probe-cost-{kib}k"));
    std::fs::create_dir_all(&dir)?;
    let bytes = kib * 1024;
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    for i in 0..LOADER_SET_BYTES / bytes {
        let path = dir.join(format!("{i:05}.jpg"));
        if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(bytes as u64) {
            std::fs::write(&path, &data)?;
        }
    }
    Ok(dir)
}

/// Which load a child runs.
#[derive(Clone, Copy)]
enum Load<'a> {
    PingPong,
    Loader(&'a Path),
}

/// Runs `load` for `secs` in the cgroup of `cgroup_procs`, pinned to `cpu`: its rate per second.
fn run_load(cgroup_procs: &Path, cpu: usize, load: Load, secs: f64) -> anyhow::Result<f64> {
    let exe = std::env::current_exe()?;
    let procs = cgroup_procs.to_path_buf();
    let mut cmd = Command::new(exe);
    match load {
        Load::PingPong => cmd.args(["--pingpong", &secs.to_string()]),
        Load::Loader(dir) => cmd
            .args(["--loader", &secs.to_string()])
            .arg(dir.as_os_str()),
    };
    cmd.stdout(Stdio::piped());
    // SAFETY: only open/write/close/sched_setaffinity (async-signal-safe system calls) between
    // fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        let path = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes())?;
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let pid = b"0"; // "0" moves the writing process itself
            let r = libc::write(fd, pid.as_ptr().cast(), 1);
            libc::close(fd);
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "load failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok(done / secs)
}

/// Per program: (name, runs, run time in ns), summed over loads.
type ProgramTotals = Vec<(String, u64, u64)>;

fn add_program_stats(totals: &mut ProgramTotals, probe: &StallProbe) {
    for (name, cnt, ns) in probe.program_stats() {
        match totals.iter_mut().find(|t| t.0 == name) {
            Some(t) => {
                t.1 += cnt;
                t.2 += ns;
            }
            None => totals.push((name, cnt, ns)),
        }
    }
}

/// A load's rates per round: without probes, with empty programs on the same tracepoints (the
/// tracing mechanism alone), and with gpuwatch's programs.
#[derive(Default)]
struct Arms {
    without: Vec<f64>,
    empty: Vec<f64>,
    full: Vec<f64>,
    /// gpuwatch's programs under adaptive tracing with no workload needing read evidence:
    /// the scheduler programs attached, the read and block programs loaded but detached.
    adaptive_idle: Vec<f64>,
}

/// BPF statistics of the runs with empty programs and with gpuwatch's, and the load's reads as
/// gpuwatch's sample estimates them beside the same load's reads all timed (a fifth arm).
#[derive(Default)]
struct Stats {
    empty: ProgramTotals,
    full: ProgramTotals,
    sampled_reads: IoStats,
    every_read: IoStats,
}

/// Adds the reads the probe saw in cgroup `watched` to `into`.
fn add_reads(into: &mut IoStats, probe: &mut StallProbe, watched: u64) -> anyhow::Result<()> {
    let mut totals = ProbeTotals::default();
    probe.read(&mut totals, true)?;
    for (key, io) in &totals.reads {
        if key.cgroup_id == watched {
            into.accumulate(io);
        }
    }
    Ok(())
}

/// Runs `load` for `rounds` rounds of three arms each (see [`Arms`]). With `stats`, the
/// programs' BPF statistics are added to it.
fn alternate(
    procs: &Path,
    cpu: usize,
    load: Load,
    secs: f64,
    rounds: usize,
    watched: u64,
    mut stats: Option<&mut Stats>,
) -> anyhow::Result<Arms> {
    let mut arms = Arms::default();
    for round in 0..rounds {
        arms.without.push(run_load(procs, cpu, load, secs)?);
        {
            let probe = StallProbe::load_empty()?;
            arms.empty.push(run_load(procs, cpu, load, secs)?);
            if let Some(s) = stats.as_deref_mut() {
                add_program_stats(&mut s.empty, &probe);
            }
        }
        // The reference pass (every read timed) comes after gpuwatch's in even rounds and
        // before it in odd ones: a pass right after another reads ~10 % slower or faster.
        let reference_first = round % 2 == 1;
        if let (Some(s), true) = (stats.as_deref_mut(), reference_first) {
            time_every_read(&mut s.every_read, procs, cpu, load, secs, watched)?;
        }
        {
            let mut probe = StallProbe::load(true)?;
            probe.watch(&HashSet::from([watched]))?;
            arms.full.push(run_load(procs, cpu, load, secs)?);
            if let Some(s) = stats.as_deref_mut() {
                add_program_stats(&mut s.full, &probe);
                add_reads(&mut s.sampled_reads, &mut probe, watched)?;
            }
        }
        if let (Some(s), false) = (stats.as_deref_mut(), reference_first) {
            time_every_read(&mut s.every_read, procs, cpu, load, secs, watched)?;
        }
        let mut probe = StallProbe::load_io_detached(true)?;
        probe.watch(&HashSet::from([watched]))?;
        arms.adaptive_idle.push(run_load(procs, cpu, load, secs)?);
    }
    Ok(arms)
}

/// Runs `load` once with every read timed, adding its reads to `into`.
fn time_every_read(
    into: &mut IoStats,
    procs: &Path,
    cpu: usize,
    load: Load,
    secs: f64,
    watched: u64,
) -> anyhow::Result<()> {
    let mut every = StallProbe::load_timing_every_read(true)?;
    every.watch(&HashSet::from([watched]))?;
    run_load(procs, cpu, load, secs)?;
    add_reads(into, &mut every, watched)
}

/// Prints the kernel time per traced event, per program and in all, against the empty programs'.
fn print_per_event(title: &str, stats: &mut Stats) {
    println!("{title}, one CPU: kernel time per traced event");
    println!(
        "{:<22} {:>14} {:>12} {:>18}",
        "program", "events", "ns/event", "empty program ns"
    );
    let per_event = |t: &ProgramTotals, name: Option<&str>| {
        let (cnt, ns) = t
            .iter()
            .filter(|p| name.is_none_or(|n| p.0 == n))
            .fold((0u64, 0u64), |(c, n), p| (c + p.1, n + p.2));
        (cnt, ns as f64 / cnt.max(1) as f64)
    };
    stats.full.sort();
    for (name, _, _) in &stats.full {
        let (cnt, per) = per_event(&stats.full, Some(name));
        let (_, floor) = per_event(&stats.empty, Some(name));
        println!("{name:<22} {cnt:>14} {per:>12.1} {floor:>18.1}");
    }
    let (cnt, per) = per_event(&stats.full, None);
    let (_, floor) = per_event(&stats.empty, None);
    println!("{:<22} {cnt:>14} {per:>12.1} {floor:>18.1}", "all");
    let (a, b) = (&stats.sampled_reads, &stats.every_read);
    let mean_us = |s: &IoStats| s.total_ns as f64 / s.count.max(1) as f64 / 1e3;
    let weighed: u64 = a.hist.iter().sum();
    println!(
        "its reads, as the sample estimates them / timed every read (other passes): mean {:.2} / \
         {:.2} µs ({:.3}), the histogram's weight over the count {:.3} / {:.3}",
        mean_us(a),
        mean_us(b),
        mean_us(a) / mean_us(b),
        weighed as f64 / a.count.max(1) as f64,
        b.hist.iter().sum::<u64>() as f64 / b.count.max(1) as f64,
    );
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The median of the per-round ratios with / without (robust to one noisy round).
fn median_ratio(without: &[f64], with: &[f64]) -> f64 {
    let mut r: Vec<f64> = with.iter().zip(without).map(|(w, wo)| w / wo).collect();
    r.sort_by(f64::total_cmp);
    match r.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => r[n / 2],
        n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut secs, mut rounds, mut unwatched) = (2.0f64, 5usize, false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pingpong" => return pingpong(args.next().unwrap_or_default().parse()?),
            "--loader" => {
                let secs = args.next().unwrap_or_default().parse()?;
                let dir = PathBuf::from(args.next().unwrap_or_default());
                return loader(&dir, secs);
            }
            "--seconds" => secs = args.next().unwrap_or_default().parse()?,
            "--rounds" => rounds = args.next().unwrap_or_default().parse()?,
            // the load's cgroup is not watched: the cost every other task of the host pays
            "--unwatched" => unwatched = true,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let layout = CgroupLayout::detect()?;
    let unified = layout
        .unified
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no unified cgroup hierarchy"))?;
    let cg = unified.join("gpuwatch-probe-cost");
    std::fs::create_dir_all(&cg)?;
    let cgroup_id = std::fs::metadata(&cg)?.ino();
    let procs = cg.join("cgroup.procs");
    let watched = if unwatched { u64::MAX } else { cgroup_id };
    // the last CPU: on small machines the first one takes most interrupts
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;

    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let mut stats = Stats::default();
    let pingpong = alternate(
        &procs,
        cpu,
        Load::PingPong,
        secs,
        rounds,
        watched,
        Some(&mut stats),
    );
    let mut loader_stats = Stats::default();
    let loader_events = loader_files(LOADER_FILE_KIB[0]).and_then(|files| {
        let load = Load::Loader(&files);
        alternate(
            &procs,
            cpu,
            load,
            secs,
            rounds,
            watched,
            Some(&mut loader_stats),
        )
    });
    // Statistics cost two clock reads per program run: off while throughput is measured, as
    // in production.
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0")?;
    let loading: anyhow::Result<Vec<_>> = LOADER_FILE_KIB
        .iter()
        .map(|&kib| {
            let files = loader_files(kib)?;
            let runs = alternate(
                &procs,
                cpu,
                Load::Loader(&files),
                secs,
                rounds,
                watched,
                None,
            )?;
            Ok((kib, runs))
        })
        .collect();
    let _ = std::fs::remove_dir(&cg);
    let pingpong = pingpong?;
    let loading = loading?;

    let whose = if unwatched {
        "unwatched cgroup"
    } else {
        "watched cgroup"
    };
    print_per_event(&format!("ping-pong ({whose})"), &mut stats);
    loader_events?;
    print_per_event(
        &format!(
            "loader, files of {} KiB from the page cache ({whose})",
            LOADER_FILE_KIB[0]
        ),
        &mut loader_stats,
    );
    let ratios = |arms: &Arms| {
        let base = mean(&arms.without);
        format!(
            "empty programs {:.3} (median {:.3}), gpuwatch's {:.3} (median {:.3}), adaptive with \
             none needed {:.3} (median {:.3})",
            mean(&arms.empty) / base,
            median_ratio(&arms.without, &arms.empty),
            mean(&arms.full) / base,
            median_ratio(&arms.without, &arms.full),
            mean(&arms.adaptive_idle) / base,
            median_ratio(&arms.without, &arms.adaptive_idle)
        )
    };
    println!(
        "throughput with probes / without (ratios of means, and medians of per-round ratios):"
    );
    println!(
        "ping-pong, {:.0} round trips/s without: {}",
        mean(&pingpong.without),
        ratios(&pingpong)
    );
    for (kib, arms) in &loading {
        println!(
            "loader, files of {kib} KiB from the page cache, {:.0} MiB/s without: {}",
            mean(&arms.without) / 1048576.0,
            ratios(arms)
        );
    }
    println!(
        "({rounds} rounds of {secs} s per load and arm (without, empty, gpuwatch's, adaptive idle), pinned to CPU {cpu})"
    );
    Ok(())
}
