//! Whether the agent shares the host's PID and cgroup namespaces, read from `/proc`: a
//! container started without `--pid=host` or `--cgroupns=host` sees only part of the host, and
//! the agent says which part rather than reporting empty results.
use crate::model::BlindSpot;
use std::path::Path;

/// The host namespaces this process does not share, as seen through `proc_root`.
pub fn blind_spots(proc_root: &Path) -> Vec<BlindSpot> {
    let mut spots = Vec::new();
    let stat = std::fs::read_to_string(proc_root.join("2/stat")).ok();
    if !is_kthreadd(stat.as_deref()) {
        spots.push(BlindSpot::PrivatePidNamespace);
    }
    // Only meaningful where PID 1 is the host's init.
    if spots.is_empty() {
        let init = std::fs::read_to_string(proc_root.join("1/cgroup")).unwrap_or_default();
        if outside_own_cgroup_namespace(&init) {
            spots.push(BlindSpot::PrivateCgroupNamespace);
        }
    }
    spots
}

/// PID 2 of the host's PID namespace is always the kernel's `kthreadd`, child of PID 0; a
/// namespace of its own holds no kernel threads.
fn is_kthreadd(stat: Option<&str>) -> bool {
    let Some(stat) = stat else { return false };
    let Some((comm, rest)) = stat.split_once(") ") else {
        return false;
    };
    comm.ends_with("(kthreadd") && rest.split_whitespace().nth(1) == Some("0")
}

/// A process outside this one's cgroup namespace has its paths shown relative to the
/// namespace's root, climbing out with `/..`.
fn outside_own_cgroup_namespace(cgroup: &str) -> bool {
    cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .any(|path| path.starts_with("/.."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_2_is_kthreadd_only_in_the_host_namespace() {
        assert!(is_kthreadd(Some("2 (kthreadd) S 0 0 0 0 -1 2129984")));
        // A namespace's own PID 2: an ordinary process, child of its PID 1.
        assert!(!is_kthreadd(Some("2 (sh) S 1 2 1 0 -1 4194304")));
        // A process that names itself kthreadd is not a child of PID 0.
        assert!(!is_kthreadd(Some("2 (kthreadd) S 1 2 1 0 -1 4194304")));
        assert!(!is_kthreadd(None));
    }

    #[test]
    fn paths_climbing_out_mean_a_cgroup_namespace_of_its_own() {
        assert!(!outside_own_cgroup_namespace("0::/init.scope\n"));
        assert!(!outside_own_cgroup_namespace("12:pids:/\n0::/\n"));
        assert!(outside_own_cgroup_namespace("0::/../../init.scope\n"));
        assert!(outside_own_cgroup_namespace(
            "4:memory:/\n0::/../system.slice/containerd.service\n"
        ));
    }
}
