//! The attribution stage: each GPU process the driver lists, joined to the workload whose cgroup
//! it is in. The [`ProcessTable`] reads `/proc` only for PIDs it cannot vouch for; a cgroup path
//! with a container's shape is vetted against the engine ([`CgroupVetting`]); a process gone
//! since the last round keeps the workload it had then.
use super::cgroup_vetting::CgroupVetting;
use super::cgroups::WorkloadCgroups;
use super::process_table::{ProcessReadError, ProcessTable};
use crate::events::{EventCounters, GpuProcessVanished, ProcReadFailed};
use crate::model::{DeviceReading, Gpu, GpuProcess, ProcessReading, WorkloadId};
use crate::sources::docker::DockerCache;
use crate::sources::host::cgroup::CgroupMembership;
use crate::sources::host::pid::PidMap;
use crate::sources::host::HostReader;

/// What attribution reads from besides its own state: the round's sources.
pub(super) struct AttributionSources<'a> {
    pub docker: Option<&'a DockerCache>,
    pub host: &'a HostReader,
    pub events: &'a EventCounters,
}

pub(super) struct Attribution {
    processes: ProcessTable,
    /// The engine's containers' own cgroup paths, to tell a container from a look-alike.
    vetting: CgroupVetting,
    /// The previous round's GPU processes and their workloads, to attribute one that exits.
    last_pid_workload: PidMap<WorkloadId>,
}

impl Attribution {
    pub fn new(host: HostReader, revalidate_rounds: u64) -> Self {
        Self {
            processes: ProcessTable::new(host, revalidate_rounds),
            vetting: CgroupVetting::default(),
            last_pid_workload: PidMap::default(),
        }
    }

    /// The GPU readings with each process attributed to its workload; the cgroup of a workload
    /// seen for the first time is remembered in `cgroups`.
    pub fn attribute(
        &mut self,
        readings: Vec<DeviceReading>,
        cgroups: &mut WorkloadCgroups,
        sources: &AttributionSources<'_>,
    ) -> Vec<Gpu> {
        self.processes.begin_round();
        let mut gpus = Vec::with_capacity(readings.len());
        let mut new_memberships: Vec<(WorkloadId, CgroupMembership)> = Vec::new();
        for mut device in readings {
            let mut processes: Vec<GpuProcess> = Vec::with_capacity(device.processes.len());
            for reading in std::mem::take(&mut device.processes) {
                let known = processes.last().and_then(|p| p.workload.as_ref());
                let first_sight = |w: &WorkloadId| known != Some(w) && !cgroups.contains(w);
                let (p, membership) = self.process(reading, device.index, sources);
                if let (Some(w), Some(m)) = (&p.workload, membership) {
                    if first_sight(w) {
                        new_memberships.push((w.clone(), m));
                    }
                }
                processes.push(p);
            }
            gpus.push(Gpu {
                device,
                busy: None,
                sm_activity: None,
                gpm: None,
                pcie: None,
                energy_joules: None,
                processes,
            });
        }
        self.processes.end_round();
        self.last_pid_workload = gpus
            .iter()
            .flat_map(|g| &g.processes)
            .filter(|p| !p.vanished)
            .filter_map(|p| Some((p.reading.pid, p.workload.clone()?)))
            .collect();
        for (id, membership) in new_memberships {
            cgroups.remember(id, &membership);
        }
        self.vetting.retain_listed(sources.docker);
        gpus
    }

    /// One process attributed, with its cgroup membership where `/proc` told it.
    fn process(
        &mut self,
        reading: ProcessReading,
        gpu_index: u32,
        sources: &AttributionSources<'_>,
    ) -> (GpuProcess, Option<CgroupMembership>) {
        let pid = reading.pid;
        match self.processes.resolve(pid) {
            Ok(info) => {
                let workload = self.vetting.vet(
                    info.workload.clone(),
                    info.membership.identity_path(),
                    sources.docker,
                    sources.host,
                    sources.events,
                );
                let mut p = unattributed(reading, Some(workload), false);
                p.start_time_ticks = Some(info.key.start_time);
                p.command = Some(info.name.clone());
                (p, Some(info.membership.clone()))
            }
            Err(e) => {
                let vanished = matches!(e, ProcessReadError::Vanished { .. });
                if vanished {
                    sources.events.emit(GpuProcessVanished {
                        gpu: gpu_index,
                        error: e.to_string(),
                    });
                } else {
                    sources.events.emit(ProcReadFailed {
                        subject: format!("GPU {gpu_index}"),
                        error: e.to_string(),
                    });
                }
                // gone since the last round: its work up to the exit still belongs to the
                // workload it had then
                let workload = vanished
                    .then(|| self.last_pid_workload.get(&pid).cloned())
                    .flatten();
                (unattributed(reading, workload, vanished), None)
            }
        }
    }
}

/// A GPU process with nothing read about it from the host yet.
fn unattributed(
    reading: ProcessReading,
    workload: Option<WorkloadId>,
    vanished: bool,
) -> GpuProcess {
    GpuProcess {
        reading,
        start_time_ticks: None,
        command: None,
        workload,
        vanished,
        state: None,
        stuck: false,
        host_cpu_seconds: None,
        driver_sm_percent: None,
        busy_fraction: None,
    }
}
