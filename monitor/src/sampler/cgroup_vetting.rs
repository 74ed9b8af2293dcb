//! A cgroup path with a container's shape is a claim, not a proof: a tenant with a delegated
//! cgroup (a rootless session, a container allowed to make sub-cgroups) can name a directory
//! `docker-<victim id>.scope` and have its GPU use charged to the victim. A claim on a container
//! of the engine the agent is connected to stands only where that engine lists the container
//! and the path is the container's own cgroup (or below it); otherwise the process is a
//! workload of its own, shown with its real path, and the look-alike is counted.
use crate::events::{CgroupLookalike, EventCounters, EventKind};
use crate::model::{Engine, WorkloadId, WorkloadKind};
use crate::sources::docker::DockerCache;
use crate::sources::host::HostReader;
use std::collections::{HashMap, HashSet};

/// The cgroup paths of the engine's containers, read once from each container's init process.
#[derive(Default)]
pub struct CgroupVetting {
    /// Container id → its init process's cgroup path (`None`: it could not be read).
    own_paths: HashMap<String, Option<String>>,
    /// Look-alike paths already logged (each is counted every round, logged once).
    reported: HashSet<String>,
}

impl CgroupVetting {
    /// The workload a process in cgroup `path` is, given the one its path's shape `claimed`.
    pub fn vet(
        &mut self,
        claimed: WorkloadId,
        path: &str,
        cache: Option<&DockerCache>,
        host: &HostReader,
        events: &EventCounters,
    ) -> WorkloadId {
        let (Some(cache), Some(id)) = (cache, claimed.container_id()) else {
            return claimed;
        };
        let status = cache.status();
        let Some(engine) = status.engine.filter(|_| status.up) else {
            // While the engine cannot be asked, the shape is all there is.
            return claimed;
        };
        let info = cache.get(id);
        let owned = match claimed.kind {
            WorkloadKind::Docker => engine == Engine::Docker,
            WorkloadKind::Podman => engine == Engine::Podman,
            // A pod's container is the engine's only where the engine lists it (Docker-based
            // nodes); containerd's and CRI-O's are not its to vouch for.
            _ => info.is_some(),
        };
        if !owned || (info.is_none() && cache.unverified(id).is_some()) {
            return claimed;
        }
        let own = info.map(|c| {
            self.own_paths
                .entry(c.id.clone())
                .or_insert_with(|| {
                    let pid = c.init_pid?;
                    let p = host.process(pid).ok()?;
                    Some(p.membership.identity_path().to_owned())
                })
                .clone()
        });
        let genuine = match own {
            // Listed, its own path unknown (its init could not be read): the shape stands.
            Some(None) => true,
            Some(Some(own)) => within(path, &own),
            // The engine does not list it.
            None => false,
        };
        if genuine {
            return claimed;
        }
        if self.reported.insert(path.to_owned()) {
            events.emit(CgroupLookalike {
                path: path.to_owned(),
                claimed: claimed.to_string(),
            });
        } else {
            events.add(EventKind::CgroupLookalike, 1);
        }
        WorkloadId::new(WorkloadKind::Cgroup, path)
    }

    /// Forgets the containers the engine no longer lists.
    pub fn retain_listed(&mut self, cache: Option<&DockerCache>) {
        match cache {
            Some(c) => self.own_paths.retain(|id, _| c.get(id).is_some()),
            None => self.own_paths.clear(),
        }
    }
}

/// Whether cgroup `path` is `own` or below it: a look-alike that only starts with the same
/// characters (`…/docker-<id>.scopeX`) is neither.
fn within(path: &str, own: &str) -> bool {
    path == own || path.strip_prefix(own).is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn a_container_owns_its_cgroup_and_those_below_but_not_a_look_alike() {
        let own = "/system.slice/docker-0123abcd.scope";
        assert!(within(own, own));
        assert!(within("/system.slice/docker-0123abcd.scope/payload", own));
        // A tenant's cgroup named to start like the victim's claims nothing.
        assert!(!within("/system.slice/docker-0123abcd.scopeX", own));
        assert!(!within("/system.slice/docker-0123abcd.scope-x/y", own));
        assert!(!within("/system.slice/docker-0123abc", own));
        assert!(!within("/other/system.slice/docker-0123abcd.scope", own));
    }
}
