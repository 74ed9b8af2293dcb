//! A process's identity from `/proc/<pid>`: its `stat` (start time, name) and its `cgroup`
//! (memberships, put back on the host's root and classified into a [`WorkloadId`]).
use super::cgroup::namespace::NamespaceRoot;
use super::cgroup::{classify, CgroupMembership};
use crate::model::WorkloadId;
use std::path::{Path, PathBuf};

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
pub enum ProcessReadError {
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

/// Whether `pid` still exists. On the host's own `/proc` a signal 0 answers without a path
/// lookup (a fifth of a `stat` of `/proc/<pid>`, once per cached PID per round); another
/// proc root (a test's, or the host's seen from a container) is asked by path.
pub fn alive(proc_root: &Path, pid: u32) -> bool {
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

fn io_error(path: &Path, pid: u32, source: std::io::Error) -> ProcessReadError {
    // ENOENT: gone before we looked; ESRCH: gone while we read.
    if matches!(
        source.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ESRCH)
    ) {
        ProcessReadError::Vanished { pid }
    } else {
        ProcessReadError::Read {
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
pub fn read(
    proc_root: &Path,
    ns: &NamespaceRoot,
    pid: u32,
) -> Result<ProcessInfo, ProcessReadError> {
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
        CgroupMembership::parse_bytes(&bytes).ok_or_else(|| ProcessReadError::Malformed {
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

fn proc_error(path: &Path, pid: u32, e: procfs::ProcError) -> ProcessReadError {
    match e {
        procfs::ProcError::NotFound(_) => ProcessReadError::Vanished { pid },
        procfs::ProcError::Io(source, _) => io_error(path, pid, source),
        other => ProcessReadError::Malformed {
            path: path.to_owned(),
            why: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::host::fake_proc::{stat_line, FakeProc};

    #[test]
    fn parses_stat_with_awkward_names() {
        let root = FakeProc::new();
        let put = |pid: u32, stat: &[u8]| {
            root.write(format!("{pid}/stat"), stat);
            root.write(format!("{pid}/cgroup"), "0::/job\n");
            read(root.path(), &NamespaceRoot::host(), pid)
        };
        let info = put(1234, &stat_line(1234, b"python3 (worker) x", 987654)).unwrap();
        assert_eq!(
            (&*info.name, info.key.start_time),
            ("python3 (worker) x", 987654)
        );
        assert!(matches!(
            put(1235, b"garbage"),
            Err(ProcessReadError::Malformed { .. })
        ));
        let info = put(77, &stat_line(77, b"\xff\xfe-train", 4242)).unwrap();
        assert_eq!(
            (&*info.name, info.key.start_time),
            ("\u{fffd}\u{fffd}-train", 4242)
        );
        assert_eq!(info.membership.unified.as_deref(), Some("/job"));
        assert!(matches!(
            read(root.path(), &NamespaceRoot::host(), 9),
            Err(ProcessReadError::Vanished { pid: 9 })
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
            let info = read(Path::new("/proc"), &NamespaceRoot::host(), pid)
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
}
