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
    /// Parses the bytes of a `/proc/<pid>/cgroup` file (`hierarchy-id:controllers:path` lines);
    /// `None` when a line is not of that form. A path that is not UTF-8 (whoever may create
    /// cgroups, a tenant with a delegated subtree or a rootless engine, can name one with any
    /// bytes) is kept as text with [`path_text`], so the process still has a workload.
    pub fn parse_bytes(data: &[u8]) -> Option<Self> {
        let mut m = Self::default();
        for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let mut fields = line.splitn(3, |b| *b == b':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return None;
            };
            let hierarchy: u32 = std::str::from_utf8(id).ok()?.parse().ok()?;
            let controllers: Vec<String> = std::str::from_utf8(controllers)
                .ok()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let path = path_text(path);
            if hierarchy == 0 && controllers.is_empty() {
                m.unified = Some(path);
            } else {
                m.v1.push((controllers, path));
            }
        }
        Some(m)
    }

    /// Parses the text of a `/proc/<pid>/cgroup` file; a malformed file is no membership.
    pub fn parse(text: &str) -> Self {
        Self::parse_bytes(text.as_bytes()).unwrap_or_default()
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

/// What [`path_text`] puts before a path that was not UTF-8: a real path starts with `/`.
pub const NOT_UTF8: &str = "bytes:";

/// A cgroup path as text: itself when it is UTF-8; otherwise `bytes:` and the path with each
/// byte that is not part of a UTF-8 character as `\xNN` and each backslash doubled. Two
/// different names never come out the same: a real path starts with `/`, and the escapes are
/// one to one (a lossy decoding gives `/a` + 0xFF and `/a` + 0xFE both `/a\u{fffd}`, which
/// would let one tenant's cgroup pass for another's). Such a path names no file: that
/// cgroup's own figures are not read.
pub fn path_text(raw: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(raw) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(raw.len() + 16);
    out.push_str(NOT_UTF8);
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
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
    fn a_path_that_is_not_utf8_keeps_a_name_of_its_own() {
        let m = CgroupMembership::parse_bytes(b"0::/rt-bin\xff\xfe\n").unwrap();
        assert_eq!(m.identity_path(), r"bytes:/rt-bin\xff\xfe");
        // no two names meet: other invalid bytes, a literal backslash-x name, a mix
        let other = CgroupMembership::parse_bytes(b"0::/rt-bin\xfe\xfe\n").unwrap();
        let literal = CgroupMembership::parse("0::/rt-bin\\xff\\xfe\n");
        let mixed = CgroupMembership::parse_bytes(b"0::/rt-bin\\xff\xfe\n").unwrap();
        let names = [
            m.identity_path(),
            other.identity_path(),
            literal.identity_path(),
            mixed.identity_path(),
        ];
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert!(CgroupMembership::parse_bytes(b"not a cgroup line\n").is_none());
        assert!(CgroupMembership::parse_bytes(b"x::/a\n").is_none());
    }

    #[test]
    fn v2_root_is_root() {
        let m = CgroupMembership::parse("0::/\n");
        assert_eq!(m.identity_path(), "/");
        assert_eq!(CgroupMembership::parse("").identity_path(), "/");
    }
}
