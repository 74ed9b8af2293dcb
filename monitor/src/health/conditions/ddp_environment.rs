//! A distributed job's launch, from its ranks' environments (the checks the nvidia-smi article
//! does by hand before a DDP run): `ddp_ranks` (one GPU per rank; RANK, LOCAL_RANK and
//! LOCAL_WORLD_SIZE against the GPU processes there are), `cuda_visible_devices` (every entry
//! names a GPU the container has, and the one each rank computes on), `nccl_environment`
//! (InfiniBand off across nodes, peer-to-peer off, a socket interface the container lacks,
//! trace logging). Doctor, per container whose processes hold more than one GPU.
use crate::health::check::{Checks, Status, Window};
use crate::model::{Gpu, Rank, RankEnv, Workload};
use std::collections::BTreeMap;

pub const RANKS: &str = "ddp_ranks";
pub const VISIBLE_DEVICES: &str = "cuda_visible_devices";
pub const NCCL: &str = "nccl_environment";

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    let last = window.last();
    for w in window
        .workloads(last)
        .filter(|w| !w.ranks.is_empty() && !w.exited)
    {
        ranks(w, out);
        visible_devices(w, &last.gpus, out);
        nccl(w, out);
    }
}

fn envs(w: &Workload) -> Vec<(&Rank, &RankEnv)> {
    w.ranks
        .iter()
        .filter_map(|r| Some((r, r.env.as_deref()?)))
        .collect()
}

fn ranks(w: &Workload, out: &mut Checks) {
    let mut by_gpu: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for r in &w.ranks {
        by_gpu.entry(r.gpu).or_default().push(r.pid);
    }
    if let Some((gpu, pids)) = by_gpu.iter().find(|(_, p)| p.len() > 1) {
        let pids: Vec<String> = pids.iter().map(|p| format!("PID {p}")).collect();
        out.add(
            RANKS,
            w.name.clone(),
            Status::Risk,
            format!("{} compute on GPU {gpu}", pids.join(", ")),
            "one GPU per rank",
            "The ranks share a GPU while others idle: give each its own, \
             torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group, or \
             device=[0,1] in YOLO, not device='0,1'.",
        );
        return;
    }
    let envs = envs(w);
    if envs.is_empty() {
        let why = w
            .ranks
            .iter()
            .find_map(|r| r.env_error.clone())
            .unwrap_or_default();
        out.add(
            RANKS,
            w.name.clone(),
            Status::Warning,
            format!("environment unreadable: {why}"),
            "one GPU per rank",
            "Run gpuwatch as root (or with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH) to check \
             the launch variables.",
        );
        return;
    }
    let n = w.ranks.len() as u32;
    let local_world: Vec<u32> = envs
        .iter()
        .filter_map(|(_, e)| RankEnv::number(&e.local_world_size))
        .collect();
    let local_ranks: Vec<u32> = envs
        .iter()
        .filter_map(|(_, e)| RankEnv::number(&e.local_rank))
        .collect();
    let mut seen = local_ranks.clone();
    seen.sort_unstable();
    let duplicated = seen.windows(2).any(|p| p[0] == p[1]);
    let wrong_size = local_world.iter().find(|s| **s != n);
    let past = local_ranks
        .iter()
        .find(|r| local_world.iter().any(|s| *r >= s));
    let finding = if let Some(size) = wrong_size {
        Some(format!("{n} GPU processes, LOCAL_WORLD_SIZE={size}"))
    } else if duplicated {
        Some(format!("LOCAL_RANK repeated among {seen:?}"))
    } else {
        past.map(|r| format!("LOCAL_RANK={r} not below LOCAL_WORLD_SIZE"))
    };
    let gpus: Vec<String> = by_gpu.keys().map(u32::to_string).collect();
    match finding {
        Some(value) => out.add(
            RANKS,
            w.name.clone(),
            Status::Risk,
            value,
            "one rank per GPU process, LOCAL_RANK 0..LOCAL_WORLD_SIZE",
            "The launcher and the processes disagree: start the job with torchrun \
             --nproc_per_node=<GPUs> (it sets RANK, LOCAL_RANK and WORLD_SIZE per process) rather \
             than setting them in the container's environment.",
        ),
        None => out.add(
            RANKS,
            w.name.clone(),
            Status::Ok,
            format!("{n} ranks on GPUs {}", gpus.join(", ")),
            "one GPU per rank",
            "",
        ),
    }
}

/// The host GPUs this container's CUDA numbers 0, 1, ...: those it was given, in order, else
/// every GPU of the host.
fn container_gpus<'a>(w: &Workload, gpus: &'a [Gpu]) -> Vec<&'a Gpu> {
    let given: Option<Vec<u32>> = w
        .config
        .as_ref()
        .and_then(|c| c.gpus.as_ref())
        .map(|a| a.gpus.iter().map(|g| g.index).collect());
    match given {
        Some(ids) if !ids.is_empty() => gpus
            .iter()
            .filter(|g| ids.contains(&g.device.index))
            .collect(),
        _ => gpus.iter().collect(),
    }
}

/// The host GPU an entry of CUDA_VISIBLE_DEVICES names: an index into `seen`, or a UUID (CUDA
/// takes a unique prefix).
fn resolve(entry: &str, seen: &[&Gpu]) -> Option<u32> {
    let entry = entry.trim();
    if let Ok(i) = entry.parse::<usize>() {
        return seen.get(i).map(|g| g.device.index);
    }
    let matching: Vec<u32> = seen
        .iter()
        .filter(|g| {
            g.device
                .uuid
                .as_deref()
                .is_some_and(|u| u.starts_with(entry))
        })
        .map(|g| g.device.index)
        .collect();
    (matching.len() == 1).then(|| matching[0])
}

fn visible_devices(w: &Workload, gpus: &[Gpu], out: &mut Checks) {
    let seen = container_gpus(w, gpus);
    let mut finding: Option<(Status, String)> = None;
    let mut set = 0;
    for (r, e) in envs(w) {
        let Some(list) = e.cuda_visible_devices.as_deref() else {
            continue;
        };
        set += 1;
        let entries: Vec<&str> = list.split(',').filter(|s| !s.trim().is_empty()).collect();
        let resolved: Vec<Option<u32>> = entries.iter().map(|e| resolve(e, &seen)).collect();
        if let Some(bad) = entries.iter().zip(&resolved).find(|(_, g)| g.is_none()) {
            finding = Some((
                Status::Risk,
                format!(
                    "PID {}: CUDA_VISIBLE_DEVICES={list}: {} names no GPU of the {} it has",
                    r.pid,
                    bad.0,
                    seen.len()
                ),
            ));
            break;
        }
        if !resolved.contains(&Some(r.gpu)) && finding.is_none() {
            finding = Some((
                Status::Warning,
                format!(
                    "PID {} computes on GPU {}, which its CUDA_VISIBLE_DEVICES={list} does not name",
                    r.pid, r.gpu
                ),
            ));
        }
    }
    if set == 0 {
        return;
    }
    let (status, value) =
        finding.unwrap_or((Status::Ok, format!("{set} ranks, each names its GPU")));
    out.add(
        VISIBLE_DEVICES,
        w.name.clone(),
        status,
        value,
        "entries name GPUs of the container, each rank's among them",
        "CUDA stops at the first entry that names no GPU and numbers the rest from 0: list the \
         container's GPUs (0..N-1 inside it, or their UUIDs), or leave the variable unset and \
         let --gpus choose.",
    );
}

/// Whether NCCL_SOCKET_IFNAME (`eth`, `=eth0`, `^docker,lo`: prefixes, exact names, or those
/// to avoid) leaves NCCL an interface among `interfaces`.
fn ifname_matches(spec: &str, interfaces: &[String]) -> bool {
    let (exclude, exact, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest.starts_with('='), rest.trim_start_matches('=')),
        None => (false, spec.starts_with('='), spec.trim_start_matches('=')),
    };
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    let hit = |i: &String| {
        names
            .iter()
            .any(|n| if exact { i == n } else { i.starts_with(n) })
    };
    if exclude {
        interfaces.iter().any(|i| !hit(i) && i != "lo")
    } else {
        interfaces.iter().any(hit)
    }
}

fn nccl(w: &Workload, out: &mut Checks) {
    let envs = envs(w);
    let Some((_, e)) = envs.first() else {
        return;
    };
    let n = w.ranks.len() as u32;
    let world = RankEnv::number(&e.world_size);
    let local = RankEnv::number(&e.local_world_size).unwrap_or(n);
    let multi_node = world.is_some_and(|s| s > local);
    let on = |v: &Option<String>| v.as_deref().is_some_and(|v| v.trim() == "1");
    let (status, value, action) = if multi_node && on(&e.nccl_ib_disable) {
        (
            Status::Risk,
            format!(
                "NCCL_IB_DISABLE=1 with WORLD_SIZE={} across nodes",
                world.unwrap_or(0)
            ),
            "Across nodes NCCL falls back to TCP sockets with InfiniBand off: set \
             NCCL_IB_DISABLE=0 (it may stay 1 on a single node).",
        )
    } else if let Some((spec, ifaces)) = envs.iter().find_map(|(_, e)| {
        let spec = e.nccl_socket_ifname.as_deref()?;
        (!e.interfaces.is_empty() && !ifname_matches(spec, &e.interfaces))
            .then(|| (spec, e.interfaces.join(", ")))
    }) {
        (
            Status::Risk,
            format!("NCCL_SOCKET_IFNAME={spec}; the container has {ifaces}"),
            "NCCL finds no interface to bootstrap on and the job hangs at init: name one the \
             container has (see `ip link` inside it), or unset the variable.",
        )
    } else if on(&e.nccl_p2p_disable) {
        (
            Status::Warning,
            "NCCL_P2P_DISABLE=1".to_owned(),
            "GPU-to-GPU copies go through host memory: unset it unless a P2P fault is being \
             worked around.",
        )
    } else if e
        .nccl_debug
        .as_deref()
        .is_some_and(|d| d.eq_ignore_ascii_case("TRACE"))
    {
        (
            Status::Warning,
            "NCCL_DEBUG=TRACE".to_owned(),
            "Trace logging costs time in every collective: NCCL_DEBUG=WARN once the job runs.",
        )
    } else {
        let shown: Vec<String> = [
            ("NCCL_DEBUG", &e.nccl_debug),
            ("NCCL_IB_DISABLE", &e.nccl_ib_disable),
            ("NCCL_P2P_DISABLE", &e.nccl_p2p_disable),
            ("NCCL_SOCKET_IFNAME", &e.nccl_socket_ifname),
        ]
        .iter()
        .filter_map(|(k, v)| Some(format!("{k}={}", v.as_deref()?)))
        .collect();
        let value = if shown.is_empty() {
            "NCCL defaults".to_owned()
        } else {
            shown.join(" ")
        };
        (Status::Ok, value, "")
    };
    out.add(
        NCCL,
        w.name.clone(),
        status,
        value,
        "InfiniBand on across nodes, P2P on, an interface NCCL can use",
        action,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_checks;
    use crate::model::test_support::{container, gpu, snapshot};

    fn rank(pid: u32, gpu: u32, env: &[(&str, &str)]) -> Rank {
        let mut environ = Vec::new();
        for (k, v) in env {
            environ.extend(format!("{k}={v}\0").bytes());
        }
        let mut env = RankEnv::from_environ(&environ);
        env.interfaces = vec!["lo".into(), "eth0".into()];
        Rank {
            pid,
            gpu,
            memory_bytes: 1 << 30,
            busy_fraction: None,
            sm_activity_percent: None,
            env: Some(std::sync::Arc::new(env)),
            env_error: None,
        }
    }

    fn checks(ranks: Vec<Rank>) -> BTreeMap<&'static str, (Status, String)> {
        let mut w = container("ddp");
        w.ranks = ranks;
        let snap = snapshot(0, vec![gpu(0), gpu(1)], vec![w]);
        doctor_checks(examine, &[snap])
            .0
            .into_iter()
            .map(|c| (c.check, (c.status, c.value)))
            .collect()
    }

    fn torchrun(local: &str, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("LOCAL_RANK", local.to_owned()),
            ("RANK", local.to_owned()),
            ("WORLD_SIZE", "2".to_owned()),
            ("LOCAL_WORLD_SIZE", "2".to_owned()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    }

    fn ranked(pid: u32, gpu: u32, env: &[(&'static str, String)]) -> Rank {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        rank(pid, gpu, &env)
    }

    #[test]
    fn a_well_launched_job_passes() {
        let c = checks(vec![
            ranked(10, 0, &torchrun("0", &[("CUDA_VISIBLE_DEVICES", "0,1")])),
            ranked(11, 1, &torchrun("1", &[("CUDA_VISIBLE_DEVICES", "0,1")])),
        ]);
        assert_eq!(c[RANKS], (Status::Ok, "2 ranks on GPUs 0, 1".to_owned()));
        assert_eq!(c[VISIBLE_DEVICES].0, Status::Ok);
        assert_eq!(c[NCCL], (Status::Ok, "NCCL defaults".to_owned()));
    }

    #[test]
    fn ranks_on_one_gpu_or_a_launch_that_disagrees_are_risks() {
        let c = checks(vec![
            ranked(10, 0, &torchrun("0", &[])),
            ranked(11, 0, &torchrun("1", &[])),
        ]);
        assert_eq!(
            c[RANKS],
            (Status::Risk, "PID 10, PID 11 compute on GPU 0".to_owned())
        );
        let c = checks(vec![
            rank(10, 0, &[("LOCAL_WORLD_SIZE", "4"), ("LOCAL_RANK", "0")]),
            rank(11, 1, &[("LOCAL_WORLD_SIZE", "4"), ("LOCAL_RANK", "1")]),
        ]);
        assert_eq!(
            c[RANKS],
            (
                Status::Risk,
                "2 GPU processes, LOCAL_WORLD_SIZE=4".to_owned()
            )
        );
        let c = checks(vec![
            rank(10, 0, &[("LOCAL_RANK", "0")]),
            rank(11, 1, &[("LOCAL_RANK", "0")]),
        ]);
        assert_eq!(c[RANKS].0, Status::Risk, "{:?}", c[RANKS]);
        let mut blind = rank(10, 0, &[]);
        blind.env = None;
        blind.env_error = Some("reading /proc/10/environ: permission denied".into());
        let mut other = blind.clone();
        other.pid = 11;
        other.gpu = 1;
        let c = checks(vec![blind, other]);
        assert_eq!(c[RANKS].0, Status::Warning);
        assert!(c[RANKS].1.contains("permission denied"), "{:?}", c[RANKS]);
    }

    #[test]
    fn visible_devices_must_name_the_containers_gpus() {
        let c = checks(vec![
            ranked(10, 0, &torchrun("0", &[("CUDA_VISIBLE_DEVICES", "0,3")])),
            ranked(11, 1, &torchrun("1", &[("CUDA_VISIBLE_DEVICES", "0,3")])),
        ]);
        assert_eq!(c[VISIBLE_DEVICES].0, Status::Risk);
        assert!(
            c[VISIBLE_DEVICES].1.contains("3 names no GPU of the 2"),
            "{:?}",
            c[VISIBLE_DEVICES]
        );
        // By UUID (a prefix is enough); rank 11 is not on the GPU it names.
        let c = checks(vec![
            ranked(
                10,
                0,
                &torchrun("0", &[("CUDA_VISIBLE_DEVICES", "GPU-00000000")]),
            ),
            ranked(
                11,
                1,
                &torchrun("1", &[("CUDA_VISIBLE_DEVICES", "GPU-0000000")]),
            ),
        ]);
        assert_eq!(
            c[VISIBLE_DEVICES].0,
            Status::Risk,
            "an ambiguous prefix names no GPU"
        );
        let c = checks(vec![
            ranked(
                10,
                0,
                &torchrun("0", &[("CUDA_VISIBLE_DEVICES", "GPU-00000000")]),
            ),
            ranked(
                11,
                1,
                &torchrun("1", &[("CUDA_VISIBLE_DEVICES", "GPU-00000000")]),
            ),
        ]);
        assert_eq!(c[VISIBLE_DEVICES].0, Status::Warning);
        assert!(
            c[VISIBLE_DEVICES].1.starts_with("PID 11 computes on GPU 1"),
            "{:?}",
            c[VISIBLE_DEVICES]
        );
        // Unset everywhere: no row.
        let c = checks(vec![
            ranked(10, 0, &torchrun("0", &[])),
            ranked(11, 1, &torchrun("1", &[])),
        ]);
        assert!(!c.contains_key(VISIBLE_DEVICES));
    }

    #[test]
    fn nccl_settings_that_break_or_slow_a_job() {
        let job = |extra: &[(&'static str, &str)], world: &str| {
            let mut a = torchrun("0", extra);
            let mut b = torchrun("1", extra);
            for env in [&mut a, &mut b] {
                env.retain(|(k, _)| *k != "WORLD_SIZE");
                env.push(("WORLD_SIZE", world.to_owned()));
            }
            checks(vec![ranked(10, 0, &a), ranked(11, 1, &b)])[NCCL].clone()
        };
        assert_eq!(
            job(&[("NCCL_IB_DISABLE", "1")], "2").0,
            Status::Ok,
            "one node: allowed"
        );
        assert_eq!(job(&[("NCCL_IB_DISABLE", "1")], "8").0, Status::Risk);
        let (s, v) = job(&[("NCCL_SOCKET_IFNAME", "eth9")], "2");
        assert_eq!(
            (s, v.as_str()),
            (
                Status::Risk,
                "NCCL_SOCKET_IFNAME=eth9; the container has lo, eth0"
            )
        );
        assert_eq!(
            job(&[("NCCL_SOCKET_IFNAME", "eth")], "2").0,
            Status::Ok,
            "a prefix"
        );
        assert_eq!(
            job(&[("NCCL_SOCKET_IFNAME", "=eth")], "2").0,
            Status::Risk,
            "exact"
        );
        assert_eq!(job(&[("NCCL_SOCKET_IFNAME", "^docker")], "2").0, Status::Ok);
        assert_eq!(
            job(&[("NCCL_SOCKET_IFNAME", "^eth")], "2").0,
            Status::Risk,
            "only lo left"
        );
        assert_eq!(job(&[("NCCL_P2P_DISABLE", "1")], "2").0, Status::Warning);
        assert_eq!(job(&[("NCCL_DEBUG", "TRACE")], "2").0, Status::Warning);
        assert_eq!(
            job(&[("NCCL_DEBUG", "INFO")], "2"),
            (Status::Ok, "NCCL_DEBUG=INFO".to_owned())
        );
    }
}
