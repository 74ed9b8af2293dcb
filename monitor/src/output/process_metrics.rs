//! The agent's own process, as every Prometheus exporter reports it (`process_*`), and its build
//! (`gpuwatch_build_info`). At each scrape: CPU time from `getrusage`, resident memory from
//! `/proc/self/statm`; open files from `/proc/self/fd` at most every [`FDS_EVERY`] (listing it
//! walks every descriptor, the eBPF programs' and the kept-open files' included: half of a
//! scrape); the start time once (it reads `/proc/stat`, whose per-interrupt lines made it the
//! costliest part of a scrape).

/// The revision gpuwatch was built from (`git rev-parse --short=12 HEAD` at build time, or
/// `unknown` outside a checkout).
pub const REVISION: &str = env!("GPUWATCH_REVISION");

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds_total: f64,
    pub resident_memory_bytes: f64,
    pub start_time_seconds: f64,
    pub open_fds: f64,
    pub max_fds: f64,
}

/// When this process started, in seconds since the epoch (read once).
fn start_time_seconds() -> Option<f64> {
    static START: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
        let boot = procfs::boot_time_secs().ok()? as f64;
        Some(boot + stat.starttime as f64 / procfs::ticks_per_second() as f64)
    })
}

/// User and system CPU time of every thread, those ended included.
fn cpu_seconds_total() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes the struct it is given; it is read only when the call succeeded.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// Resident pages, from `/proc/self/statm`'s second field.
fn resident_bytes() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * procfs::page_size() as f64)
}

/// How old the open-file count may be.
pub const FDS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Open file descriptors, counted again when the last count is [`FDS_EVERY`] old.
fn open_fds() -> Option<f64> {
    use std::time::Instant;
    static LAST: std::sync::Mutex<Option<(Instant, f64)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    match *last {
        Some((at, n)) if at.elapsed() < FDS_EVERY => Some(n),
        _ => {
            let n = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
            *last = Some((Instant::now(), n));
            Some(n)
        }
    }
}

/// This process's figures; `None` where `/proc/self` cannot be read.
pub fn read() -> Option<ProcessStats> {
    let open_fds = open_fds()?;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur as f64
    } else {
        f64::NAN
    };
    Some(ProcessStats {
        cpu_seconds_total: cpu_seconds_total()?,
        resident_memory_bytes: resident_bytes()?,
        start_time_seconds: start_time_seconds()?,
        open_fds,
        max_fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads() {
        let p = read().expect("/proc/self");
        assert!(p.resident_memory_bytes > 0.0 && p.open_fds >= 3.0, "{p:?}");
        assert!(p.start_time_seconds > 1.6e9, "{p:?}");
    }

    /// The cheaper reads agree with procfs's `stat`, as they did before they replaced it.
    #[test]
    fn the_figures_match_procfs_stat() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(300) {
            std::hint::black_box(spin.elapsed());
        }
        let me = procfs::process::Process::myself().unwrap();
        let stat = me.stat().unwrap();
        let p = read().unwrap();
        let ticks = procfs::ticks_per_second() as f64;
        let cpu = (stat.utime + stat.stime) as f64 / ticks;
        assert!(
            (p.cpu_seconds_total - cpu).abs() < 0.1,
            "{p:?} against {cpu}"
        );
        let rss = stat.rss as f64 * procfs::page_size() as f64;
        assert!(
            (p.resident_memory_bytes - rss).abs() < 8.0 * 1024.0 * 1024.0,
            "{p:?}"
        );
        let boot = procfs::boot_time_secs().unwrap() as f64;
        assert_eq!(p.start_time_seconds, boot + stat.starttime as f64 / ticks);
    }
}
