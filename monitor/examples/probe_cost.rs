//! The cost of stall tracing (root):
//! `probe_cost [--seconds N] [--rounds N] [--unwatched] [--idle-only | --per-event-only]
//! [--agent CMD [--agent-warmup S]]`.
//!
//! Two loads, each in a cgroup of its own and pinned to one CPU (so a run's throughput depends on
//! the probes, not on where the scheduler put it). Each round runs a load once per arm: without
//! probes, with empty programs on the same tracepoints (the tracing mechanism's own cost, the
//! floor no program can go below), with the stall probes loaded and watching that cgroup, with
//! them as adaptive tracing leaves them when no workload needs read evidence (scheduler programs
//! only), and with `--agent` the agent's own command line running beside the load. The arms'
//! order changes from round to round in a balanced Latin square.
//! - **ping-pong**, the syscall- and switch-heavy load: two processes pass one byte back and forth
//!   over a pair of pipes (each round trip: two reads, two writes, two context switches; the
//!   reads and switches are traced). Gives the average kernel time per traced event (BPF
//!   statistics: run_time_ns / run_cnt, per program, for the stall probes and for the empty
//!   programs), and what a switch costs with only the scheduler programs attached.
//! - **loader**, the read-heavy load: a data loader's reads, one process opening and reading
//!   32 MiB of files whole from the page cache, again and again, at three file sizes: 16 KiB,
//!   128 KiB (a typical training image) and 1 MiB (a shard). Gives the throughput of each arm
//!   over without, from the same run. (Page-cache reads are the worst case: the fixed cost per
//!   traced system call is weighed against a memory copy, not a disk.) Its 16 KiB files also get
//!   a pass with statistics on, for its time per event: a loader's reads rarely block, where
//!   every ping-pong read does.
//!
//! Throughput is work per second of the load's own CPU time: the probes run in its context, on
//! its time, but time the CPU gave to other tasks or, in a VM, to other guests is left out.
//! On a shared machine the per-round ratios still spread by ±10 % and more, far beyond the 1 %
//! that adaptive tracing with none needed is held to; so the loader's context switches per CPU
//! second are counted as well and priced at what a switch costs in ping-pong, which bounds that
//! arm's cost far more tightly (those programs run at a switch and at an exit, nowhere else).
//!
//! With `--unwatched` the probes watch another cgroup: the cost the rest of the host pays. With
//! `--idle-only` only the arms without probes, adaptive with none needed and the agent run, and
//! no statistics pass: the healthy host's cost, in more rounds for the same time. With
//! `--per-event-only`, only the statistics pass: the programs' kernel time per event.
use gpuwatch::sources::host::cgroup::CgroupLayout;
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

/// Child mode: ping-pong for `secs`, print round trips, and the CPU time
/// and context switches of both processes.
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
    let (own, child) = (usage(libc::RUSAGE_SELF), usage(libc::RUSAGE_CHILDREN));
    println!("{trips} {} {}", own.0 + child.0, own.1 + child.1);
    Ok(())
}

/// Child mode: read every file of `dir` whole, again and again, for `secs`; print bytes read, its
/// CPU time and its context switches.
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
    let (cpu, switches) = usage(libc::RUSAGE_SELF);
    println!("{bytes} {cpu} {switches}");
    Ok(())
}

/// The CPU time (user and system, ns) of `who`, and its context switches (voluntary or not).
fn usage(who: libc::c_int) -> (u64, u64) {
    // SAFETY: a zeroed rusage is valid, and getrusage only writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    (
        ns(ru.ru_utime) + ns(ru.ru_stime),
        (ru.ru_nvcsw + ru.ru_nivcsw) as u64,
    )
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

/// Runs `load` for `secs` in the cgroup of `cgroup_procs`, pinned to `cpu`: its rate per second
/// of its own CPU time. That counts what the probes cost it (they run in its context, on its
/// time) but not the time the CPU went to other tasks or, in a VM, to other guests, which a rate
/// per wall-clock second would count as the probes' cost.
fn run_load(cgroup_procs: &Path, cpu: usize, load: Load<'_>, secs: f64) -> anyhow::Result<Pass> {
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
    let printed = String::from_utf8_lossy(&out.stdout);
    let mut fields = printed.split_whitespace().map(str::parse::<f64>);
    let (Some(Ok(done)), Some(Ok(cpu_ns)), Some(Ok(switches))) =
        (fields.next(), fields.next(), fields.next())
    else {
        anyhow::bail!("the load printed {printed:?}, not its count, CPU time and switches");
    };
    let cpu_secs = (cpu_ns / 1e9).max(secs * 1e-3);
    Ok(Pass {
        rate: done / cpu_secs,
        wall_rate: done / secs,
        switches: switches / cpu_secs,
    })
}

/// One run of a load: its work and its context switches per second of its CPU time, and its
/// work per second of wall-clock time.
#[derive(Clone, Copy)]
struct Pass {
    rate: f64,
    wall_rate: f64,
    switches: f64,
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

/// The ways a load is run in a round.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    /// No programs.
    Without,
    /// Empty programs on the same tracepoints: the tracing mechanism alone.
    Empty,
    /// gpuwatch's programs, all attached, watching the load's cgroup.
    Full,
    /// gpuwatch's programs under adaptive tracing with no workload needing read evidence: the
    /// scheduler programs attached, the read and block programs loaded but detached.
    AdaptiveIdle,
    /// The agent itself (`--agent`) running beside the load: its programs, its sampler, its NVML.
    Agent,
}

/// The order of `arms` in round `round`: a balanced Latin square (Williams design), so over
/// `arms.len()` rounds (twice that for an odd count) each arm runs in each position, and right
/// after each other arm, equally often. A pass reads a few percent faster or slower after some
/// passes than after others; in a fixed order that would land on one arm.
fn arm_order(arms: &[Arm], round: usize) -> Vec<Arm> {
    let n = arms.len();
    // the first row: 0, 1, n-1, 2, n-2, ...
    let first: Vec<usize> = (0..n)
        .map(|i| match i {
            0 => 0,
            i if i % 2 == 1 => i.div_ceil(2),
            i => n - i / 2,
        })
        .collect();
    let shift = round % n;
    let mut order: Vec<Arm> = first.iter().map(|&i| arms[(i + shift) % n]).collect();
    if n % 2 == 1 && (round / n) % 2 == 1 {
        order.reverse();
    }
    order
}

/// A load's passes per round, per arm.
#[derive(Default)]
struct Rates(Vec<(Arm, Vec<Pass>)>);

impl Rates {
    fn push(&mut self, arm: Arm, pass: Pass) {
        match self.0.iter_mut().find(|(a, _)| *a == arm) {
            Some((_, v)) => v.push(pass),
            None => self.0.push((arm, vec![pass])),
        }
    }

    fn passes(&self, arm: Arm) -> &[Pass] {
        self.0
            .iter()
            .find(|(a, _)| *a == arm)
            .map_or(&[], |(_, v)| v.as_slice())
    }

    /// The arm's rates per CPU second, round by round.
    fn of(&self, arm: Arm) -> Vec<f64> {
        self.passes(arm).iter().map(|p| p.rate).collect()
    }

    /// The arm's rates per wall-clock second, round by round.
    fn of_wall(&self, arm: Arm) -> Vec<f64> {
        self.passes(arm).iter().map(|p| p.wall_rate).collect()
    }

    /// The arm's mean context switches per CPU second.
    fn switches(&self, arm: Arm) -> f64 {
        let v: Vec<f64> = self.passes(arm).iter().map(|p| p.switches).collect();
        mean(&v)
    }
}

/// BPF statistics of the runs with empty programs and with gpuwatch's, and the load's reads as
/// gpuwatch's sample estimates them beside the same load's reads all timed (a fifth arm).
#[derive(Default)]
struct Stats {
    empty: ProgramTotals,
    full: ProgramTotals,
    /// Each pass's kernel time per event, all programs together, in the order run: a round's
    /// empty and full passes ran back to back, so their ratio leaves out the drift between rounds.
    empty_per_pass: Vec<f64>,
    full_per_pass: Vec<f64>,
    sampled_reads: IoStats,
    every_read: IoStats,
}

/// The programs' kernel time per event in one pass, all programs together.
fn ns_per_event(probe: &StallProbe) -> f64 {
    let (cnt, ns) = probe
        .program_stats()
        .into_iter()
        .fold((0u64, 0u64), |(c, n), (_, cnt, ns)| (c + cnt, n + ns));
    ns as f64 / cnt.max(1) as f64
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

/// Where and how long a load runs, and which cgroup the probes watch.
struct Bench<'a> {
    procs: &'a Path,
    cpu: usize,
    secs: f64,
    watched: u64,
    agent: Option<&'a AgentCommand>,
}

/// Runs `load` for `rounds` rounds of `arms`, in the order [`arm_order`] gives. With `stats`,
/// the programs' BPF statistics are added to it, and a pass with every read timed runs beside
/// gpuwatch's (the reference its sampled read times are checked against).
fn alternate(
    bench: &Bench<'_>,
    load: Load<'_>,
    arms: &[Arm],
    rounds: usize,
    mut stats: Option<&mut Stats>,
) -> anyhow::Result<Rates> {
    let mut rates = Rates::default();
    for round in 0..rounds {
        for arm in arm_order(arms, round) {
            // The reference pass comes after gpuwatch's in even rounds and before it in odd
            // ones: a pass right after another reads ~10 % slower or faster.
            let reference_first = round % 2 == 1;
            let reference = stats.is_some() && arm == Arm::Full;
            if reference && reference_first {
                time_every_read(stats.as_deref_mut(), bench, load)?;
            }
            rates.push(arm, run_arm(bench, load, arm, stats.as_deref_mut())?);
            if reference && !reference_first {
                time_every_read(stats.as_deref_mut(), bench, load)?;
            }
        }
    }
    Ok(rates)
}

/// Runs `load` once as `arm` asks: the pass.
fn run_arm(
    bench: &Bench<'_>,
    load: Load<'_>,
    arm: Arm,
    stats: Option<&mut Stats>,
) -> anyhow::Result<Pass> {
    let watched = HashSet::from([bench.watched]);
    let run = || run_load(bench.procs, bench.cpu, load, bench.secs);
    match arm {
        Arm::Without => run(),
        Arm::Empty => {
            let probe = StallProbe::loader().empty_programs(true).load()?;
            let rate = run()?;
            if let Some(s) = stats {
                add_program_stats(&mut s.empty, &probe);
                s.empty_per_pass.push(ns_per_event(&probe));
            }
            Ok(rate)
        }
        Arm::Full => {
            let mut probe = StallProbe::loader().load()?;
            probe.watch(&watched)?;
            let rate = run()?;
            if let Some(s) = stats {
                add_program_stats(&mut s.full, &probe);
                s.full_per_pass.push(ns_per_event(&probe));
                add_reads(&mut s.sampled_reads, &mut probe, bench.watched)?;
            }
            Ok(rate)
        }
        Arm::AdaptiveIdle => {
            let mut probe = StallProbe::loader().attach_io(false).load()?;
            probe.watch(&watched)?;
            run()
        }
        Arm::Agent => {
            let agent = bench
                .agent
                .ok_or_else(|| anyhow::anyhow!("the agent arm needs --agent"))?;
            let running = agent.start()?;
            let rate = run();
            running.stop()?;
            rate
        }
    }
}

/// The agent's command line (`--agent`, run by `sh -c`) and how long it is given to start
/// (`--agent-warmup`): its programs loaded, its first rounds done.
struct AgentCommand {
    line: String,
    warmup: Duration,
}

/// The agent, started for one pass.
struct RunningAgent {
    child: std::process::Child,
    log: PathBuf,
}

impl AgentCommand {
    fn start(&self) -> anyhow::Result<RunningAgent> {
        let log = std::env::temp_dir().join("gpuwatch-probe-cost-agent.log");
        let child = Command::new("sh")
            .args(["-c", &format!("exec {}", self.line)])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::options().append(true).open(&log)?)
            .spawn()?;
        let mut running = RunningAgent { child, log };
        std::thread::sleep(self.warmup);
        if let Some(status) = running.child.try_wait()? {
            anyhow::bail!(
                "the agent exited during its warm-up ({status}): {}",
                std::fs::read_to_string(&running.log).unwrap_or_default()
            );
        }
        Ok(running)
    }
}

impl RunningAgent {
    /// Stops it as an operator would (SIGTERM) and waits; an agent that died during the pass
    /// fails the run.
    fn stop(mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "the agent exited during the pass ({status}): {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait()?;
        Ok(())
    }
}

/// Runs `load` once with every read timed, adding its reads to `stats`.
fn time_every_read(
    stats: Option<&mut Stats>,
    bench: &Bench<'_>,
    load: Load<'_>,
) -> anyhow::Result<()> {
    let Some(s) = stats else { return Ok(()) };
    let mut every = StallProbe::loader().time_every_read(true).load()?;
    every.watch(&HashSet::from([bench.watched]))?;
    run_load(bench.procs, bench.cpu, load, bench.secs)?;
    add_reads(&mut s.every_read, &mut every, bench.watched)
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
    println!(
        "all programs over the empty floor: {}",
        ratio_summary(&stats.empty_per_pass, &stats.full_per_pass)
    );
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

/// Rates `with` against `without`: the ratio of the means; the geometric mean of the
/// per-round ratios (each round's arms ran back to back, so drift between rounds cancels) with
/// its 95 % confidence interval; their median and range.
fn ratio_summary(without: &[f64], with: &[f64]) -> String {
    let mut r: Vec<f64> = with.iter().zip(without).map(|(w, wo)| w / wo).collect();
    r.sort_by(f64::total_cmp);
    let median = match r.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => r[n / 2],
        n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
    };
    let logs: Vec<f64> = r.iter().map(|x| x.ln()).collect();
    let n = logs.len() as f64;
    let m = mean(&logs);
    let sd = (logs.iter().map(|l| (l - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let half = t95(logs.len().saturating_sub(1)) * sd / n.sqrt();
    format!(
        "{:.3}; per round {:.3} (95 % CI {:.3}–{:.3}), median {median:.3}, range {:.3}–{:.3}",
        mean(with) / mean(without),
        m.exp(),
        (m - half).exp(),
        (m + half).exp(),
        r.first().copied().unwrap_or(f64::NAN),
        r.last().copied().unwrap_or(f64::NAN),
    )
}

/// Student's t for a two-sided 95 % interval with `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        df if df <= 30 => T[df - 1],
        df if df <= 60 => 2.0,
        _ => 1.96,
    }
}

/// What a run measures, from the command line.
struct Options {
    secs: f64,
    rounds: usize,
    unwatched: bool,
    /// Only the throughput without probes against adaptive tracing with none needed (and the
    /// agent, with `--agent`): the healthy host's cost, in more rounds for the same time.
    idle_only: bool,
    /// Only the pass with BPF statistics on: the kernel time per traced event.
    per_event_only: bool,
    agent: Option<AgentCommand>,
}

/// Parses the options, or runs a child mode (a load) and returns `None`.
fn options() -> anyhow::Result<Option<Options>> {
    let mut args = std::env::args().skip(1);
    let mut o = Options {
        secs: 2.0,
        rounds: 4,
        unwatched: false,
        idle_only: false,
        per_event_only: false,
        agent: None,
    };
    let mut warmup = Duration::from_secs(5);
    let value = |name: &str, args: &mut dyn Iterator<Item = String>| {
        args.next()
            .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pingpong" => {
                pingpong(value(&a, &mut args)?.parse()?)?;
                return Ok(None);
            }
            "--loader" => {
                let secs = value(&a, &mut args)?.parse()?;
                loader(&PathBuf::from(value(&a, &mut args)?), secs)?;
                return Ok(None);
            }
            "--seconds" => o.secs = value(&a, &mut args)?.parse()?,
            "--rounds" => o.rounds = value(&a, &mut args)?.parse()?,
            // the load's cgroup is not watched: the cost every other task of the host pays
            "--unwatched" => o.unwatched = true,
            "--idle-only" => o.idle_only = true,
            "--per-event-only" => o.per_event_only = true,
            "--agent" => {
                o.agent = Some(AgentCommand {
                    line: value(&a, &mut args)?,
                    warmup,
                })
            }
            "--agent-warmup" => warmup = Duration::from_secs_f64(value(&a, &mut args)?.parse()?),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    if let Some(agent) = &mut o.agent {
        agent.warmup = warmup;
    }
    if o.per_event_only && (o.idle_only || o.agent.is_some()) {
        anyhow::bail!("--per-event-only runs the statistics pass alone: no --idle-only or --agent");
    }
    Ok(Some(o))
}

fn main() -> anyhow::Result<()> {
    let Some(o) = options()? else { return Ok(()) };
    let layout = CgroupLayout::detect()?;
    let unified = layout
        .unified
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no unified cgroup hierarchy"))?;
    let cg = unified.join("gpuwatch-probe-cost");
    std::fs::create_dir_all(&cg)?;
    let cgroup_id = std::fs::metadata(&cg)?.ino();
    let procs = cg.join("cgroup.procs");
    // the last CPU: on small machines the first one takes most interrupts
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let bench = Bench {
        procs: &procs,
        cpu,
        secs: o.secs,
        watched: if o.unwatched { u64::MAX } else { cgroup_id },
        agent: o.agent.as_ref(),
    };
    let mut arms = if o.per_event_only {
        PER_EVENT_ARMS.to_vec()
    } else if o.idle_only {
        vec![Arm::Without, Arm::AdaptiveIdle]
    } else {
        vec![Arm::Without, Arm::Empty, Arm::Full, Arm::AdaptiveIdle]
    };
    if o.agent.is_some() {
        arms.push(Arm::Agent);
    }
    let result = measure(&bench, &arms, &o);
    let _ = std::fs::remove_dir(&cg);
    result?;
    println!(
        "({} rounds of {} s per load and arm ({arms:?}, in a balanced Latin square), pinned to \
         CPU {cpu}, {} cgroup)",
        o.rounds,
        o.secs,
        if o.unwatched { "unwatched" } else { "watched" },
    );
    Ok(())
}

/// Runs the loads and prints what they measured.
fn measure(bench: &Bench<'_>, arms: &[Arm], o: &Options) -> anyhow::Result<()> {
    if o.per_event_only {
        return per_event_pass(bench, o.rounds);
    }
    let pingpong = alternate(bench, Load::PingPong, arms, o.rounds, None);
    if !o.idle_only {
        per_event_pass(bench, o.rounds)?;
    }
    let loading: anyhow::Result<Vec<_>> = LOADER_FILE_KIB
        .iter()
        .map(|&kib| {
            let files = loader_files(kib)?;
            Ok((
                kib,
                alternate(bench, Load::Loader(&files), arms, o.rounds, None)?,
            ))
        })
        .collect();
    let (pingpong, loading) = (pingpong?, loading?);
    println!(
        "throughput per CPU second with probes / without: ratio of means; geometric mean of \
         per-round ratios (95 % CI), their median and range"
    );
    let ratios = |rates: &Rates| {
        arms[1..]
            .iter()
            .map(|&arm| {
                let per_cpu = ratio_summary(&rates.of(Arm::Without), &rates.of(arm));
                let mut line = format!("\n  {arm:?}: {per_cpu}");
                if arm == Arm::Agent {
                    // the agent's own threads take CPU time beside the load, which the
                    // rate per CPU second leaves out
                    let wall = ratio_summary(&rates.of_wall(Arm::Without), &rates.of_wall(arm));
                    line += &format!("\n  Agent, per wall-clock second: {wall}");
                }
                line
            })
            .collect::<String>()
    };
    println!(
        "ping-pong, {:.0} round trips/s without:{}",
        mean(&pingpong.of(Arm::Without)),
        ratios(&pingpong)
    );
    let per_switch = switch_cost_ns(&pingpong);
    if let Some(ns) = per_switch {
        println!(
            "  what a context switch costs under adaptive tracing with none needed: {ns:.0} ns"
        );
    }
    for (kib, rates) in &loading {
        println!(
            "loader, files of {kib} KiB from the page cache, {:.0} MiB/s without:{}",
            mean(&rates.of(Arm::Without)) / 1048576.0,
            ratios(rates)
        );
        if let Some(ns) = per_switch {
            let switches = rates.switches(Arm::AdaptiveIdle);
            println!(
                "  AdaptiveIdle, from its {switches:.0} switches per CPU second at {ns:.0} ns: {:.5}",
                1.0 / (1.0 + switches * ns.max(0.0) * 1e-9)
            );
        }
    }
    Ok(())
}

/// What a context switch costs under adaptive tracing with none needed, from ping-pong (its
/// round trips per CPU second without probes and with, and its switches per round trip), ns.
/// Those programs run only at a switch and at a task's exit, so this and a load's switches tell
/// what the load loses, far more precisely than its throughput can on a noisy machine: a
/// loader reading from the page cache switches a few hundred times a second.
fn switch_cost_ns(pingpong: &Rates) -> Option<f64> {
    let (without, with) = (
        mean(&pingpong.of(Arm::Without)),
        mean(&pingpong.of(Arm::AdaptiveIdle)),
    );
    if pingpong.passes(Arm::AdaptiveIdle).is_empty() || without <= 0.0 || with <= 0.0 {
        return None;
    }
    let switches_per_trip = pingpong.switches(Arm::Without) / without;
    Some((1.0 / with - 1.0 / without) * 1e9 / switches_per_trip)
}

/// The arms of the statistics pass: the floor and gpuwatch's programs.
const PER_EVENT_ARMS: [Arm; 2] = [Arm::Empty, Arm::Full];

/// The kernel time per traced event, with BPF statistics on (they cost two clock reads per
/// program run, so throughput is measured with them off, as in production): ping-pong, and the
/// loader at its smallest files, with the empty and gpuwatch's programs.
fn per_event_pass(bench: &Bench<'_>, rounds: usize) -> anyhow::Result<()> {
    let arms = PER_EVENT_ARMS;
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let mut stats = Stats::default();
    let pingpong = alternate(bench, Load::PingPong, &arms, rounds, Some(&mut stats));
    let mut loader_stats = Stats::default();
    let loader = loader_files(LOADER_FILE_KIB[0]).and_then(|files| {
        alternate(
            bench,
            Load::Loader(&files),
            &arms,
            rounds,
            Some(&mut loader_stats),
        )
    });
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0")?;
    let whose = if bench.watched == u64::MAX {
        "unwatched cgroup"
    } else {
        "watched cgroup"
    };
    pingpong?;
    print_per_event(&format!("ping-pong ({whose})"), &mut stats);
    loader?;
    print_per_event(
        &format!(
            "loader, files of {} KiB from the page cache ({whose})",
            LOADER_FILE_KIB[0]
        ),
        &mut loader_stats,
    );
    Ok(())
}
