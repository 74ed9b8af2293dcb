//! The cost of stall tracing: `probe_cost [--seconds N] [--rounds N]` (root).
//!
//! A syscall- and switch-heavy load — two processes ping-ponging one byte over a pair of pipes
//! (each round trip: two reads, two writes, two context switches) — runs in a cgroup of its own,
//! alternately without and with the stall probes loaded and watching that cgroup. Prints the
//! average kernel time per traced event (BPF statistics: run_time_ns / run_cnt, per program) and
//! the load's throughput with the probes over without, from the same run. With `--unwatched` the
//! probes watch another cgroup: the cost the rest of the host pays.
use gpuwatch::cgroup::CgroupLayout;
use gpuwatch::sources::stall_probe::StallProbe;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

fn run_load(cgroup_procs: &Path, secs: f64) -> anyhow::Result<f64> {
    let exe = std::env::current_exe()?;
    let procs = cgroup_procs.to_path_buf();
    let mut cmd = Command::new(exe);
    cmd.args(["--load", &secs.to_string()])
        .stdout(Stdio::piped());
    // SAFETY: only open/write/close (async-signal-safe) between fork and exec.
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
            Ok(())
        });
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "load failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trips: f64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok(trips / secs)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut secs, mut rounds, mut unwatched) = (3.0f64, 3usize, false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--load" => return pingpong(args.next().unwrap_or_default().parse()?),
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
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;

    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut totals: Vec<(String, u64, u64)> = Vec::new();
    for _ in 0..rounds {
        without.push(run_load(&procs, secs)?);
        let mut probe = StallProbe::load(true)?;
        let watched = if unwatched { u64::MAX } else { cgroup_id };
        probe.watch(&HashSet::from([watched]))?;
        with.push(run_load(&procs, secs)?);
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
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0")?;
    let _ = std::fs::remove_dir(&cg);

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
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "ping-pong round trips/s: without probes {:.0}, with {:.0}; ratio {:.3} ({rounds} alternating rounds of {secs} s)",
        mean(&without),
        mean(&with),
        mean(&with) / mean(&without)
    );
    Ok(())
}
