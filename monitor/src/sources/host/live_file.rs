//! A file the kernel writes anew at every read (procfs, cgroupfs), kept open between rounds and
//! read again from offset 0.
//!
//! Opening such a file costs a path walk through the kernel's dentries (`/proc/<pid>/stat`,
//! `/sys/fs/cgroup/<path>/cpu.stat`), which in a sampling round costs more than the read: on
//! the development VM, in a loop, 6.1 µs to open and read a process's `stat` against 1.2 µs to
//! `pread` an open one, and 6.5 against 0.7 µs for a cgroup's `cpu.stat`; after a second's
//! sleep, with cold caches, the open was a fifth of a whole round in a profile.
//!
//! Kept open only on procfs and cgroupfs, whose open files answer an error once their object
//! is gone (measured on 6.18: `ESRCH` for a reaped process's `stat`, `ENODEV` for a removed
//! cgroup's files, v1 and v2). So a kept file never reads stale: on an error it is opened again
//! by its path, once, which finds a new process that took the PID, or fails as a closed file
//! would. On any other filesystem (a test's directory tree) the file is opened at each read.
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// One kernel-generated file, opened at its first read and kept open where that is safe.
#[derive(Debug)]
pub struct LiveFile {
    path: PathBuf,
    open: Option<File>,
}

impl Clone for LiveFile {
    /// A clone opens its own file at its first read.
    fn clone(&self) -> Self {
        Self::new(self.path.clone())
    }
}

impl PartialEq for LiveFile {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for LiveFile {}

impl LiveFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            open: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is held open for the next read.
    pub fn is_kept(&self) -> bool {
        self.open.is_some()
    }

    /// Reads the whole file into `buf` (cleared first); returns its length.
    pub fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        buf.clear();
        if let Some(f) = &self.open {
            if read_from_start(f, buf).is_ok() {
                return Ok(buf.len());
            }
            // Its process or cgroup is gone: the path may name a new one.
            self.open = None;
            buf.clear();
        }
        let f = File::open(&self.path)?;
        read_from_start(&f, buf)?;
        if answers_when_gone(&f) {
            self.open = Some(f);
        }
        Ok(buf.len())
    }

    /// Reads the whole file as text.
    pub fn read_string(&mut self) -> io::Result<String> {
        let mut buf = Vec::with_capacity(256);
        self.read(&mut buf)?;
        String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Reads from offset 0 to the end: these files are generated whole at offset 0, and a read past
/// what one `pread` returned continues the same generation (seq_file).
fn read_from_start(f: &File, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    loop {
        let n = f.read_at(&mut chunk, buf.len() as u64)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn answers_when_gone(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed statfs is a valid out-parameter.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `f` is open for the whole call and `s` is a statfs to write.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut s) } != 0 {
        return false;
    }
    matches!(
        s.f_type as i64,
        PROC_SUPER_MAGIC | CGROUP_SUPER_MAGIC | CGROUP2_SUPER_MAGIC
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_stat_file_follows_its_process_and_fails_once_it_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let mut f = LiveFile::new(format!("/proc/{}/stat", child.id()));
        let mut buf = Vec::new();
        f.read(&mut buf).unwrap();
        assert!(f.is_kept(), "procfs files are kept open");
        let first = String::from_utf8_lossy(&buf).into_owned();
        assert!(
            first.starts_with(&format!("{} (sleep)", child.id())),
            "{first}"
        );
        f.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf).starts_with(&format!("{} (", child.id())));
        child.kill().unwrap();
        child.wait().unwrap();
        let err = f.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(!f.is_kept());
    }

    #[test]
    fn a_kept_cgroup_file_fails_once_its_cgroup_is_removed() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test makes a cgroup: run it as root (`cargo xtask test` does)"
        );
        let layout = crate::sources::host::cgroup::CgroupLayout::detect().unwrap();
        let root = layout
            .unified
            .clone()
            .or_else(|| layout.v1_mount("memory").map(|h| h.mount_point.clone()))
            .expect("a cgroup hierarchy");
        let dir = root.join(format!("gpuwatch-live-file-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let name = if layout.unified.is_some() {
            "cgroup.procs"
        } else {
            "memory.usage_in_bytes"
        };
        let mut f = LiveFile::new(dir.join(name));
        let first = f.read_string();
        let kept = f.is_kept();
        std::fs::remove_dir(&dir).unwrap();
        assert!(first.is_ok(), "{first:?}");
        assert!(kept, "cgroupfs files are kept open");
        let err = f.read_string().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(!f.is_kept());
    }

    #[test]
    fn files_elsewhere_are_opened_at_each_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cpu.stat");
        std::fs::write(&p, "usage_usec 1\n").unwrap();
        let mut f = LiveFile::new(&p);
        assert_eq!(f.read_string().unwrap(), "usage_usec 1\n");
        assert!(!f.is_kept());
        std::fs::remove_file(&p).unwrap();
        assert!(f.read_string().is_err(), "a removed file is gone");
    }

    #[test]
    fn reads_files_longer_than_one_chunk() {
        let mut f = LiveFile::new("/proc/self/maps");
        let mut buf = Vec::new();
        let n = f.read(&mut buf).unwrap();
        assert!(n > 0);
        let text = String::from_utf8_lossy(&buf);
        assert!(text.ends_with('\n'), "whole lines only");
    }
}
