//! The ranks of a workload whose processes hold more than one GPU: each GPU process, the GPU it
//! computes on, and its launch environment (`/proc/<pid>/environ`, and the interfaces of its
//! network namespace from `/proc/<pid>/net/dev`), read once per process and kept while it
//! lives. The ranks' busy shares are filled in when the round is completed.
use crate::model::{Gpu, Rank, RankEnv, Workload};
use crate::sources::host::HostReader;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A rank's environment as read: shared, since every round's copy of the rank carries it.
type Read = Result<Arc<RankEnv>, Arc<str>>;

/// Each rank's environment, by (pid, start time): a process's launch environment does not
/// change after it starts. Entries not asked for in a round are forgotten at its end.
pub struct RankEnvs {
    host: HostReader,
    known: HashMap<(u32, Option<u64>), (Read, u64)>,
    round: u64,
}

impl RankEnvs {
    pub fn new(host: HostReader) -> Self {
        Self {
            host,
            known: HashMap::new(),
            round: 0,
        }
    }

    /// The ranks of `w` in this round's `gpus`: its GPU processes when they hold two GPUs or
    /// more, or when two or more of them on one GPU were launched as ranks (RANK, LOCAL_RANK or
    /// WORLD_SIZE in their environment: the ranks of a job that forgot to give each its GPU).
    pub fn ranks(&mut self, w: &Workload, gpus: &[Gpu]) -> Vec<Rank> {
        if w.gpu.per_gpu.len() < 2 && w.gpu.processes < 2 {
            return Vec::new();
        }
        // (pid, GPU, start time, memory there) of each of its GPU processes, summed per pid and
        // GPU, then the GPU with the most memory per pid (the lowest index on a tie).
        let mut held: Vec<(u32, u32, Option<u64>, u64)> = gpus
            .iter()
            .flat_map(|g| {
                g.processes
                    .iter()
                    .filter(|p| p.workload.as_ref() == Some(&w.id))
                    .map(move |p| {
                        let memory = p.reading.used_memory_bytes.unwrap_or(0);
                        (p.reading.pid, g.device.index, p.start_time_ticks, memory)
                    })
            })
            .collect();
        held.sort_unstable_by_key(|h| (h.0, h.1));
        held.dedup_by(|later, kept| {
            let same = later.0 == kept.0 && later.1 == kept.1;
            if same {
                kept.3 += later.3;
            }
            same
        });
        held.sort_by_key(|&(pid, gpu, _, memory)| (pid, std::cmp::Reverse(memory), gpu));
        held.dedup_by_key(|h| h.0);
        let round = self.round;
        let mut ranks: Vec<Rank> = held
            .into_iter()
            .map(|(pid, gpu, start, memory_bytes)| {
                let (read, seen) = self.known.entry((pid, start)).or_insert_with(|| {
                    let env = self.host.launch_env(pid);
                    (env.map(Arc::new).map_err(|e| e.to_string().into()), round)
                });
                *seen = round;
                let (env, env_error) = match read {
                    Ok(e) => (Some(e.clone()), None),
                    Err(why) => (None, Some(why.clone())),
                };
                Rank {
                    pid,
                    gpu,
                    memory_bytes,
                    busy_fraction: None,
                    sm_activity_percent: None,
                    env,
                    env_error,
                }
            })
            .collect();
        let launched = |r: &Rank| {
            r.env.as_ref().is_some_and(|e| {
                e.rank.is_some() || e.local_rank.is_some() || e.world_size.is_some()
            })
        };
        if w.gpu.per_gpu.len() < 2 && ranks.iter().filter(|r| launched(r)).count() < 2 {
            return Vec::new();
        }
        ranks.sort_by_key(|r| (r.gpu, r.pid));
        ranks
    }

    /// Ends a round: forgets the processes no workload asked about in it.
    pub fn end_round(&mut self) {
        let round = self.round;
        self.known.retain(|_, (_, seen)| *seen == round);
        self.round += 1;
    }
}

/// Fills each rank's busy share and SM activity from its workload's share of its GPU, where no
/// other rank of the workload computes on that GPU.
pub fn finish(w: &mut Workload) {
    let per_gpu = &w.gpu.per_gpu;
    let counts: BTreeMap<u32, usize> = w.ranks.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.gpu).or_default() += 1;
        m
    });
    for r in &mut w.ranks {
        let alone = counts.get(&r.gpu) == Some(&1);
        let share = per_gpu.iter().find(|s| s.index == r.gpu).filter(|_| alone);
        r.busy_fraction = share.and_then(|s| s.busy_fraction);
        r.sm_activity_percent = share.and_then(|s| s.sm_activity_percent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, process};
    use crate::model::WorkloadGpuShare;
    use crate::sources::host::fake_proc::FakeProc;

    fn fake_proc(root: &FakeProc, pid: u32, environ: &[u8]) {
        root.write(format!("{pid}/environ"), environ);
        root.write(
            format!("{pid}/net/dev"),
            "Inter-|   Receive\n face |bytes\n    lo: 1 2 3\n  eth0: 4 5 6\n",
        );
    }

    #[test]
    fn each_gpu_process_is_a_rank_on_the_gpu_it_holds_most_of() {
        let root = FakeProc::new();
        fake_proc(&root, 10, b"LOCAL_RANK=0\0WORLD_SIZE=2\0");
        fake_proc(&root, 11, b"LOCAL_RANK=1\0WORLD_SIZE=2\0");
        let mut w = container("ddp");
        let (mut g0, mut g1) = (gpu(0), gpu(1));
        // Rank 1 also opens a small context on GPU 0, as NCCL does.
        g0.processes = vec![
            process(10, Some(&w.id), 8 << 30),
            process(11, Some(&w.id), 1 << 28),
        ];
        g1.processes = vec![process(11, Some(&w.id), 8 << 30)];
        w.gpu.per_gpu = vec![
            WorkloadGpuShare::new(0, None),
            WorkloadGpuShare::new(1, None),
        ];
        let mut envs = RankEnvs::new(HostReader::new(root.path()));
        let ranks = envs.ranks(&w, &[g0.clone(), g1.clone()]);
        let placed: Vec<_> = ranks
            .iter()
            .map(|r| (r.pid, r.gpu, r.memory_bytes))
            .collect();
        assert_eq!(placed, [(10, 0, 8 << 30), (11, 1, 8 << 30)]);
        let env = ranks[1].env.as_ref().unwrap();
        assert_eq!(env.local_rank.as_deref(), Some("1"));
        assert_eq!(env.interfaces, ["lo", "eth0"]);
        // Both on one GPU: ranks, since their environments say they were launched as ranks...
        let mut single = w.clone();
        single.gpu.per_gpu.truncate(1);
        single.gpu.processes = 2;
        let shared = envs.ranks(&single, &[g0.clone()]);
        assert_eq!(shared.iter().map(|r| r.gpu).collect::<Vec<_>>(), [0, 0]);
        // ...and not two processes of some other job sharing one.
        fake_proc(&root, 12, b"PATH=/bin\0");
        fake_proc(&root, 13, b"PATH=/bin\0");
        let mut g = gpu(0);
        g.processes = vec![
            process(12, Some(&w.id), 1 << 30),
            process(13, Some(&w.id), 1 << 30),
        ];
        assert!(envs.ranks(&single, &[g]).is_empty());
        // An environment that cannot be read says why.
        root.remove("10/environ");
        envs.end_round();
        envs.end_round();
        let ranks = envs.ranks(&w, &[g0, g1]);
        assert!(ranks[0].env.is_none());
        assert!(
            ranks[0]
                .env_error
                .as_deref()
                .unwrap()
                .contains("10/environ"),
            "{ranks:?}"
        );
    }

    #[test]
    fn a_rank_gets_its_gpus_busy_share_unless_another_rank_computes_there() {
        let mut w = container("ddp");
        let share = |i, busy| WorkloadGpuShare {
            busy_fraction: Some(busy),
            sm_activity_percent: Some(busy * 100.0),
            ..WorkloadGpuShare::new(i, None)
        };
        w.gpu.per_gpu = vec![share(0, 0.9), share(1, 0.4)];
        let rank = |pid, gpu| Rank {
            pid,
            gpu,
            memory_bytes: 0,
            busy_fraction: None,
            sm_activity_percent: None,
            env: None,
            env_error: None,
        };
        w.ranks = vec![rank(10, 0), rank(11, 1)];
        finish(&mut w);
        assert_eq!(w.ranks[0].busy_fraction, Some(0.9));
        assert_eq!(w.ranks[1].sm_activity_percent, Some(40.0));
        w.ranks = vec![rank(10, 0), rank(11, 0)];
        finish(&mut w);
        assert_eq!(
            w.ranks[0].busy_fraction, None,
            "two ranks on one GPU: neither is known"
        );
    }
}
