//! A distributed job in one container, on fake GPUs with real processes: each GPU process is a
//! rank with its own environment (as torchrun starts them), its GPU's busy share, the rank the
//! others wait for, and doctor's checks of the launch, read from the ranks' real
//! `/proc/<pid>/environ` and network namespace.
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

/// The container's processes below its init (the ranks), once both are up.
fn children(init: u32) -> Vec<u32> {
    let started = Instant::now();
    loop {
        let path = format!("/proc/{init}/task/{init}/children");
        let kids: Vec<u32> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if kids.len() == 2 {
            return kids;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{kids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each rank's environment: LOCAL_RANK from its own `env`, the rest from the container's.
fn rank_env(ranks: &[Value], pid: u32) -> &Value {
    &ranks.iter().find(|r| r["pid"] == pid).unwrap()["env"]
}

#[test]
fn each_gpu_process_is_a_rank_with_its_environment_and_doctor_checks_the_launch() {
    require_root();
    let c = Container::start_with(
        &unique("ddp"),
        &[],
        &[
            "-e",
            "WORLD_SIZE=2",
            "-e",
            "LOCAL_WORLD_SIZE=2",
            "-e",
            "NCCL_SOCKET_IFNAME=eth9",
            "-e",
            "NCCL_DEBUG=INFO",
        ],
        "env LOCAL_RANK=0 RANK=0 sleep 3600 & env LOCAL_RANK=1 RANK=1 sleep 3600 & wait",
    );
    let kids = children(c.pid);
    // Which child is which rank: its own environment says.
    let local_rank = |pid: u32| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        String::from_utf8_lossy(&env)
            .split('\0')
            .find_map(|v| v.strip_prefix("LOCAL_RANK=").map(str::to_owned))
            .unwrap()
    };
    let (r0, r1) = if local_rank(kids[0]) == "0" {
        (kids[0], kids[1])
    } else {
        (kids[1], kids[0])
    };
    // Rank 0 computes on GPU 0 with most SMs busy, rank 1 on GPU 1 and waits (a small context
    // on GPU 0 too, as NCCL opens one).
    let scenario = |r1_gpu: usize| {
        let mut devices = vec![
            json!({"uuid": "GPU-ddp-0", "processes": [
                {"pid": r0, "used_memory_bytes": 8 * GIB, "sm_util": 95, "sm_activity_percent": 92}]}),
            json!({"uuid": "GPU-ddp-1", "processes": []}),
        ];
        let mut ctx = vec![json!({"pid": r1, "used_memory_bytes": GIB / 4, "sm_util": 0})];
        if r1_gpu == 1 {
            devices[1]["processes"] = json!([
                {"pid": r1, "used_memory_bytes": 8 * GIB, "sm_util": 95, "sm_activity_percent": 30}]);
        } else {
            ctx = vec![json!({"pid": r1, "used_memory_bytes": 8 * GIB, "sm_util": 95})];
        }
        devices[0]["processes"].as_array_mut().unwrap().extend(ctx);
        json!({"devices": devices})
    };

    let run = snapshot(&scenario(1), &["--no-ebpf"]);
    assert!(run.status.success(), "{}", run.stderr);
    let w = workload(&run.json, &format!("docker:{}", c.id));
    let ranks = w["ranks"].as_array().unwrap_or_else(|| panic!("{w:#}"));
    let placed: Vec<(u64, u64)> = ranks
        .iter()
        .map(|r| (r["pid"].as_u64().unwrap(), r["gpu"].as_u64().unwrap()))
        .collect();
    assert_eq!(placed, [(u64::from(r0), 0), (u64::from(r1), 1)], "{w:#}");
    for (pid, local) in [(r0, "0"), (r1, "1")] {
        let env = rank_env(ranks, pid);
        assert_eq!(env["local_rank"], local, "{env:#}");
        assert_eq!(env["world_size"], "2");
        assert_eq!(env["nccl_socket_ifname"], "eth9");
        // The container's own network namespace: loopback and its veth, not the host's bridge.
        let ifaces: Vec<&str> = env["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap())
            .collect();
        assert!(
            ifaces.contains(&"lo") && !ifaces.contains(&"docker0"),
            "{env:#}"
        );
    }
    assert_eq!(ranks[0]["memory_bytes"], 8 * GIB);
    // GPU 0 is 95 % busy (rank 0 at 95, its peer's context at 0) and rank 0 holds it alone.
    let busy = ranks[0]["busy_fraction"].as_f64().unwrap();
    assert!((busy - 0.95).abs() < 0.02, "{:#}", ranks[0]);
    let s = &w["straggler"];
    assert_eq!(
        (s["pid"].as_u64(), s["gpu"].as_u64()),
        (Some(u64::from(r0)), Some(0)),
        "{w:#}"
    );
    assert_eq!(s["by"], "sm_activity", "{s:#}");

    // doctor: the launch agrees with the processes; the socket interface is not there.
    let doctor = |scenario: &Value| -> Value {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(&path, scenario.to_string()).unwrap();
        let out = gpuwatch_on(&path)
            .args(["doctor", "--json", "--window", "1", "--no-ebpf"])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let check = |report: &Value, name: &str| -> Value {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["check"] == name && x["subject"] == c.name.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no {name} for {} in {report:#}", c.name))
    };
    let report = doctor(&scenario(1));
    assert_eq!(check(&report, "ddp_ranks")["status"], "ok");
    let nccl = check(&report, "nccl_environment");
    assert_eq!(nccl["status"], "risk", "{nccl:#}");
    let ifaces = rank_env(w["ranks"].as_array().unwrap(), r0)["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        nccl["value"],
        format!("NCCL_SOCKET_IFNAME=eth9; the container has {ifaces}")
    );
    // Both ranks on GPU 0: the launch forgot LOCAL_RANK.
    let report = doctor(&scenario(0));
    let ranks = check(&report, "ddp_ranks");
    assert_eq!(ranks["status"], "risk", "{ranks:#}");
    assert!(
        ranks["value"]
            .as_str()
            .unwrap()
            .ends_with("compute on GPU 0"),
        "{ranks:#}"
    );
}
