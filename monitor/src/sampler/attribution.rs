//! Host PID → workload: `/proc/<pid>/stat` (start time, name) and `/proc/<pid>/cgroup`
//! (memberships), classified into a [`WorkloadId`].
//!
//! Processes are keyed on (pid, start time) because PIDs are reused. `/proc` is read only for a
//! PID that was not present in the previous round, or whose entry is older than
//! `revalidate_after` rounds (a process can be moved to another cgroup); a PID that disappears
//! from the caller's list is forgotten at the end of the round. A cached PID costs one liveness
//! check per round.
use crate::cgroup::namespace::NamespaceRoot;
use crate::cgroup::{classify, CgroupMembership};
use crate::model::WorkloadId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};

/// A hasher for PIDs: one multiplication (Fibonacci hashing). PIDs are small integers the kernel
/// hands out, not keys chosen to collide, and SipHash was a tenth of a round at 1,600 lookups.
#[derive(Default)]
pub struct PidHasher(u64);

impl Hasher for PidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by PID.
pub type PidMap<V> = HashMap<u32, V, BuildHasherDefault<PidHasher>>;
/// A set of PIDs.
pub type PidSet = std::collections::HashSet<u32, BuildHasherDefault<PidHasher>>;

/// A process identity that survives PID reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

#[derive(Clone, Debug)]
pub struct ProcessInfo {
    pub key: ProcessKey,
    /// The command name (`comm`); shared, since every round's GPU processes carry it.
    pub name: std::sync::Arc<str>,
    pub membership: CgroupMembership,
    pub workload: WorkloadId,
}

#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// The process exited between the GPU query and the `/proc` read.
    #[error("process {pid} has exited")]
    Vanished { pid: u32 },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Malformed { path: PathBuf, why: String },
}

struct Entry {
    info: ProcessInfo,
    /// The round in which this entry was last confirmed present.
    seen_round: u64,
    /// The round in which `/proc` was last read for it.
    read_round: u64,
}

/// The cache of attributed processes; see the module docs for when `/proc` is read.
pub struct ProcessTable {
    proc_root: PathBuf,
    /// Where the agent's cgroup namespace is rooted on the host (nowhere in the host's).
    cgroup_ns: NamespaceRoot,
    entries: PidMap<Entry>,
    round: u64,
    revalidate_after: u64,
    /// `/proc` reads done since creation (for tests and the benchmark).
    pub proc_reads: u64,
}

impl ProcessTable {
    pub fn new(proc_root: impl Into<PathBuf>, revalidate_after: u64) -> Self {
        Self {
            proc_root: proc_root.into(),
            cgroup_ns: NamespaceRoot::host(),
            entries: PidMap::default(),
            round: 0,
            revalidate_after: revalidate_after.max(1),
            proc_reads: 0,
        }
    }

    /// Processes read from a cgroup namespace of the agent's own, rooted at `ns` on the host.
    pub fn with_cgroup_namespace(mut self, ns: NamespaceRoot) -> Self {
        self.cgroup_ns = ns;
        self
    }

    /// Starts a new round; call once per sampling round, before [`Self::resolve`].
    pub fn begin_round(&mut self) {
        self.round += 1;
    }

    /// Resolves one PID, reading `/proc` only when the cache cannot vouch for it.
    pub fn resolve(&mut self, pid: u32) -> Result<&ProcessInfo, AttributionError> {
        let round = self.round;
        let proc_root = &self.proc_root;
        let fresh = self.entries.get(&pid).is_some_and(|e| {
            // Already confirmed this round (a process on several GPUs), or present in the
            // previous round, read recently and still alive (one stat: an exit between rounds
            // must not be served from the cache).
            e.seen_round == round
                || (e.seen_round + 1 == round
                    && round - e.read_round < self.revalidate_after
                    && alive(proc_root, pid))
        });
        if !fresh {
            self.proc_reads += 1;
            let info = match read_process(&self.proc_root, &self.cgroup_ns, pid) {
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

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether `pid` still exists. On the host's own `/proc` a signal 0 answers without a path
/// lookup (a fifth of a `stat` of `/proc/<pid>`, once per cached PID per round); another
/// proc root (a test's, or the host's seen from a container) is asked by path.
fn alive(proc_root: &Path, pid: u32) -> bool {
    if proc_root == Path::new("/proc") {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 sends nothing; it only checks that the process exists.
        return unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    }
    proc_root.join(pid.to_string()).exists()
}

fn io_error(path: &Path, pid: u32, source: std::io::Error) -> AttributionError {
    // ENOENT: gone before we looked; ESRCH: gone while we read.
    if matches!(
        source.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ESRCH)
    ) {
        AttributionError::Vanished { pid }
    } else {
        AttributionError::Read {
            path: path.to_owned(),
            source,
        }
    }
}

/// Reads one process from `proc_root` (normally `/proc`): its `stat` through the procfs crate
/// (name and start time; a name that is not UTF-8, which any process can give itself, is read
/// with U+FFFD, so its GPU use is still charged) and its `cgroup` as bytes.
///
/// In a cgroup namespace of the agent's own, `ns` puts the paths back on the host's root.
pub fn read_process(
    proc_root: &Path,
    ns: &NamespaceRoot,
    pid: u32,
) -> Result<ProcessInfo, AttributionError> {
    let dir = proc_root.join(pid.to_string());
    let file = |name: &str| dir.join(name);
    let process = procfs::process::Process::new_with_root(dir.clone())
        .map_err(|e| proc_error(&dir, pid, e))?;
    let stat = process
        .stat()
        .map_err(|e| proc_error(&file("stat"), pid, e))?;
    // Read as bytes: procfs reads it as UTF-8, and a cgroup named with other bytes hid the
    // process from every workload (see `CgroupMembership::parse_bytes`).
    let cgroup = file("cgroup");
    let bytes = std::fs::read(&cgroup).map_err(|e| io_error(&cgroup, pid, e))?;
    let membership =
        CgroupMembership::parse_bytes(&bytes).ok_or_else(|| AttributionError::Malformed {
            path: cgroup.clone(),
            why: "not hierarchy-id:controllers:path lines".to_owned(),
        })?;
    let membership = ns.to_host(membership);
    let workload = classify(membership.identity_path());
    Ok(ProcessInfo {
        key: ProcessKey {
            pid,
            start_time: stat.starttime,
        },
        name: stat.comm.into(),
        membership,
        workload,
    })
}

fn proc_error(path: &Path, pid: u32, e: procfs::ProcError) -> AttributionError {
    match e {
        procfs::ProcError::NotFound(_) => AttributionError::Vanished { pid },
        procfs::ProcError::Io(source, _) => io_error(path, pid, source),
        other => AttributionError::Malformed {
            path: path.to_owned(),
            why: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `stat` line as the kernel writes it: `comm` then the 50 fields after it (start time
    /// is field 22).
    fn stat_line(pid: u32, comm: &[u8], start: u64) -> Vec<u8> {
        let mut line = format!("{pid} (").into_bytes();
        line.extend_from_slice(comm);
        line.extend(b") S 1 1 1 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 ");
        line.extend(format!("{start} 1000 200 18446744073709551615").bytes());
        line.extend(" 0".repeat(27).bytes());
        line.push(b'\n');
        line
    }

    #[test]
    fn parses_stat_with_awkward_names() {
        let root = tempfile::tempdir().unwrap();
        let put = |pid: u32, stat: &[u8]| {
            let d = root.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), stat).unwrap();
            std::fs::write(d.join("cgroup"), "0::/job\n").unwrap();
            read_process(root.path(), &NamespaceRoot::host(), pid)
        };
        let info = put(1234, &stat_line(1234, b"python3 (worker) x", 987654)).unwrap();
        assert_eq!(
            (&*info.name, info.key.start_time),
            ("python3 (worker) x", 987654)
        );
        assert!(matches!(
            put(1235, b"garbage"),
            Err(AttributionError::Malformed { .. })
        ));
        let info = put(77, &stat_line(77, b"\xff\xfe-train", 4242)).unwrap();
        assert_eq!(
            (&*info.name, info.key.start_time),
            ("\u{fffd}\u{fffd}-train", 4242)
        );
        assert_eq!(info.membership.unified.as_deref(), Some("/job"));
        assert!(matches!(
            read_process(root.path(), &NamespaceRoot::host(), 9),
            Err(AttributionError::Vanished { pid: 9 })
        ));
    }

    /// On the real kernel: a process whose name is not UTF-8 (here from its executable's file
    /// name, as `prctl` could set it too) is read, its name shown with U+FFFD.
    #[test]
    fn a_process_named_with_bytes_that_are_not_utf8_is_read() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let exe = dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"\xff\xfe-train"));
        std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
        let mut child = std::process::Command::new(&exe).arg("30").spawn().unwrap();
        let pid = child.id();
        // exec has happened once the name changes from the test's own
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let info = loop {
            let info = read_process(Path::new("/proc"), &NamespaceRoot::host(), pid)
                .expect("read despite the name");
            if info.name.contains("train") || std::time::Instant::now() > deadline {
                break info;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(&*info.name, "\u{fffd}\u{fffd}-train");
    }

    fn fake_proc(root: &Path, pid: u32, start: u64, cgroup: &str) {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("stat"), stat_line(pid, b"train", start)).unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
    }

    #[test]
    fn caches_until_the_pid_leaves_and_detects_reuse() {
        let root = tempfile::tempdir().unwrap();
        fake_proc(
            root.path(),
            10,
            100,
            "0::/docker/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
        );
        let mut t = ProcessTable::new(root.path(), 1000);
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
        fake_proc(root.path(), 10, 555, "0::/system.slice/other.service\n");
        t.begin_round();
        let info = t.resolve(10).unwrap();
        assert_eq!(info.key.start_time, 555);
        assert_eq!(info.workload.to_string(), "systemd:other.service");
        assert_eq!(t.proc_reads, 2);
    }

    #[test]
    fn vanished_pid_is_an_error_not_a_panic() {
        let root = tempfile::tempdir().unwrap();
        let mut t = ProcessTable::new(root.path(), 10);
        t.begin_round();
        assert!(matches!(
            t.resolve(4242),
            Err(AttributionError::Vanished { pid: 4242 })
        ));
        assert!(t.is_empty());
    }

    #[test]
    fn revalidates_periodically() {
        let root = tempfile::tempdir().unwrap();
        fake_proc(root.path(), 7, 1, "0::/a\n");
        let mut t = ProcessTable::new(root.path(), 3);
        for _ in 0..6 {
            t.begin_round();
            t.resolve(7).unwrap();
            t.end_round();
        }
        assert_eq!(t.proc_reads, 2, "read at rounds 1 and 4");
    }

    #[test]
    fn a_cached_pid_that_exits_is_vanished() {
        let root = tempfile::tempdir().unwrap();
        fake_proc(root.path(), 8, 1, "0::/a\n");
        let mut t = ProcessTable::new(root.path(), 100);
        t.begin_round();
        t.resolve(8).unwrap();
        t.end_round();
        std::fs::remove_dir_all(root.path().join("8")).unwrap();
        t.begin_round();
        assert!(matches!(
            t.resolve(8),
            Err(AttributionError::Vanished { pid: 8 })
        ));
    }

    #[test]
    fn this_process_resolves() {
        let mut t = ProcessTable::new("/proc", 10);
        t.begin_round();
        let me = t.resolve(std::process::id()).unwrap();
        assert!(me.key.start_time > 0);
    }
}
