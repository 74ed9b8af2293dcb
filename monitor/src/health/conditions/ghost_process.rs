//! `ghost_process`: GPU memory held by a process that no longer exists, that sits in the cgroup
//! of a container Docker no longer runs, or that is stuck in uninterruptible sleep. An alert
//! rule (which names the container the process was last seen in) and a doctor check.
use crate::health::check::{Checks, Status, Window};
use crate::health::rule::{
    gpu_key, rule_config, ContainerRef, Finding, GpuRef, Outcome, Outcomes, Rule, Severity,
    SnapshotView, Subject, MIB,
};
use crate::model::{Gpu, GpuProcess, Workload, WorkloadKind};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

pub const NAME: &str = "ghost_process";

rule_config! {
    /// GPU memory held by a process that is gone, containerless or stuck.
    Config {}
    for = Duration::from_secs(30), severity = Severity::Critical
}

/// The rule, with the last container each GPU PID belonged to, to name a ghost after its
/// process is gone.
pub struct GhostRule {
    owners: HashMap<u32, ContainerRef>,
}

impl GhostRule {
    pub fn new(_: &Config) -> Self {
        Self {
            owners: HashMap::new(),
        }
    }
}

impl Rule for GhostRule {
    fn evaluate(&mut self, round: &SnapshotView<'_>, out: &mut Outcomes) {
        let mut live = HashSet::new();
        let docker_up = round.snap.sources.docker.up;
        for g in &round.snap.gpus {
            for p in &g.processes {
                let pid = p.reading.pid;
                live.insert(pid);
                let current = p.workload.as_ref().and_then(|id| round.workload(id));
                let owner = match current.map(ContainerRef::of) {
                    Some(o) => {
                        self.owners.insert(pid, o.clone());
                        Some(o)
                    }
                    None => self.owners.get(&pid).cloned(),
                };
                let outcome = ghost_outcome(docker_up, g, p, current, owner.as_ref());
                let subject = Subject {
                    gpu: Some(GpuRef::of(g)),
                    container: owner,
                    pid: Some(pid),
                };
                out.push((format!("{}/{pid}", gpu_key(g)), subject, outcome));
            }
        }
        self.owners.retain(|pid, _| live.contains(pid));
    }
}

/// Whether process `p` on `g` is a ghost. `current` is the workload its cgroup names in this
/// snapshot; `owner` the container it last belonged to (to name it after it is gone).
fn ghost_outcome(
    docker_up: bool,
    g: &Gpu,
    p: &GpuProcess,
    current: Option<&Workload>,
    owner: Option<&ContainerRef>,
) -> Outcome {
    let mib = p.reading.used_memory_bytes.unwrap_or(0) as f64 / MIB;
    let pid = p.reading.pid;
    let whose = owner.map_or_else(String::new, |o| format!(" (last in {})", o.name));
    let breached = |value: f64, summary: String, action: &str| {
        Outcome::Breached(Finding {
            value,
            threshold: 0.0,
            unit: "MiB",
            summary,
            action: action.to_owned(),
        })
    };
    if p.vanished {
        if p.reading.used_memory_bytes == Some(0) {
            return Outcome::Clear;
        }
        return breached(
            mib,
            format!(
                "GPU {}: PID {pid}{whose} no longer exists, but NVML still reports it holding \
                 {mib:.0} MiB",
                g.device.index
            ),
            "The driver has not released a dead process's memory: look for a zombie or its \
             parent (`ps -o ppid= -p` on its children), stop the container that owned it, and \
             reset the GPU (`nvidia-smi -r`) once it is idle.",
        );
    }
    if p.stuck {
        return breached(
            mib,
            format!(
                "GPU {}: PID {pid}{whose} is stuck in uninterruptible sleep (D) while holding \
                 {mib:.0} MiB and computing nothing",
                g.device.index
            ),
            "Its kernel call does not return (storage, NFS or driver): check `cat \
             /proc/<pid>/stack` and `dmesg`; the memory is freed only when it exits.",
        );
    }
    // A Docker cgroup that Docker does not know: the container is gone but its process is not.
    let in_dead_container = docker_up
        && p.workload
            .as_ref()
            .is_some_and(|id| id.kind == WorkloadKind::Docker)
        && current.is_none_or(|w| w.container.is_none());
    if in_dead_container && current.is_some_and(|w| w.container_unverified.is_some()) {
        // Docker runs it but could not be asked about it: not gone, not known either.
        return Outcome::Unknown;
    }
    if in_dead_container {
        return breached(
            mib,
            format!(
                "GPU {}: PID {pid} holds {mib:.0} MiB in the cgroup of a container Docker no \
                 longer runs",
                g.device.index
            ),
            "The container exited but this process survived it: kill it (`kill -9`), or \
             restart the Docker daemon if the cgroup lingers.",
        );
    }
    Outcome::Clear
}

/// Doctor: every ghost in the last snapshot is a risk; one Docker could not describe is a
/// warning ("unverified"), since it may be a healthy job.
pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let last = window.last();
    let round = SnapshotView::new(last);
    let mut ghosts = 0;
    for g in &last.gpus {
        for p in &g.processes {
            let current = p.workload.as_ref().and_then(|id| round.workload(id));
            let owner = current.map(ContainerRef::of);
            let subject = format!("GPU {} PID {}", g.device.index, p.reading.pid);
            match ghost_outcome(last.sources.docker.up, g, p, current, owner.as_ref()) {
                Outcome::Breached(f) => {
                    ghosts += 1;
                    out.add(
                        NAME,
                        subject,
                        Status::Risk,
                        format!("{:.0} MiB", f.value),
                        "no ghost processes",
                        &format!("{} — {}", f.summary, f.action),
                    );
                }
                Outcome::Unknown => {
                    let why = current
                        .and_then(|w| w.container_unverified.as_deref())
                        .unwrap_or("its container cannot be told");
                    ghosts += 1;
                    out.add(
                        NAME,
                        subject,
                        Status::Warning,
                        "unverified",
                        "no ghost processes",
                        &format!(
                            "Docker lists its container as running but could not describe it \
                             ({why}): not a ghost as far as Docker says; run the check again."
                        ),
                    );
                }
                Outcome::Clear => {}
            }
        }
    }
    if ghosts == 0 && last.sources.nvml.up {
        out.add(NAME, "host", Status::Ok, "none", "no ghost processes", "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::{doctor_checks, evaluate};
    use crate::model::test_support::{container, gpu, process, snapshot};
    use crate::model::{Snapshot, SourceState, WorkloadId};

    fn ghost(snap: &Snapshot) -> Vec<Outcome> {
        let mut rule = GhostRule::new(&Config::default());
        evaluate(&mut rule, snap)
            .into_iter()
            .map(|(_, _, o)| o)
            .collect()
    }

    /// A live job, a process in a container Docker does not know, one stuck, one in D once.
    fn host() -> Snapshot {
        let live = container("train");
        let mut g = gpu(0);
        g.processes.push(process(10, Some(&live.id), 1 << 30));
        // A Docker cgroup Docker does not know: the container is gone, its process is not.
        let orphan = WorkloadId {
            kind: WorkloadKind::Docker,
            id: "f".repeat(64).into(),
        };
        g.processes.push(process(11, Some(&orphan), 2 << 30));
        let mut stuck = process(12, Some(&live.id), 3 << 30);
        stuck.state = Some('D');
        stuck.stuck = true;
        g.processes.push(stuck);
        // In D at one check only, or with CPU time between two: busy with I/O, not stuck.
        let mut reading = process(13, Some(&live.id), 1 << 30);
        reading.state = Some('D');
        g.processes.push(reading);
        let mut orphan_w = container("x");
        orphan_w.id = orphan;
        orphan_w.container = None;
        snapshot(0, vec![g], vec![live, orphan_w])
    }

    #[test]
    fn ghosts_are_dead_stuck_or_containerless() {
        let snap = host();
        let out = ghost(&snap);
        assert_eq!(out[0], Outcome::Clear);
        let Outcome::Breached(f) = &out[1] else {
            panic!("{:?}", out[1]);
        };
        assert!(
            f.summary.contains("container Docker no longer runs"),
            "{}",
            f.summary
        );
        assert_eq!(f.value, 2048.0);
        let Outcome::Breached(f) = &out[2] else {
            panic!("{:?}", out[2]);
        };
        assert!(f.summary.contains("uninterruptible sleep"), "{}", f.summary);
        assert_eq!(out[3], Outcome::Clear, "one D reading is not stuck");
        // Docker lists it but inspecting it failed: not known, and not gone either.
        let mut unverified = snap.clone();
        unverified.workloads[1].container_unverified =
            Some("inspecting ff…: 500 Internal Server Error".to_owned());
        assert_eq!(ghost(&unverified)[1], Outcome::Unknown);
        // With Docker down, an unknown container is no evidence of anything.
        let mut snap = snap;
        snap.sources.docker = SourceState::down("socket missing");
        assert_eq!(ghost(&snap)[1], Outcome::Clear);
    }

    /// A process that vanishes is named after the container it was last seen in; a vanished
    /// one that NVML says holds nothing is no ghost; a dead PID is forgotten once unlisted.
    #[test]
    fn a_vanished_process_is_named_after_its_last_container() {
        let live = container("train");
        let mut g = gpu(0);
        g.processes.push(process(10, Some(&live.id), 1 << 30));
        let mut rule = GhostRule::new(&Config::default());
        let seen = snapshot(0, vec![g.clone()], vec![live]);
        assert_eq!(evaluate(&mut rule, &seen)[0].2, Outcome::Clear);
        let mut dead = process(10, None, 1 << 30);
        dead.vanished = true;
        let mut freed = process(11, None, 0);
        freed.vanished = true;
        g.processes = vec![dead, freed];
        let out = evaluate(&mut rule, &snapshot(1000, vec![g], vec![]));
        let (key, subject, Outcome::Breached(f)) = &out[0] else {
            panic!("{:?}", out[0]);
        };
        assert_eq!(key, "GPU-00000000/10");
        assert_eq!(subject.pid, Some(10));
        assert_eq!(subject.container.as_ref().unwrap().name, "train");
        assert_eq!(
            f.summary,
            "GPU 0: PID 10 (last in train) no longer exists, but NVML still reports it holding \
             1024 MiB"
        );
        assert_eq!(out[1].2, Outcome::Clear, "a dead PID holding nothing");
        evaluate(&mut rule, &snapshot(2000, vec![gpu(0)], vec![]));
        assert!(rule.owners.is_empty());
    }

    #[test]
    fn doctor_reports_ghosts_as_risks_and_unverified_ones_as_warnings() {
        let rows = |snap: Snapshot| -> Vec<(String, Status)> {
            doctor_checks(examine, &[snap])
                .0
                .into_iter()
                .map(|c| (c.subject, c.status))
                .collect()
        };
        assert_eq!(
            rows(host()),
            [
                ("GPU 0 PID 11".to_owned(), Status::Risk),
                ("GPU 0 PID 12".to_owned(), Status::Risk)
            ]
        );
        let mut unverified = host();
        unverified.workloads[1].container_unverified = Some("500".to_owned());
        assert_eq!(
            rows(unverified)[0],
            ("GPU 0 PID 11".to_owned(), Status::Warning)
        );
        let clean = snapshot(0, vec![gpu(0)], vec![]);
        assert_eq!(rows(clean.clone()), [("host".to_owned(), Status::Ok)]);
        let mut blind = clean;
        blind.sources.nvml = SourceState::down("no driver");
        assert!(
            rows(blind).is_empty(),
            "no NVML: no claim that there are none"
        );
    }
}
