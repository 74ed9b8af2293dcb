//! A `/proc` tree in a temporary directory, for the tests of what reads one.
use std::path::Path;

/// A temporary directory standing for `/proc`; removed when dropped.
pub struct FakeProc {
    dir: tempfile::TempDir,
}

impl Default for FakeProc {
    fn default() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }
}

impl FakeProc {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `relative` (e.g. `42/stat`), creating its folders.
    pub fn write(&self, relative: impl AsRef<Path>, contents: impl AsRef<[u8]>) {
        let path = self.dir.path().join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create the fake process's folder");
        }
        std::fs::write(&path, contents).expect("write the fake /proc file");
    }

    /// Removes a file or a whole process folder.
    pub fn remove(&self, relative: impl AsRef<Path>) {
        let path = self.dir.path().join(relative);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).expect("remove the fake process");
        } else {
            std::fs::remove_file(&path).expect("remove the fake /proc file");
        }
    }
}

/// A `stat` line as the kernel writes it: `comm` then the 50 fields after it (start time is
/// field 22).
pub fn stat_line(pid: u32, comm: &[u8], start: u64) -> Vec<u8> {
    let mut line = format!("{pid} (").into_bytes();
    line.extend_from_slice(comm);
    line.extend(b") S 1 1 1 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 ");
    line.extend(format!("{start} 1000 200 18446744073709551615").bytes());
    line.extend(" 0".repeat(27).bytes());
    line.push(b'\n');
    line
}
