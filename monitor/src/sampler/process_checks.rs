//! What the agent needs of a GPU process beyond its identity: its scheduler state and CPU time,
//! from `/proc/<pid>/stat`, kept open between rounds ([`StatFiles`]).
//!
//! Read every round for the processes of GPUs several workloads share (their CPU time is
//! evidence for splitting the GPU's busy time between them), and in rotation for the others: a
//! slice of them per round, so each is checked at least every [`ROTATION_ROUNDS`] rounds
//! whatever the number of processes (at 8 GPUs × 200 processes a round reads 7 files, not
//! 200), and at least one a round. A process is *stuck* when two checks find it in
//! uninterruptible sleep (D) with no CPU time spent between them: it holds its GPU memory and
//! does nothing. That finding holds in the rounds between checks, until the next check says
//! otherwise, so a rule that needs it for a while sees it every round.
use crate::sources::host::pid::{PidMap, PidSet};
use crate::sources::host::proc_stat::{clock_ticks_per_second, ProcStat, StatFiles};
use crate::sources::host::HostReader;

/// Every process is checked at least once in this many rounds.
pub const ROTATION_ROUNDS: usize = 30;
/// One `/proc/<pid>/stat` read costs ~20 µs (the kernel formats 52 fields): a round of a few
/// processes reads one, not all of them.
const MIN_PER_ROUND: usize = 1;

/// What a round learnt of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observed {
    /// The state letter, when the process was checked this round.
    pub state: Option<char>,
    /// In D at this check and the previous one, with no CPU time between.
    pub stuck: bool,
    /// CPU seconds since the previous round's check (only when it was checked then too).
    pub cpu_seconds: Option<f64>,
}

#[derive(Clone, Copy)]
struct Last {
    stat: ProcStat,
    round: u64,
    /// What that check found.
    stuck: bool,
}

pub struct ProcessChecks {
    files: StatFiles,
    last: PidMap<Last>,
    round: u64,
    /// Where the rotation resumes in the next round's list of processes.
    cursor: usize,
    ticks_per_second: f64,
    /// Files read since creation (for the benchmark).
    pub reads: u64,
}

impl ProcessChecks {
    pub fn new(host: &HostReader) -> Self {
        Self {
            files: host.stat_files(),
            last: PidMap::default(),
            round: 0,
            cursor: 0,
            ticks_per_second: clock_ticks_per_second(),
            reads: 0,
        }
    }

    /// One process's `stat` as of this round: the reading this round's check took (the
    /// sampler checks the GPU processes before it reads the probes' windows), so a process is
    /// read once a round; for one not checked this round, read now through the kept files.
    pub fn stat(&mut self, pid: u32) -> Option<ProcStat> {
        if let Some(l) = self.last.get(&pid).filter(|l| l.round == self.round) {
            return Some(l.stat);
        }
        self.files.read(pid)
    }

    /// Checks this round's processes: each of `every_round`, and a rotating slice of `others`.
    /// Processes in neither list are forgotten.
    pub fn observe(&mut self, every_round: &[u32], others: &[u32]) -> PidMap<Observed> {
        self.round += 1;
        let slice = (others.len().div_ceil(ROTATION_ROUNDS)).max(MIN_PER_ROUND);
        let mut due: Vec<u32> = every_round.to_vec();
        if !others.is_empty() {
            let start = self.cursor % others.len();
            due.extend(
                others
                    .iter()
                    .cycle()
                    .skip(start)
                    .take(slice.min(others.len())),
            );
            self.cursor = start + slice;
        }
        let mut out = PidMap::with_capacity_and_hasher(due.len(), Default::default());
        for pid in due {
            if out.contains_key(&pid) {
                continue;
            }
            self.reads += 1;
            let Some(stat) = self.files.read(pid) else {
                self.last.remove(&pid);
                continue;
            };
            let before = self
                .last
                .get(&pid)
                .filter(|l| l.stat.start_time == stat.start_time);
            let stuck = before.is_some_and(|b| {
                b.stat.state == 'D' && stat.state == 'D' && b.stat.cpu_ticks == stat.cpu_ticks
            });
            let observed = Observed {
                state: Some(stat.state),
                stuck,
                cpu_seconds: before.filter(|b| b.round + 1 == self.round).map(|b| {
                    stat.cpu_ticks.saturating_sub(b.stat.cpu_ticks) as f64 / self.ticks_per_second
                }),
            };
            self.last.insert(
                pid,
                Last {
                    stat,
                    round: self.round,
                    stuck,
                },
            );
            out.insert(pid, observed);
        }
        let live: PidSet = every_round.iter().chain(others).copied().collect();
        self.last.retain(|pid, _| live.contains(pid));
        self.files.retain(&live);
        // Not checked this round: a stuck finding stands until the next check.
        for pid in others {
            if let Some(l) = self.last.get(pid).filter(|l| l.stuck) {
                out.entry(*pid).or_insert(Observed {
                    state: None,
                    stuck: l.stuck,
                    cpu_seconds: None,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::host::fake_proc::FakeProc;

    fn write_stat(root: &FakeProc, pid: u32, state: char, utime: u64) {
        root.write(
            format!("{pid}/stat"),
            format!(
                "{pid} (py (x) y) {state} 1 1 1 0 -1 0 0 0 0 0 {utime} 3 0 0 20 0 1 0 777 0 0\n"
            ),
        );
    }

    #[test]
    fn real_stat_files_stay_open_while_checked_and_close_after() {
        let mut a = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let mut b = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let (pa, pb) = (a.id(), b.id());
        let mut c = ProcessChecks::new(&HostReader::new("/proc"));
        let o = c.observe(&[pa, pb], &[]);
        assert!(
            o[&pa].state.is_some_and(|s| s.is_ascii_uppercase()),
            "{o:?}"
        );
        assert_eq!(c.files.kept(), 2);
        assert!(c.stat(pb).is_some(), "read through the kept file");
        // Reaped between rounds: its kept file fails, and the process reads as gone.
        b.kill().unwrap();
        b.wait().unwrap();
        let o = c.observe(&[pa, pb], &[]);
        assert!(o.contains_key(&pa) && !o.contains_key(&pb), "{o:?}");
        assert_eq!(c.files.kept(), 1);
        // No longer on a GPU: its file is closed.
        c.observe(&[], &[]);
        assert_eq!(c.files.kept(), 0);
        a.kill().unwrap();
        a.wait().unwrap();
    }

    #[test]
    fn a_process_checked_this_round_is_not_read_again() {
        let root = FakeProc::new();
        for pid in [5, 6, 7] {
            write_stat(&root, pid, 'S', 10);
        }
        let mut c = ProcessChecks::new(&HostReader::new(root.path()));
        let state = |c: &mut ProcessChecks, pid| c.stat(pid).map(|s| s.state);
        // Round 1 checks 5 and, in rotation, 6.
        c.observe(&[5], &[6, 7]);
        for pid in [5, 6, 7] {
            write_stat(&root, pid, 'D', 10);
        }
        assert_eq!(
            state(&mut c, 5),
            Some('S'),
            "this round's check, not a second read"
        );
        assert_eq!(
            state(&mut c, 7),
            Some('D'),
            "not checked this round: read now"
        );
        // Round 2 checks 5 and 7; 6's reading is a round old.
        c.observe(&[5], &[6, 7]);
        write_stat(&root, 6, 'R', 10);
        assert_eq!(
            state(&mut c, 6),
            Some('R'),
            "checked last round, not this one: read now"
        );
        assert_eq!(state(&mut c, 5), Some('D'), "the next round's check");
    }

    #[test]
    fn stuck_means_d_twice_with_no_cpu_time_between() {
        let root = FakeProc::new();
        let mut c = ProcessChecks::new(&HostReader::new(root.path()));
        write_stat(&root, 5, 'D', 10);
        assert!(
            !c.observe(&[5], &[])[&5].stuck,
            "one D reading is not stuck"
        );
        let o = c.observe(&[5], &[])[&5];
        assert!(o.stuck);
        assert_eq!(o.cpu_seconds, Some(0.0));
        write_stat(&root, 5, 'D', 60);
        let o = c.observe(&[5], &[])[&5];
        assert!(!o.stuck, "it ran in between: busy I/O, not stuck");
        assert!(o.cpu_seconds.unwrap() > 0.0);
        root.remove("5");
        assert!(c.observe(&[5], &[]).is_empty(), "gone");
    }

    #[test]
    fn a_stuck_finding_holds_between_checks_in_rotation() {
        let root = FakeProc::new();
        for pid in [5, 6, 7] {
            write_stat(&root, pid, if pid == 5 { 'D' } else { 'S' }, 10);
        }
        let mut c = ProcessChecks::new(&HostReader::new(root.path()));
        let others = [5, 6, 7];
        // One check a round: PID 5 is checked in rounds 1 and 4, stuck from round 4 on.
        let stuck: Vec<bool> = (0..9)
            .map(|_| c.observe(&[], &others).get(&5).is_some_and(|o| o.stuck))
            .collect();
        assert_eq!(
            stuck,
            [false, false, false, true, true, true, true, true, true]
        );
        write_stat(&root, 5, 'R', 90);
        let after: Vec<bool> = (0..3)
            .map(|_| c.observe(&[], &others).get(&5).is_some_and(|o| o.stuck))
            .collect();
        assert_eq!(after, [false, false, false], "the next check clears it");
    }

    #[test]
    fn the_rotation_checks_everyone_within_its_rounds() {
        let root = FakeProc::new();
        let pids: Vec<u32> = (100..400).collect();
        for p in &pids {
            write_stat(&root, *p, 'S', 1);
        }
        let mut c = ProcessChecks::new(&HostReader::new(root.path()));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..ROTATION_ROUNDS {
            let o = c.observe(&[], &pids);
            assert_eq!(o.len(), 10, "300 processes over 30 rounds");
            seen.extend(o.keys().copied());
        }
        assert_eq!(seen.len(), pids.len());
    }
}
