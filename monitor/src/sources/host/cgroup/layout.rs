//! Which cgroup hierarchies this host has: v1, hybrid (v1 controllers plus a unified hierarchy),
//! or pure v2. Detected once at start from `/proc/self/mountinfo`.
use crate::model::CgroupMode;
use std::path::{Path, PathBuf};

/// One mounted v1 hierarchy: its controllers (and `name=` for named hierarchies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V1Hierarchy {
    pub controllers: Vec<String>,
    pub mount_point: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLayout {
    pub mode: CgroupMode,
    /// Mount point of the unified (v2) hierarchy, if any.
    pub unified: Option<PathBuf>,
    pub v1: Vec<V1Hierarchy>,
}

#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {source}")]
pub struct LayoutError {
    path: PathBuf,
    source: std::io::Error,
}

impl CgroupLayout {
    /// A pure cgroup v2 host whose hierarchy is mounted at `root` (a test's directory).
    #[cfg(test)]
    pub fn unified_at(root: &std::path::Path) -> Self {
        Self::from_mountinfo(&format!(
            "35 25 0:30 / {} rw - cgroup2 cgroup2 rw\n",
            root.display()
        ))
    }

    /// Reads the layout of the running host.
    pub fn detect() -> Result<Self, LayoutError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(|source| LayoutError {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::from_mountinfo(&text))
    }

    /// Parses `/proc/<pid>/mountinfo` text. Malformed lines are ignored.
    pub fn from_mountinfo(text: &str) -> Self {
        let mut unified = None;
        let mut v1 = Vec::new();
        for line in text.lines() {
            // <id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fstype> <source> <super options>
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut right = right.split(' ');
            let (Some(fstype), _source, Some(super_opts)) =
                (right.next(), right.next(), right.next())
            else {
                continue;
            };
            let mount_point = PathBuf::from(unescape_mountinfo(mount_point));
            match fstype {
                // Prefer the conventional location if several are mounted.
                "cgroup2" if unified.is_none() || mount_point == Path::new("/sys/fs/cgroup") => {
                    unified = Some(mount_point);
                }
                "cgroup" => {
                    let controllers: Vec<String> = super_opts
                        .split(',')
                        .filter(|o| !matches!(*o, "rw" | "ro") && !o.starts_with("release_agent"))
                        .filter(|o| !o.contains('=') || o.starts_with("name="))
                        .filter(|o| {
                            !matches!(
                                *o,
                                "noprefix" | "clone_children" | "xattr" | "cpuset_v2_mode"
                            )
                        })
                        .map(str::to_owned)
                        .collect();
                    if !controllers.is_empty()
                        && !v1
                            .iter()
                            .any(|h: &V1Hierarchy| h.controllers == controllers)
                    {
                        v1.push(V1Hierarchy {
                            controllers,
                            mount_point,
                        });
                    }
                }
                _ => {}
            }
        }
        let has_v1_controllers = v1
            .iter()
            .any(|h| h.controllers.iter().any(|c| !c.starts_with("name=")));
        let mode = match (has_v1_controllers, unified.is_some()) {
            (true, true) => CgroupMode::Hybrid,
            (true, false) => CgroupMode::V1,
            (false, true) => CgroupMode::V2,
            (false, false) => CgroupMode::None,
        };
        Self { mode, unified, v1 }
    }

    /// Mount point of the v1 hierarchy that holds `controller`, if one does.
    pub fn v1_mount(&self, controller: &str) -> Option<&V1Hierarchy> {
        self.v1
            .iter()
            .find(|h| h.controllers.iter().any(|c| c == controller))
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`). A backslash not
/// followed by three octal digits of a byte value (at most `\377`) is taken as it is.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(v) = octal {
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as read on the development machine (hybrid) and on the H200 (pure v2).
    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
";
    const V2: &str = "\
35 25 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V1: &str = "\
33 30 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";

    #[test]
    fn detects_hybrid() {
        let l = CgroupLayout::from_mountinfo(HYBRID);
        assert_eq!(l.mode, CgroupMode::Hybrid);
        assert_eq!(
            l.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            l.v1_mount("cpuacct").map(|h| h.mount_point.clone()),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert!(l.v1_mount("name=systemd").is_some());
        assert!(l.v1_mount("blkio").is_none());
    }

    #[test]
    fn detects_v2_and_v1_and_none() {
        assert_eq!(CgroupLayout::from_mountinfo(V2).mode, CgroupMode::V2);
        assert_eq!(CgroupLayout::from_mountinfo(V1).mode, CgroupMode::V1);
        assert_eq!(
            CgroupLayout::from_mountinfo("garbage\n").mode,
            CgroupMode::None
        );
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        // Found by the mountinfo fuzz target: `\777` is no byte (it overflowed a u8), and a
        // backslash at the end has no digits to read.
        assert_eq!(unescape_mountinfo("/a\\777b"), "/a\\777b");
        assert_eq!(unescape_mountinfo("/a\\377"), "/a\u{fffd}");
        assert_eq!(unescape_mountinfo("/a\\04"), "/a\\04");
    }

    #[test]
    fn this_host_has_a_layout() {
        // Every CI and dev machine mounts cgroups; a failure here means the detector is broken.
        let l = CgroupLayout::detect().expect("mountinfo is readable");
        assert_ne!(l.mode, CgroupMode::None, "{l:?}");
    }
}
