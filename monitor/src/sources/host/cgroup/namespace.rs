//! A cgroup namespace of the agent's own. Docker gives each container one on cgroup v2 hosts
//! unless told `--cgroupns=host`, and Compose v1 (Debian 12's `docker-compose`) cannot tell it.
//! `/proc/<pid>/cgroup` then shows every other process's path relative to the namespace's root,
//! climbing out of it with `/..` (`0::/../system.slice/docker-<id>.scope`), and a path cannot be
//! classified or its statistics read. Where the host's hierarchies are still mounted whole, as
//! the deployment files' `/sys` bind mount makes them, the root's place on the host is found
//! once at start: the cgroup at the root's depth (PID 1's path says how deep) whose
//! `cgroup.procs` lists this process. Paths are then put back on the host's root.
use super::{CgroupLayout, CgroupMembership};
use std::path::{Path, PathBuf};

/// Where this process's cgroup namespace is rooted on the host, per hierarchy; empty in the
/// host's namespace, where paths need no change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceRoot {
    unified: Option<String>,
    /// (controllers of the hierarchy, the root's host path)
    v1: Vec<(Vec<String>, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum NamespaceRootError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no cgroup under {mount} lists PID {pid} at depth {depth}: the host's {hierarchy} \
         hierarchy is not mounted whole here"
    )]
    NotFound {
        hierarchy: String,
        mount: PathBuf,
        pid: u32,
        depth: usize,
    },
}

impl NamespaceRoot {
    /// In the host's namespace: paths stay as they are.
    pub fn host() -> Self {
        Self::default()
    }

    pub fn is_host(&self) -> bool {
        self.unified.is_none() && self.v1.is_empty()
    }

    /// The host paths of the namespace roots of process `pid` (this one, seen from the host's
    /// PID namespace), from `proc_root`'s `self/cgroup` and `1/cgroup` and the mounted
    /// hierarchies. Each hierarchy where PID 1's path climbs out (`/..`) is searched.
    pub fn find(
        layout: &CgroupLayout,
        proc_root: &Path,
        pid: u32,
    ) -> Result<Self, NamespaceRootError> {
        let read = |name: &str| -> Result<CgroupMembership, NamespaceRootError> {
            let path = proc_root.join(name).join("cgroup");
            let bytes = std::fs::read(&path).map_err(|source| NamespaceRootError::Read {
                path: path.clone(),
                source,
            })?;
            Ok(CgroupMembership::parse_bytes(&bytes).unwrap_or_default())
        };
        let (own, init) = (read("self")?, read("1")?);
        let mut root = Self::default();
        if let (Some(mount), Some(init_path), Some(own_path)) =
            (&layout.unified, &init.unified, &own.unified)
        {
            root.unified = root_of(mount, init_path, own_path, pid, "unified")?;
        }
        for (controllers, init_path) in &init.v1 {
            let own_path = own
                .v1
                .iter()
                .find(|(c, _)| c == controllers)
                .map(|(_, p)| p);
            let mount = layout
                .v1
                .iter()
                .find(|h| &h.controllers == controllers)
                .map(|h| &h.mount_point);
            if let (Some(own_path), Some(mount)) = (own_path, mount) {
                if let Some(r) = root_of(mount, init_path, own_path, pid, &controllers.join(","))? {
                    root.v1.push((controllers.clone(), r));
                }
            }
        }
        Ok(root)
    }

    /// `m` with each path that is relative to this namespace's root put back on the host's.
    pub fn to_host(&self, mut m: CgroupMembership) -> CgroupMembership {
        if let (Some(root), Some(path)) = (&self.unified, &mut m.unified) {
            *path = rebase(root, path);
        }
        for (controllers, path) in &mut m.v1 {
            if let Some((_, root)) = self.v1.iter().find(|(c, _)| c == controllers) {
                *path = rebase(root, path);
            }
        }
        m
    }

    /// The root's host path in the unified hierarchy (or the first v1 one), for the log.
    pub fn describe(&self) -> String {
        self.unified
            .as_deref()
            .or(self.v1.first().map(|(_, r)| r.as_str()))
            .unwrap_or("/")
            .to_owned()
    }
}

/// The host path of the namespace root in one hierarchy mounted at `mount`: `None` when PID 1's
/// path does not climb out (the host's namespace in that hierarchy).
fn root_of(
    mount: &Path,
    init_path: &str,
    own_path: &str,
    pid: u32,
    hierarchy: &str,
) -> Result<Option<String>, NamespaceRootError> {
    let depth = init_path
        .split('/')
        .filter(|s| !s.is_empty())
        .take_while(|s| *s == "..")
        .count();
    if depth == 0 {
        return Ok(None);
    }
    let own_depth = own_path.split('/').filter(|s| !s.is_empty()).count();
    let wanted = pid.to_string();
    let lists_pid = |dir: &Path| {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .is_ok_and(|procs| procs.lines().any(|l| l == wanted))
    };
    let found = dirs_at_depth(mount, depth + own_depth)
        .into_iter()
        .find(|d| lists_pid(d))
        .ok_or_else(|| NamespaceRootError::NotFound {
            hierarchy: hierarchy.to_owned(),
            mount: mount.to_owned(),
            pid,
            depth: depth + own_depth,
        })?;
    let relative = found.strip_prefix(mount).unwrap_or(&found);
    let segments: Vec<String> = relative
        .components()
        .take(depth)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    Ok(Some(format!("/{}", segments.join("/"))))
}

/// The directories exactly `depth` levels under `dir`.
fn dirs_at_depth(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut level = vec![dir.to_owned()];
    for _ in 0..depth {
        level = level
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|entries| entries.flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
    }
    level
}

/// `path` (relative to the namespace root, climbing out with `..`) on the host: `root` joined
/// with it, `..` taking a segment off.
fn rebase(root: &str, path: &str) -> String {
    let mut segments: Vec<&str> = root.split('/').filter(|s| !s.is_empty()).collect();
    for s in path.split('/').filter(|s| !s.is_empty()) {
        if s == ".." {
            segments.pop();
        } else {
            segments.push(s);
        }
    }
    format!("/{}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_climbing_out_of_the_root_land_on_the_hosts() {
        let root = "/system.slice/docker-aaa.scope";
        assert_eq!(
            rebase(root, "/../docker-bbb.scope"),
            "/system.slice/docker-bbb.scope"
        );
        assert_eq!(rebase(root, "/../../init.scope"), "/init.scope");
        assert_eq!(rebase(root, "/"), root);
        assert_eq!(rebase(root, "/inner"), format!("{root}/inner"));
        // Climbing past the host's root stays at the root.
        assert_eq!(rebase("/a", "/../../.."), "/");
    }

    /// A host tree as mounted whole: this process in `/system.slice/docker-aaa.scope` (its
    /// namespace's root), PID 1 two levels above it.
    fn host_tree(pid: u32) -> (tempfile::TempDir, tempfile::TempDir, CgroupLayout) {
        let cgroupfs = tempfile::tempdir().unwrap();
        for dir in [
            "system.slice/docker-aaa.scope",
            "system.slice/docker-bbb.scope",
        ] {
            std::fs::create_dir_all(cgroupfs.path().join(dir)).unwrap();
        }
        std::fs::write(
            cgroupfs
                .path()
                .join("system.slice/docker-bbb.scope/cgroup.procs"),
            "7\n",
        )
        .unwrap();
        std::fs::write(
            cgroupfs
                .path()
                .join("system.slice/docker-aaa.scope/cgroup.procs"),
            format!("3\n{pid}\n"),
        )
        .unwrap();
        let proc_root = tempfile::tempdir().unwrap();
        for (name, text) in [("self", "0::/\n"), ("1", "0::/../../init.scope\n")] {
            std::fs::create_dir_all(proc_root.path().join(name)).unwrap();
            std::fs::write(proc_root.path().join(name).join("cgroup"), text).unwrap();
        }
        let layout = CgroupLayout {
            mode: crate::model::CgroupMode::V2,
            unified: Some(cgroupfs.path().to_owned()),
            v1: Vec::new(),
        };
        (cgroupfs, proc_root, layout)
    }

    #[test]
    fn the_root_is_the_cgroup_listing_this_process_at_pid_1s_depth() {
        let (_fs, proc_root, layout) = host_tree(4242);
        let root = NamespaceRoot::find(&layout, proc_root.path(), 4242).unwrap();
        assert!(!root.is_host());
        assert_eq!(root.describe(), "/system.slice/docker-aaa.scope");
        let other = CgroupMembership::parse("0::/../docker-bbb.scope\n");
        assert_eq!(
            root.to_host(other).unified.as_deref(),
            Some("/system.slice/docker-bbb.scope")
        );
    }

    #[test]
    fn a_hierarchy_not_mounted_whole_is_an_error_that_says_so() {
        let (_fs, proc_root, layout) = host_tree(4242);
        let e = NamespaceRoot::find(&layout, proc_root.path(), 999).unwrap_err();
        assert!(
            matches!(e, NamespaceRootError::NotFound { depth: 2, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("not mounted whole"), "{e}");
    }

    #[test]
    fn in_the_hosts_namespace_nothing_changes() {
        let (_fs, proc_root, layout) = host_tree(4242);
        std::fs::write(proc_root.path().join("1/cgroup"), "0::/init.scope\n").unwrap();
        let root = NamespaceRoot::find(&layout, proc_root.path(), 4242).unwrap();
        assert!(root.is_host());
        let m = CgroupMembership::parse("0::/system.slice/docker-bbb.scope\n");
        assert_eq!(root.to_host(m.clone()), m);
    }
}
