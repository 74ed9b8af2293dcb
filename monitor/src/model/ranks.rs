//! The ranks of a distributed job: a workload whose processes hold more than one GPU gets one
//! entry per GPU process, with the GPU it computes on, its share of that GPU, and what its
//! environment says of the launch (the variables the nvidia-smi article checks by hand before
//! a DDP run). Which rank the others wait for is the analysis's (`straggler`).
use serde::Serialize;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rank {
    pub pid: u32,
    /// The GPU it computes on: the one where it holds the most memory (a rank also opens small
    /// contexts on its peers' GPUs).
    pub gpu: u32,
    /// Its memory on that GPU.
    pub memory_bytes: u64,
    /// The share of the window its GPU was busy, when no other rank of the job computes on the
    /// same GPU; `None` in the first round or when that share is unknown.
    pub busy_fraction: Option<f64>,
    /// GPM: of the SMs, the share busy while its GPU ran kernels (percent).
    pub sm_activity_percent: Option<f64>,
    /// Its launch environment, from `/proc/<pid>/environ` (read once per process, shared by
    /// every round's copy); `None` when that could not be read (`env_error` says why).
    pub env: Option<Arc<RankEnv>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_error: Option<Arc<str>>,
}

/// The variables of a rank's environment that bear on a distributed launch, as written (`None`
/// when unset), and the network interfaces of its network namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankEnv {
    pub rank: Option<String>,
    pub local_rank: Option<String>,
    pub world_size: Option<String>,
    pub local_world_size: Option<String>,
    pub cuda_visible_devices: Option<String>,
    pub nccl_debug: Option<String>,
    pub nccl_p2p_disable: Option<String>,
    pub nccl_ib_disable: Option<String>,
    pub nccl_socket_ifname: Option<String>,
    /// The interfaces `/proc/<pid>/net/dev` lists (what NCCL_SOCKET_IFNAME must name).
    pub interfaces: Vec<String>,
}

impl RankEnv {
    /// The variables above from an `environ` file's bytes (NUL-separated `KEY=value`; the last
    /// assignment of a key wins, as `getenv` finds it).
    pub fn from_environ(environ: &[u8]) -> Self {
        let mut env = Self::default();
        for entry in environ.split(|b| *b == 0) {
            let entry = String::from_utf8_lossy(entry);
            let Some((key, value)) = entry.split_once('=') else {
                continue;
            };
            let slot = match key {
                "RANK" => &mut env.rank,
                "LOCAL_RANK" => &mut env.local_rank,
                "WORLD_SIZE" => &mut env.world_size,
                "LOCAL_WORLD_SIZE" => &mut env.local_world_size,
                "CUDA_VISIBLE_DEVICES" => &mut env.cuda_visible_devices,
                "NCCL_DEBUG" => &mut env.nccl_debug,
                "NCCL_P2P_DISABLE" => &mut env.nccl_p2p_disable,
                "NCCL_IB_DISABLE" => &mut env.nccl_ib_disable,
                "NCCL_SOCKET_IFNAME" => &mut env.nccl_socket_ifname,
                _ => continue,
            };
            *slot = Some(value.to_owned());
        }
        env
    }

    /// A variable as a number (`None` unset or not one).
    pub fn number(value: &Option<String>) -> Option<u32> {
        value.as_deref()?.trim().parse().ok()
    }
}

/// The rank the others wait for, when the ranks' figures spread apart.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Straggler {
    pub pid: u32,
    pub gpu: u32,
    /// What it was told by: GPM's SM activity where every rank's GPU has it (a collective the
    /// others wait in keeps their GPU "busy" with few SMs), else the busy share.
    pub by: StragglerBasis,
    /// The spread between the highest and the lowest rank, in points (percent).
    pub spread_points: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StragglerBasis {
    SmActivity,
    Busy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environ_gives_the_launch_variables_and_nothing_else() {
        let environ = b"PATH=/usr/bin\0RANK=1\0LOCAL_RANK=1\0WORLD_SIZE=2\0NCCL_DEBUG=INFO\0\
                        NCCL_SOCKET_IFNAME==eth0\0CUDA_VISIBLE_DEVICES=0,1\0RANK=3\0broken\0\xff=x\0";
        let env = RankEnv::from_environ(environ);
        assert_eq!(env.rank.as_deref(), Some("3"), "the last assignment wins");
        assert_eq!(env.local_rank.as_deref(), Some("1"));
        assert_eq!(RankEnv::number(&env.world_size), Some(2));
        assert_eq!(env.nccl_socket_ifname.as_deref(), Some("=eth0"));
        assert_eq!(env.cuda_visible_devices.as_deref(), Some("0,1"));
        assert_eq!(env.nccl_ib_disable, None);
        assert_eq!(RankEnv::number(&Some("x".into())), None);
    }
}
