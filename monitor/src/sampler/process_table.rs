//! The cache of host PID → workload, through the host's [`process`](crate::sources::host::process) reader,
//! with a cache that reads `/proc` only when it cannot vouch for a PID.
//!
//! Processes are keyed on (pid, start time) because PIDs are reused. `/proc` is read only for a
//! PID that was not present in the previous round, or whose entry is older than
//! `revalidate_after` rounds (a process can be moved to another cgroup); a PID that disappears
//! from the caller's list is forgotten at the end of the round. A cached PID costs one liveness
//! check per round.
use crate::sources::host::pid::PidMap;
pub use crate::sources::host::process::{ProcessInfo, ProcessReadError};
use crate::sources::host::HostReader;

struct Entry {
    info: ProcessInfo,
    /// The round in which this entry was last confirmed present.
    seen_round: u64,
    /// The round in which `/proc` was last read for it.
    read_round: u64,
}

/// The cache of attributed processes; see the module docs for when `/proc` is read.
pub struct ProcessTable {
    host: HostReader,
    entries: PidMap<Entry>,
    round: u64,
    revalidate_after: u64,
    /// `/proc` reads done since creation (for tests and the benchmark).
    pub proc_reads: u64,
}

impl ProcessTable {
    pub fn new(host: HostReader, revalidate_after: u64) -> Self {
        Self {
            host,
            entries: PidMap::default(),
            round: 0,
            revalidate_after: revalidate_after.max(1),
            proc_reads: 0,
        }
    }

    /// Starts a new round; call once per sampling round, before [`Self::resolve`].
    pub fn begin_round(&mut self) {
        self.round += 1;
    }

    /// Resolves one PID, reading `/proc` only when the cache cannot vouch for it.
    pub fn resolve(&mut self, pid: u32) -> Result<&ProcessInfo, ProcessReadError> {
        let round = self.round;
        let host = &self.host;
        let fresh = self.entries.get(&pid).is_some_and(|e| {
            // Already confirmed this round (a process on several GPUs), or present in the
            // previous round, read recently and still alive (one stat: an exit between rounds
            // must not be served from the cache).
            e.seen_round == round
                || (e.seen_round + 1 == round
                    && round - e.read_round < self.revalidate_after
                    && host.alive(pid))
        });
        if !fresh {
            self.proc_reads += 1;
            let info = match self.host.process(pid) {
                Ok(info) => info,
                Err(e) => {
                    self.entries.remove(&pid);
                    return Err(e);
                }
            };
            self.entries.insert(
                pid,
                Entry {
                    info,
                    seen_round: round,
                    read_round: round,
                },
            );
        }
        let entry = self
            .entries
            .get_mut(&pid)
            .expect("entry inserted or kept above");
        entry.seen_round = round;
        Ok(&entry.info)
    }

    /// Forgets the PIDs not resolved in this round.
    pub fn end_round(&mut self) {
        let round = self.round;
        self.entries.retain(|_, e| e.seen_round == round);
    }

    /// How many PIDs the cache holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::host::fake_proc::{stat_line, FakeProc};

    fn fake_proc(root: &FakeProc, pid: u32, start: u64, cgroup: &str) {
        root.write(format!("{pid}/stat"), stat_line(pid, b"train", start));
        root.write(format!("{pid}/cgroup"), cgroup);
    }

    #[test]
    fn caches_until_the_pid_leaves_and_detects_reuse() {
        let root = FakeProc::new();
        fake_proc(
            &root,
            10,
            100,
            "0::/docker/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
        );
        let mut t = ProcessTable::new(HostReader::new(root.path()), 1000);
        t.begin_round();
        assert_eq!(t.resolve(10).unwrap().key.start_time, 100);
        t.end_round();
        t.begin_round();
        t.resolve(10).unwrap();
        t.end_round();
        assert_eq!(
            t.proc_reads, 1,
            "a PID present in consecutive rounds is read once"
        );

        // The PID leaves for a round, then a new process reuses it in another cgroup.
        t.begin_round();
        t.end_round();
        fake_proc(&root, 10, 555, "0::/system.slice/other.service\n");
        t.begin_round();
        let info = t.resolve(10).unwrap();
        assert_eq!(info.key.start_time, 555);
        assert_eq!(info.workload.to_string(), "systemd:other.service");
        assert_eq!(t.proc_reads, 2);
    }

    #[test]
    fn vanished_pid_is_an_error_not_a_panic() {
        let root = FakeProc::new();
        let mut t = ProcessTable::new(HostReader::new(root.path()), 10);
        t.begin_round();
        assert!(matches!(
            t.resolve(4242),
            Err(ProcessReadError::Vanished { pid: 4242 })
        ));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn revalidates_periodically() {
        let root = FakeProc::new();
        fake_proc(&root, 7, 1, "0::/a\n");
        let mut t = ProcessTable::new(HostReader::new(root.path()), 3);
        for _ in 0..6 {
            t.begin_round();
            t.resolve(7).unwrap();
            t.end_round();
        }
        assert_eq!(t.proc_reads, 2, "read at rounds 1 and 4");
    }

    #[test]
    fn a_cached_pid_that_exits_is_vanished() {
        let root = FakeProc::new();
        fake_proc(&root, 8, 1, "0::/a\n");
        let mut t = ProcessTable::new(HostReader::new(root.path()), 100);
        t.begin_round();
        t.resolve(8).unwrap();
        t.end_round();
        root.remove("8");
        t.begin_round();
        assert!(matches!(
            t.resolve(8),
            Err(ProcessReadError::Vanished { pid: 8 })
        ));
    }

    #[test]
    fn this_process_resolves() {
        let mut t = ProcessTable::new(HostReader::new("/proc"), 10);
        t.begin_round();
        let me = t.resolve(std::process::id()).unwrap();
        assert!(me.key.start_time > 0);
    }
}
