//! The cost of stall tracing: `probe_cost [--seconds N] [--rounds N] [--unwatched]` (root).
//!
//! Two loads, each in a cgroup of its own and pinned to one CPU (so a run's throughput depends on
//! the probes, not on where the scheduler put it), each run alternately without and with the stall
//! probes loaded and watching that cgroup:
//! - **ping-pong**, the syscall- and switch-heavy load: two processes pass one byte back and forth
//!   over a pair of pipes (each round trip: two reads, two writes, two context switches, two
//!   wake-ups). Gives the average kernel time per traced event (BPF statistics: run_time_ns /
//!   run_cnt, per program).
//! - **loader**, the read-heavy load: a data loader's reads, one process opening and reading
//!   32 MiB of files whole from the page cache, again and again, at three file sizes: 16 KiB,
//!   128 KiB (a typical training image) and 1 MiB (a shard). Gives the throughput with the probes
//!   over without, from the same run. (Page-cache reads are the worst case: the fixed cost per
//!   traced system call is weighed against a memory copy, not a disk.)
//!
//! With `--unwatched` the probes watch another cgroup: the cost the rest of the host pays.
use gpuwatch::cgroup::CgroupLayout;
use gpuwatch::sources::stall_probe::StallProbe;
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

/// Alternates `rounds` runs of `load` without and with the probes: (rates without, rates with).
/// With `totals`, the probes' BPF statistics of the runs with them are added to it.
fn alternate(
    procs: &Path,
    cpu: usize,
    load: Load,
    secs: f64,
    rounds: usize,
    watched: u64,
    mut totals: Option<&mut ProgramTotals>,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        without.push(run_load(procs, cpu, load, secs)?);
        let mut probe = StallProbe::load(true)?;
        probe.watch(&HashSet::from([watched]))?;
        with.push(run_load(procs, cpu, load, secs)?);
        if let Some(t) = totals.as_deref_mut() {
            add_program_stats(t, &probe);
        }
    }
    Ok((without, with))
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
    let mut totals = ProgramTotals::new();
    let pingpong = alternate(
        &procs,
        cpu,
        Load::PingPong,
        secs,
        rounds,
        watched,
        Some(&mut totals),
    );
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
    let (pp_without, pp_with) = pingpong?;
    let loading = loading?;

    println!(
        "ping-pong ({}), one CPU: kernel time per traced event",
        if unwatched {
            "unwatched cgroup"
        } else {
            "watched cgroup"
        }
    );
    println!("{:<22} {:>14} {:>12}", "program", "events", "ns/event");
    let (mut all_cnt, mut all_ns) = (0u64, 0u64);
    totals.sort();
    for (name, cnt, ns) in &totals {
        all_cnt += cnt;
        all_ns += ns;
        let per = if *cnt > 0 {
            *ns as f64 / *cnt as f64
        } else {
            0.0
        };
        println!("{name:<22} {cnt:>14} {per:>12.1}");
    }
    println!(
        "{:<22} {all_cnt:>14} {:>12.1}",
        "all",
        all_ns as f64 / all_cnt.max(1) as f64
    );
    println!(
        "ping-pong round trips/s: without probes {:.0}, with {:.0}; ratio of means {:.3}, median ratio {:.3}",
        mean(&pp_without),
        mean(&pp_with),
        mean(&pp_with) / mean(&pp_without),
        median_ratio(&pp_without, &pp_with)
    );
    for (kib, (without, with)) in &loading {
        println!(
            "loader MiB/s, files of {kib} KiB from the page cache: without probes {:.0}, with {:.0}; ratio of means {:.3}, median ratio {:.3}",
            mean(without) / 1048576.0,
            mean(with) / 1048576.0,
            mean(with) / mean(without),
            median_ratio(without, with)
        );
    }
    println!("({rounds} alternating rounds of {secs} s per load, pinned to CPU {cpu})");
    Ok(())
}
