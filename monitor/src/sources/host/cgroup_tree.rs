//! The cgroup tree itself: which directories exist, their inodes (the cgroup ids eBPF reports),
//! and the Docker containers it shows when the daemon cannot be asked.
use super::cgroup::{classify, CgroupLayout};
use crate::model::{WorkloadId, WorkloadKind};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often the cgroup tree is listed again for containers while Docker cannot be asked: a
/// listing of the tree's two parents was a seventh of a round, and a container holding a GPU
/// joins at once through its processes anyway.
pub const RESCAN_EVERY: Duration = Duration::from_secs(10);

/// The Docker containers the cgroup tree shows, listed again every [`RESCAN_EVERY`].
#[derive(Default)]
pub struct DockerCgroupScan {
    last: Option<(Instant, Vec<(WorkloadId, String)>)>,
}

impl DockerCgroupScan {
    /// The containers as last listed, listing again when that was [`RESCAN_EVERY`] ago.
    pub fn containers(&mut self, layout: &CgroupLayout, now: Instant) -> &[(WorkloadId, String)] {
        let stale = self
            .last
            .as_ref()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= RESCAN_EVERY);
        if stale {
            self.last = Some((now, discover_docker_cgroups(layout)));
        }
        self.last.as_ref().map_or(&[], |(_, found)| found)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_listed_again_only_after_the_rescan_period() {
        let root = tempfile::tempdir().unwrap();
        let id = "a".repeat(64);
        std::fs::create_dir_all(root.path().join(format!("docker/{id}"))).unwrap();
        let layout = CgroupLayout::unified_at(root.path());
        let mut scan = DockerCgroupScan::default();
        let t0 = Instant::now();
        assert_eq!(scan.containers(&layout, t0).len(), 1);
        let second = "b".repeat(64);
        std::fs::create_dir_all(
            root.path()
                .join(format!("system.slice/docker-{second}.scope")),
        )
        .unwrap();
        let soon = t0 + RESCAN_EVERY - Duration::from_millis(1);
        assert_eq!(
            scan.containers(&layout, soon).len(),
            1,
            "not listed again yet"
        );
        let found = scan.containers(&layout, t0 + RESCAN_EVERY);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|(w, _)| w.kind == WorkloadKind::Docker));
    }
}
