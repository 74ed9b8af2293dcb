//! Where each workload's cgroup is, resolved once from a member process. The stages share this
//! map: attribution and the workload list fill it at a workload's first sight, the counters
//! read through it, and it keeps only the round's workloads.
use crate::model::WorkloadId;
use crate::sources::host::cgroup::stats::{CgroupStatsPaths, LimitsCache, StatsError};
use crate::sources::host::cgroup::{CgroupLayout, CgroupMembership};
use crate::sources::host::cgroup_tree;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

/// Each workload's cgroup, under the host's cgroup layout.
pub struct WorkloadCgroups {
    layout: CgroupLayout,
    by_workload: HashMap<WorkloadId, WorkloadCgroup>,
}

impl WorkloadCgroups {
    pub fn new(layout: CgroupLayout) -> Self {
        Self {
            layout,
            by_workload: HashMap::new(),
        }
    }

    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// Resolves and keeps the cgroup of workload `id`, given a member's membership.
    pub fn remember(&mut self, id: WorkloadId, membership: &CgroupMembership) {
        let cgroup = WorkloadCgroup::resolve(&self.layout, membership);
        self.by_workload.insert(id, cgroup);
    }

    /// Keeps the cgroup at `path` for workload `id`, unless one is known already.
    pub fn remember_path(&mut self, id: &WorkloadId, path: &str) {
        if !self.by_workload.contains_key(id) {
            let membership = membership_for_path(&self.layout, path);
            self.remember(id.clone(), &membership);
        }
    }

    pub fn contains(&self, id: &WorkloadId) -> bool {
        self.by_workload.contains_key(id)
    }

    pub fn get(&self, id: &WorkloadId) -> Option<&WorkloadCgroup> {
        self.by_workload.get(id)
    }

    pub fn get_mut(&mut self, id: &WorkloadId) -> Option<&mut WorkloadCgroup> {
        self.by_workload.get_mut(id)
    }

    /// True once workload `id`'s cgroup is known and its directory gone.
    pub fn removed(&self, id: &WorkloadId) -> bool {
        self.get(id).is_some_and(WorkloadCgroup::removed)
    }

    /// The eBPF cgroup ids of `workloads`, those known.
    pub fn ids<'a>(&self, workloads: impl IntoIterator<Item = &'a WorkloadId>) -> HashSet<u64> {
        workloads
            .into_iter()
            .filter_map(|id| self.get(id)?.cgroup_id)
            .collect()
    }

    /// Forgets the cgroups of workloads `keep` says no to.
    pub fn retain(&mut self, mut keep: impl FnMut(&WorkloadId) -> bool) {
        self.by_workload.retain(|id, _| keep(id));
    }
}

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
fn membership_for_path(layout: &CgroupLayout, path: &str) -> CgroupMembership {
    CgroupMembership {
        unified: layout.unified.as_ref().map(|_| path.to_owned()),
        v1: layout
            .v1
            .iter()
            .map(|h| (h.controllers.clone(), path.to_owned()))
            .collect(),
    }
}
