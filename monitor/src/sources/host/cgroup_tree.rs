//! The cgroup tree itself: which directories exist, their inodes (the cgroup ids eBPF reports),
//! and the Docker containers it shows when the daemon cannot be asked.
use super::cgroup::{classify, CgroupLayout};
use crate::model::{WorkloadId, WorkloadKind};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The inode of a cgroup directory: on the unified hierarchy, the id eBPF reports for it.
pub fn inode(dir: &Path) -> Option<u64> {
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// Whether a cgroup directory is still there (it goes when its workload stops).
pub fn exists(dir: &Path) -> bool {
    dir.exists()
}

/// Docker containers visible in the cgroup tree (cgroupfs `/docker/<id>` and systemd
/// `/system.slice/docker-<id>.scope`), for when the daemon cannot be asked.
pub fn discover_docker_cgroups(layout: &CgroupLayout) -> Vec<(WorkloadId, String)> {
    let root = layout.unified.clone().or_else(|| {
        layout
            .v1_mount("name=systemd")
            .or_else(|| layout.v1_mount("cpu"))
            .map(|h| h.mount_point.clone())
    });
    let Some(root) = root else { return Vec::new() };
    let mut found = Vec::new();
    for parent in ["docker", "system.slice"] {
        let Ok(dir) = std::fs::read_dir(root.join(parent)) else {
            continue;
        };
        for entry in dir.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = format!("/{parent}/{}", entry.file_name().to_string_lossy());
            let id = classify(&path);
            if id.kind == WorkloadKind::Docker {
                found.push((id, path));
            }
        }
    }
    found
}
