//! A process's cgroup memberships, from `/proc/<pid>/cgroup`.
use super::layout::CgroupLayout;
use std::path::PathBuf;

/// The cgroup paths of one process: its unified-hierarchy path (`0::…`) and its path in each v1
/// hierarchy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupMembership {
    pub unified: Option<String>,
    /// (controllers of the hierarchy, path)
    pub v1: Vec<(Vec<String>, String)>,
}

impl CgroupMembership {
    /// The memberships procfs read from `/proc/<pid>/cgroup`.
    pub fn from_cgroups(cgroups: procfs::ProcessCGroups) -> Self {
        let mut m = Self::default();
        for c in cgroups.0 {
            if c.hierarchy == 0 && c.controllers.is_empty() {
                m.unified = Some(c.pathname);
            } else {
                m.v1.push((c.controllers, c.pathname));
            }
        }
        m
    }

    /// Parses the text of a `/proc/<pid>/cgroup` file (`hierarchy-id:controllers:path`
    /// lines), as procfs does; a malformed file is no membership.
    pub fn parse(text: &str) -> Self {
        use procfs::FromBufRead;
        procfs::ProcessCGroups::from_buf_read(text.as_bytes())
            .map(Self::from_cgroups)
            .unwrap_or_default()
    }

    /// The path that identifies the workload: the unified path when it says more than `/`, else
    /// the systemd-named or cpu/memory v1 path (pure v1 hosts), else `/`.
    pub fn identity_path(&self) -> &str {
        if let Some(u) = self.unified.as_deref().filter(|u| *u != "/") {
            return u;
        }
        for wanted in ["name=systemd", "cpu", "memory", "pids"] {
            if let Some((_, p)) = self.v1.iter().find(|(c, _)| c.iter().any(|c| c == wanted)) {
                if p != "/" {
                    return p;
                }
            }
        }
        self.unified.as_deref().unwrap_or("/")
    }

    /// The directory of this process's cgroup for `controller` on this host: the v1 hierarchy
    /// that holds the controller if there is one, else the unified hierarchy.
    pub fn controller_dir(&self, layout: &CgroupLayout, controller: &str) -> Option<PathBuf> {
        if let Some(h) = layout.v1_mount(controller) {
            let path = self
                .v1
                .iter()
                .find(|(c, _)| c.iter().any(|c| c == controller))
                .map(|(_, p)| p)?;
            return Some(join_cgroup(&h.mount_point, path));
        }
        let unified = layout.unified.as_ref()?;
        Some(join_cgroup(unified, self.unified.as_deref()?))
    }

    /// The directory of this process's cgroup in the unified hierarchy (whose inode is the cgroup
    /// id that `bpf_get_current_cgroup_id()` reports).
    pub fn unified_dir(&self, layout: &CgroupLayout) -> Option<PathBuf> {
        Some(join_cgroup(
            layout.unified.as_ref()?,
            self.unified.as_deref()?,
        ))
    }
}

fn join_cgroup(mount: &std::path::Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f6d9a0b1c2e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f90";

    #[test]
    fn hybrid_docker_process() {
        let text = format!(
            "12:pids:/docker/{ID}\n4:cpu,cpuacct:/docker/{ID}\n3:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/docker/{ID}\n"
        );
        let m = CgroupMembership::parse(&text);
        assert_eq!(m.identity_path(), format!("/docker/{ID}"));
        let layout = CgroupLayout::from_mountinfo(
            "33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(
            m.controller_dir(&layout, "cpuacct"),
            Some(PathBuf::from(format!(
                "/sys/fs/cgroup/cpu,cpuacct/docker/{ID}"
            )))
        );
        // memory has no v1 mount in this layout: falls back to the unified hierarchy
        assert_eq!(
            m.controller_dir(&layout, "memory"),
            Some(PathBuf::from(format!("/sys/fs/cgroup/unified/docker/{ID}")))
        );
    }

    #[test]
    fn v1_only_uses_systemd_path() {
        let m = CgroupMembership::parse("4:cpu:/\n1:name=systemd:/system.slice/x.service\n");
        assert_eq!(m.identity_path(), "/system.slice/x.service");
    }

    #[test]
    fn v2_root_is_root() {
        let m = CgroupMembership::parse("0::/\n");
        assert_eq!(m.identity_path(), "/");
        assert_eq!(CgroupMembership::parse("").identity_path(), "/");
    }
}
