//! `/proc/<pid>/stat`: a process's scheduler state, CPU time and start time, through files kept
//! open between rounds ([`StatFiles`]).
use super::live_file::LiveFile;
use super::pid::{PidMap, PidSet};
use std::path::PathBuf;

/// The kernel's clock ticks per second (`USER_HZ`), in which `stat` counts CPU time.
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// One read of `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    pub start_time: u64,
}

/// The fields after the command name's closing parenthesis: field 3 (state) is index 0, utime
/// and stime (14, 15) are 11 and 12, starttime (22) is 19.
pub fn parse(stat: &[u8]) -> Option<ProcStat> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    let mut f = f.skip(10);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    let start_time = f.nth(6)?.trim_end().parse().ok()?;
    Some(ProcStat {
        state,
        // Two u64 counters of clock ticks: their sum cannot overflow on a real kernel, but a
        // line that is not one must not panic the round.
        cpu_ticks: utime.saturating_add(stime),
        start_time,
    })
}

/// At most this many `stat` files are kept open (a process checked in rotation is read every
/// 30 rounds by the sampler; the rest are opened when read).
pub const MAX_KEPT: usize = 256;

/// The `/proc/<pid>/stat` files of the processes being checked, kept open between rounds (see
/// [`LiveFile`]: a reaped process's file answers an error and is opened again by path).
pub struct StatFiles {
    proc_root: PathBuf,
    files: PidMap<LiveFile>,
    buf: Vec<u8>,
}

impl StatFiles {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            files: PidMap::default(),
            buf: Vec::with_capacity(1024),
        }
    }

    /// The process's state and times now; `None` when it is gone or the line does not parse.
    pub fn read(&mut self, pid: u32) -> Option<ProcStat> {
        if let Some(f) = self.files.get_mut(&pid) {
            if f.read(&mut self.buf).is_ok() {
                return parse(&self.buf);
            }
            self.files.remove(&pid);
            return None;
        }
        let mut path = self.proc_root.clone();
        path.push(pid.to_string());
        path.push("stat");
        let mut f = LiveFile::new(path);
        f.read(&mut self.buf).ok()?;
        if f.is_kept() && self.files.len() < MAX_KEPT {
            self.files.insert(pid, f);
        }
        parse(&self.buf)
    }

    /// Closes the files of processes no longer checked.
    pub fn retain(&mut self, live: &PidSet) {
        self.files.retain(|pid, _| live.contains(pid));
    }

    /// How many files are held open.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn parses_state_cpu_time_and_start_time() {
        let s = parse(b"9 (a) b) R 1 1 1 0 -1 0 0 0 0 0 40 2 0 0 20 0 1 0 12345 0 0\n").unwrap();
        assert_eq!(
            s,
            ProcStat {
                state: 'R',
                cpu_ticks: 42,
                start_time: 12345
            }
        );
        assert!(parse(b"garbage").is_none());
        let huge = format!(
            "9 (a) R 1 1 1 0 -1 0 0 0 0 0 {m} {m} 0 0 20 0 1 0 5 0 0\n",
            m = u64::MAX
        );
        assert_eq!(parse(huge.as_bytes()).unwrap().cpu_ticks, u64::MAX);
        let me = StatFiles::new(Path::new("/proc"))
            .read(std::process::id())
            .unwrap();
        assert!(me.start_time > 0 && me.state.is_ascii_uppercase(), "{me:?}");
    }
}
