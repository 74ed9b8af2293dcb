//! The agent's own process, as every Prometheus exporter reports it (`process_*`), and its build
//! (`gpuwatch_build_info`). Read from `/proc/self` through procfs at each scrape.

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

/// This process's figures, through procfs; `None` where `/proc/self` cannot be read.
pub fn read() -> Option<ProcessStats> {
    let me = procfs::process::Process::myself().ok()?;
    let stat = me.stat().ok()?;
    let ticks = procfs::ticks_per_second() as f64;
    let boot = procfs::boot_time_secs().ok()? as f64;
    let open_fds = me.fd_count().ok()? as f64;
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
        cpu_seconds_total: (stat.utime + stat.stime) as f64 / ticks,
        resident_memory_bytes: stat.rss as f64 * procfs::page_size() as f64,
        start_time_seconds: boot + stat.starttime as f64 / ticks,
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
}
