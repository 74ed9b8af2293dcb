//! The host's kernel as a source: `/proc` and cgroupfs. Every file the sampler needs of a
//! process, a container's processes or a cgroup is read here; the sampler asks and joins.
//!
//! [`HostReader`] is the one reader a round asks about processes: it knows where `/proc` is
//! (the host's, or the host's seen from a container) and where the agent's cgroup namespace is
//! rooted on the host. The cgroup hierarchies themselves are read through [`cgroup`] (layout,
//! memberships, counters) and [`cgroup_tree`].
pub mod cgroup;
pub mod cgroup_tree;
pub mod container_process;
pub mod environ;
#[cfg(test)]
pub mod fake_proc;
pub mod live_file;
pub mod namespaces;
pub mod pid;
pub mod proc_stat;
pub mod process;
pub mod system;

use crate::model::{BlindSpot, RankEnv};
use cgroup::namespace::NamespaceRoot;
use proc_stat::StatFiles;
use process::{ProcessInfo, ProcessReadError};
use std::path::{Path, PathBuf};

/// A read of a host file that failed: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum HostReadError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("statvfs {}: {source}", path.display())]
    Statvfs {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what}", path.display())]
    Unparsed { path: PathBuf, what: &'static str },
}

/// Reads processes from one `/proc`, their cgroup paths put on the host's root.
#[derive(Clone, Debug)]
pub struct HostReader {
    proc_root: PathBuf,
    /// Where the agent's cgroup namespace is rooted on the host (nowhere in the host's).
    cgroup_ns: NamespaceRoot,
}

impl HostReader {
    /// Reads `proc_root` from the host's cgroup namespace.
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            cgroup_ns: NamespaceRoot::host(),
        }
    }

    /// Processes read from a cgroup namespace of the agent's own, rooted at `ns` on the host.
    pub fn with_cgroup_namespace(mut self, ns: NamespaceRoot) -> Self {
        self.cgroup_ns = ns;
        self
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// One process's identity, memberships and workload.
    pub fn process(&self, pid: u32) -> Result<ProcessInfo, ProcessReadError> {
        process::read(&self.proc_root, &self.cgroup_ns, pid)
    }

    /// Whether `pid` still exists.
    pub fn alive(&self, pid: u32) -> bool {
        process::alive(&self.proc_root, pid)
    }

    /// A set of `stat` files, kept open between reads.
    pub fn stat_files(&self) -> StatFiles {
        StatFiles::new(&self.proc_root)
    }

    /// The process's launch environment.
    pub fn launch_env(&self, pid: u32) -> Result<RankEnv, HostReadError> {
        environ::read(&self.proc_root, pid)
    }

    /// The children of the process's main thread.
    pub fn main_thread_children(&self, pid: u32) -> Vec<u32> {
        container_process::main_thread_children(&self.proc_root, pid)
    }

    /// Whether the process sees a `/dev/shm` mount.
    pub fn shm_mounted(&self, pid: u32) -> Result<bool, HostReadError> {
        container_process::shm_mounted(&self.proc_root, pid)
    }

    /// Size and use of the `/dev/shm` the process sees, in bytes.
    pub fn shm_use(&self, pid: u32) -> Result<(u64, u64), HostReadError> {
        container_process::shm_use(&self.proc_root, pid)
    }

    /// The process's memlock limit (soft, hard); `None` = unlimited.
    pub fn memlock_limit(&self, pid: u32) -> Result<(Option<u64>, Option<u64>), HostReadError> {
        container_process::memlock_limit(&self.proc_root, pid)
    }

    /// The process's locked and pinned pages, in bytes; `None` when it is gone.
    pub fn locked_bytes(&self, pid: u32) -> Option<u64> {
        container_process::locked_bytes(&self.proc_root, pid)
    }

    /// The host namespaces the agent does not share.
    pub fn blind_spots(&self) -> Vec<BlindSpot> {
        namespaces::blind_spots(&self.proc_root)
    }
}
