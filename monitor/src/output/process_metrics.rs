//! The agent's own process, as every Prometheus exporter reports it (`process_*`), and its build
//! (`gpuwatch_build_info`). Read from `/proc/self` at each scrape: four small files.

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

/// This process's figures; `None` where `/proc/self` cannot be read.
pub fn read() -> Option<ProcessStats> {
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK) as f64,
            libc::sysconf(libc::_SC_PAGESIZE) as f64,
        )
    };
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (utime, stime, start) = parse_stat(&stat)?;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
    let rss_pages: f64 = std::fs::read_to_string("/proc/self/statm")
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
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
        cpu_seconds_total: (utime + stime) as f64 / ticks,
        resident_memory_bytes: rss_pages * page,
        start_time_seconds: boot + start as f64 / ticks,
        open_fds,
        max_fds,
    })
}

/// utime, stime and starttime (clock ticks) from `/proc/<pid>/stat`: fields 14, 15 and 22,
/// counted after the command name, which is in parentheses and may hold spaces.
fn parse_stat(stat: &str) -> Option<(u64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // `rest` starts at field 3 (state).
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some((field(14)?, field(15)?, field(22)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_a_command_with_spaces_and_parentheses() {
        let stat = "4242 (python (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 \
                    3 0 987654 12345678 2500 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((250, 50, 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_reads() {
        let p = read().expect("/proc/self");
        assert!(p.resident_memory_bytes > 0.0 && p.open_fds >= 3.0, "{p:?}");
        assert!(p.start_time_seconds > 1.6e9, "{p:?}");
    }
}
