//! The workload list stage: the round's workloads before and after the GPU holders join.
//! Running containers come from the engine's cache (which keeps the last known ones while the
//! engine is away), the cgroup tree's containers stand in while it is down, a workload that
//! stopped since the last round is kept once with its partial window, and containerd's task
//! specs name the pods no engine described.
use super::cgroups::WorkloadCgroups;
use crate::events::{CriSpecUnreadable, EventCounters, ProcReadFailed};
use crate::model::{
    ContainerInfo, Gpu, GpuProcess, ProcessCpu, SourceState, Workload, WorkloadGpu,
    WorkloadGpuShare, WorkloadId, WorkloadKind,
};
use crate::sources::containerd::CriTasks;
use crate::sources::docker::DockerCache;
use crate::sources::host::pid::PidSet;
use crate::sources::host::{cgroup_tree, HostReader};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

pub(super) struct WorkloadList {
    docker: Option<Arc<DockerCache>>,
    /// Names the pods of containerd nodes, where no Docker lists them.
    cri: Option<CriTasks>,
    /// The containers the cgroup tree shows, while Docker cannot be asked.
    docker_cgroups: cgroup_tree::DockerCgroupScan,
    /// The previous round's workloads, to report one that stops with its partial window.
    last: BTreeMap<WorkloadId, Workload>,
}

impl WorkloadList {
    pub fn new(docker: Option<Arc<DockerCache>>, cri: Option<CriTasks>) -> Self {
        Self {
            docker,
            cri,
            docker_cgroups: cgroup_tree::DockerCgroupScan::default(),
            last: BTreeMap::new(),
        }
    }

    pub fn docker(&self) -> Option<&DockerCache> {
        self.docker.as_deref()
    }

    /// The container engine's state as a source.
    pub fn docker_state(&self) -> SourceState {
        match &self.docker {
            None => SourceState::disabled("disabled"),
            Some(cache) => {
                let status = cache.status();
                if status.up {
                    SourceState::up()
                } else {
                    SourceState::down(
                        status
                            .error
                            .unwrap_or_else(|| "not connected yet".to_owned()),
                    )
                }
            }
        }
    }

    /// The round's workloads before the GPU holders join: running containers, and the cgroup
    /// tree's containers when Docker is down.
    pub fn listed(
        &mut self,
        docker_state: &SourceState,
        cgroups: &mut WorkloadCgroups,
        host: &HostReader,
        events: &EventCounters,
    ) -> BTreeMap<WorkloadId, Workload> {
        let mut workloads: BTreeMap<WorkloadId, Workload> = BTreeMap::new();
        let containers: Vec<Arc<ContainerInfo>> = self
            .docker
            .as_ref()
            .map(|c| c.containers())
            .unwrap_or_default();
        for c in &containers {
            let id = container_workload(c, cgroups, host, events);
            workloads.insert(id.clone(), new_workload(id, Some(c)));
        }
        if !docker_state.up {
            let found = self
                .docker_cgroups
                .containers(cgroups.layout(), Instant::now());
            for (id, path) in found {
                cgroups.remember_path(id, path);
                workloads
                    .entry(id.clone())
                    .or_insert_with(|| new_workload(id.clone(), None));
            }
        }
        workloads
    }

    /// The previous round's workloads that are not in this one and whose cgroup is gone, marked
    /// as exited with their partial window (before the GPU holders join: a vanished process's
    /// work goes to the exited workload). One a live GPU process still holds is here, and
    /// costs no look at its cgroup directory.
    pub fn add_ended(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        gpus: &[Gpu],
        cgroups: &WorkloadCgroups,
    ) {
        let held: HashSet<&WorkloadId> = gpus
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| !p.vanished)
            .filter_map(|p| p.workload.as_ref())
            .collect();
        let ended: Vec<WorkloadId> = self
            .last
            .keys()
            .filter(|id| !workloads.contains_key(*id) && !held.contains(id))
            .filter(|id| cgroups.removed(id))
            .cloned()
            .collect();
        for id in ended {
            if let Some(mut w) = self.last.remove(&id) {
                w.exited = true;
                w.gpu = WorkloadGpu::default();
                w.stalls = None;
                w.verdict = None;
                w.errors.clear();
                if let Some(c) = &mut w.cpu {
                    c.cores = None;
                    c.throttled_fraction = None;
                }
                workloads.insert(id, w);
            }
        }
    }

    /// The GPU holders joined to the list (see [`join_gpu_holders`]); the PIDs that hold a GPU.
    pub fn join(&self, workloads: &mut BTreeMap<WorkloadId, Workload>, gpus: &[Gpu]) -> PidSet {
        join_gpu_holders(workloads, gpus, |id| self.unverified_container(id))
    }

    /// Why a Docker workload the cache does not hold is still running: Docker lists it, but
    /// inspecting it failed (the cache retries).
    fn unverified_container(&self, id: &WorkloadId) -> Option<String> {
        if !matches!(
            id.kind,
            WorkloadKind::Docker | WorkloadKind::Podman | WorkloadKind::Kubernetes
        ) {
            return None;
        }
        self.docker.as_ref()?.unverified(id.container_id()?)
    }

    /// The Kubernetes workloads no Docker described (a containerd node's pods), named from
    /// containerd's task specs.
    pub fn name_cri_containers(
        &mut self,
        workloads: &mut BTreeMap<WorkloadId, Workload>,
        events: &EventCounters,
    ) {
        let Some(cri) = &mut self.cri else { return };
        for (id, w) in workloads
            .iter_mut()
            .filter(|(id, w)| id.kind == WorkloadKind::Kubernetes && w.container.is_none())
        {
            match cri.container(id) {
                Ok(Some(c)) => {
                    w.name = c.name.clone();
                    w.container = Some(c);
                    w.container_unverified = None;
                }
                Ok(None) => {}
                Err(e) => events.emit(CriSpecUnreadable {
                    error: e.to_string(),
                }),
            }
        }
        let live: HashSet<&str> = workloads
            .keys()
            .filter_map(|id| id.container_id())
            .collect();
        cri.retain(|id| live.contains(id));
    }

    /// Keeps the round's running workloads, for the next round to tell which ended.
    pub fn end_round(&mut self, workloads: &[Workload]) {
        self.last = workloads
            .iter()
            .filter(|w| !w.exited)
            .map(|w| (w.id.clone(), w.clone()))
            .collect();
    }
}

/// The workload a listed container is: `docker:<id>`, or its pod's `kubernetes:<uid>/<id>`
/// where its labels name a pod *and* its init process's cgroup sits under that pod (labels
/// are the tenant's to set; the cgroup is not). Remembers its cgroup at the first sight.
fn container_workload(
    c: &ContainerInfo,
    cgroups: &mut WorkloadCgroups,
    host: &HostReader,
    events: &EventCounters,
) -> WorkloadId {
    let docker = c.engine_workload_id();
    let labelled = c.workload_id();
    for id in [&labelled, &docker] {
        if cgroups.contains(id) {
            return id.clone();
        }
    }
    let Some(pid) = c.init_pid else {
        return docker;
    };
    match host.process(pid) {
        Ok(info) => {
            let id = if info.workload == labelled {
                labelled
            } else {
                docker
            };
            cgroups.remember(id.clone(), &info.membership);
            id
        }
        Err(e) => {
            events.emit(ProcReadFailed {
                subject: format!("container {} init process", c.name),
                error: e.to_string(),
            });
            docker
        }
    }
}

/// The join: each attributed GPU process's memory goes to its workload's share of that GPU; a
/// workload that holds a GPU but was not listed (a cgroup, a service, a container the engine
/// could not describe: `unverified` says why) is created. Returns the PIDs that hold a GPU.
fn join_gpu_holders(
    workloads: &mut BTreeMap<WorkloadId, Workload>,
    gpus: &[Gpu],
    unverified: impl Fn(&WorkloadId) -> Option<String>,
) -> PidSet {
    let mut gpu_pids = PidSet::default();
    // Each workload's GPU processes with their CPU time, each PID once (a DDP rank holds
    // several GPUs).
    let mut cpu: BTreeMap<&WorkloadId, BTreeMap<u32, Option<f64>>> = BTreeMap::new();
    for gpu in gpus {
        for p in &gpu.processes {
            let Some(id) = &p.workload else { continue };
            gpu_pids.insert(p.reading.pid);
            let w = workloads.entry(id.clone()).or_insert_with(|| {
                let mut w = new_workload(id.clone(), None);
                w.container_unverified = unverified(id);
                w
            });
            add_gpu_share(&mut w.gpu, gpu, p);
            cpu.entry(id)
                .or_default()
                .insert(p.reading.pid, p.host_cpu_seconds);
        }
    }
    for (id, pids) in cpu {
        if let Some(w) = workloads.get_mut(id) {
            // Known only when every one of them was measured this round.
            w.gpu.process_cpu =
                pids.values()
                    .copied()
                    .sum::<Option<f64>>()
                    .map(|seconds| ProcessCpu {
                        seconds,
                        processes: pids.len(),
                    });
        }
    }
    gpu_pids
}

fn new_workload(id: WorkloadId, container: Option<&Arc<ContainerInfo>>) -> Workload {
    let name = match (container, id.kind) {
        (Some(c), _) => c.name.clone(),
        (None, WorkloadKind::Docker | WorkloadKind::Podman) => id.id.chars().take(12).collect(),
        (None, _) => id.id.to_string(),
    };
    Workload::new(id, name, container.cloned())
}

/// Adds a process's memory and identity to its workload's share of `gpu`; the busy share comes
/// when the round is completed.
fn add_gpu_share(w: &mut WorkloadGpu, gpu: &Gpu, p: &GpuProcess) {
    let mem = p.reading.used_memory_bytes.unwrap_or(0);
    w.memory_bytes += mem;
    w.processes += 1;
    let share = match w
        .per_gpu
        .iter_mut()
        .position(|s| s.index == gpu.device.index)
    {
        Some(i) => &mut w.per_gpu[i],
        None => {
            w.per_gpu.push(WorkloadGpuShare::new(
                gpu.device.index,
                gpu.device.uuid.clone(),
            ));
            w.per_gpu.last_mut().expect("just pushed")
        }
    };
    share.memory_bytes += mem;
    share.pids.push(p.reading.pid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{docker_id as id, gpu, process};

    /// Two GPUs: a listed container on both, a cgroup nobody listed on one, an unattributed
    /// (vanished) process beside them. Memory and PIDs add up per workload and GPU, in GPU
    /// order; the unlisted workload is created, with why it is unverified; the unattributed
    /// process belongs to nobody.
    #[test]
    fn gpu_processes_join_their_workloads_per_gpu() {
        let (train, job) = (id("train"), id("job"));
        let mut workloads = BTreeMap::new();
        workloads.insert(train.clone(), new_workload(train.clone(), None));
        let mut g0 = gpu(0);
        let measured = |mut p: GpuProcess, cpu: f64| {
            p.host_cpu_seconds = Some(cpu);
            p
        };
        g0.processes = vec![
            measured(process(10, Some(&train), 3 << 30), 0.5),
            measured(process(11, Some(&train), 1 << 30), 0.25),
            process(12, Some(&job), 2 << 30),
            process(13, None, 5 << 30),
        ];
        let mut g1 = gpu(1);
        g1.processes = vec![measured(process(10, Some(&train), 4 << 30), 0.5)];
        let pids = join_gpu_holders(&mut workloads, &[g0, g1], |id| {
            (id.id.as_ref() == "job").then(|| "inspect failed".to_owned())
        });
        let mut held: Vec<u32> = pids.iter().copied().collect();
        held.sort_unstable();
        assert_eq!(held, [10, 11, 12]);
        let t = &workloads[&train];
        assert_eq!(t.gpu.processes, 3);
        assert_eq!(t.gpu.memory_bytes, 8 << 30);
        let shares: Vec<_> = t
            .gpu
            .per_gpu
            .iter()
            .map(|s| (s.index, s.memory_bytes, s.pids.clone()))
            .collect();
        assert_eq!(shares, [(0, 4 << 30, vec![10, 11]), (1, 4 << 30, vec![10])]);
        assert_eq!(t.container_unverified, None);
        // Its GPU processes' CPU time, PID 10 once though it holds both GPUs.
        assert_eq!(
            t.gpu.process_cpu,
            Some(ProcessCpu {
                seconds: 0.75,
                processes: 2
            })
        );
        let j = &workloads[&job];
        assert_eq!(j.gpu.process_cpu, None, "its process was not measured");
        assert_eq!((j.gpu.processes, j.gpu.memory_bytes), (1, 2 << 30));
        assert_eq!(j.container_unverified.as_deref(), Some("inspect failed"));
        assert_eq!(
            workloads.len(),
            2,
            "the unattributed process makes no workload"
        );
    }
}
