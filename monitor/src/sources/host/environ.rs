//! A process's launch environment: `/proc/<pid>/environ`, and the interfaces of its network
//! namespace from `/proc/<pid>/net/dev`.
use super::HostReadError;
use crate::model::RankEnv;
use std::path::Path;

/// The launch environment of `pid` (a process's environment does not change after it starts).
pub fn read(proc_root: &Path, pid: u32) -> Result<RankEnv, HostReadError> {
    let dir = proc_root.join(pid.to_string());
    let path = dir.join("environ");
    let environ = std::fs::read(&path).map_err(|source| HostReadError::Read { path, source })?;
    let mut env = RankEnv::from_environ(&environ);
    // The interfaces of its network namespace; a process in none readable leaves the list
    // empty, and nothing is said about NCCL_SOCKET_IFNAME.
    if let Ok(dev) = std::fs::read_to_string(dir.join("net/dev")) {
        env.interfaces = interfaces(&dev);
    }
    Ok(env)
}

/// The interface names of a `/proc/<pid>/net/dev` file (after its two header lines).
fn interfaces(dev: &str) -> Vec<String> {
    dev.lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned()))
        .filter(|n| !n.is_empty())
        .collect()
}
