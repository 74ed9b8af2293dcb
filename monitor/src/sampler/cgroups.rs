//! Where each workload's cgroup is, resolved once from a member process.
use crate::sources::host::cgroup::stats::{CgroupStatsPaths, LimitsCache, StatsError};
use crate::sources::host::cgroup::{CgroupLayout, CgroupMembership};
use crate::sources::host::cgroup_tree;
use std::path::PathBuf;

/// A workload's cgroup, resolved once from a member process.
pub struct WorkloadCgroup {
    pub path: String,
    pub stats: Result<CgroupStatsPaths, StatsError>,
    /// Its limits as last read (they are read once every few rounds).
    pub limits: LimitsCache,
    /// Inode of the unified-hierarchy directory: the id eBPF reports.
    pub cgroup_id: Option<u64>,
    /// A directory of the cgroup, to notice when it is removed (the workload stopped).
    pub dir: Option<PathBuf>,
}

impl WorkloadCgroup {
    pub fn resolve(layout: &CgroupLayout, membership: &CgroupMembership) -> Self {
        let path = membership.identity_path().to_owned();
        let stats = CgroupStatsPaths::resolve(layout, membership);
        let cgroup_id = membership
            .unified_dir(layout)
            .and_then(|d| cgroup_tree::inode(&d));
        // The root cgroup never goes away; any other one does when its workload stops.
        let dir = (path != "/")
            .then(|| {
                membership
                    .unified_dir(layout)
                    .or_else(|| membership.controller_dir(layout, "memory"))
            })
            .flatten();
        Self {
            path,
            stats,
            limits: LimitsCache::default(),
            cgroup_id,
            dir,
        }
    }

    /// True once the cgroup's directory is gone (its workload stopped).
    pub fn removed(&self) -> bool {
        self.dir.as_ref().is_some_and(|d| !cgroup_tree::exists(d))
    }
}

/// The membership a process in `path` would have: cgroupfs-driver runtimes use the same path in
/// every hierarchy.
pub fn membership_for_path(layout: &CgroupLayout, path: &str) -> CgroupMembership {
    CgroupMembership {
        unified: layout.unified.as_ref().map(|_| path.to_owned()),
        v1: layout
            .v1
            .iter()
            .map(|h| (h.controllers.clone(), path.to_owned()))
            .collect(),
    }
}
