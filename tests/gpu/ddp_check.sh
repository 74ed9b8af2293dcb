#!/usr/bin/env bash
# A distributed launch's ranks on the GPU machine (root, repository root, .device/ carried):
# two real CUDA processes started as torchrun would (RANK, LOCAL_RANK, WORLD_SIZE per process)
# in one cgroup, both on GPU 0 because neither calls set_device (the mistake doctor must name
# on any machine; with one GPU it is the only placement there is), NCCL_SOCKET_IFNAME naming an
# interface the host lacks. gpuwatch reads their environments from the real /proc and the
# driver's process list: `snapshot --json` (ranks, env) and `doctor --json` (ddp_ranks,
# nccl_environment). Evidence to $OUT.
set -uo pipefail
. tests/gpu/gate.sh
OUT=${OUT:-/tmp/gpuwatch-ddp}
mkdir -p "$OUT"
BIN=.device
CG=/sys/fs/cgroup/gpuwatch-ddp
mkdir -p "$CG"
for r in 0 1; do
  ( echo $BASHPID > "$CG/cgroup.procs"
    exec env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 NCCL_SOCKET_IFNAME=nosuch0 \
      python3 tests/gpu/torch_job.py --worker 2 --seconds 60 ) > "$OUT/rank$r.log" 2>&1 &
done
for _ in $(seq 90); do
  [ "$(cat "$OUT"/rank*.log 2>/dev/null | grep -c "worker ready")" -ge 2 ] && break
  sleep 1
done
$BIN/gpuwatch snapshot --json --no-docker --window 2 > "$OUT/snapshot.json" 2> "$OUT/snapshot.err"
$BIN/gpuwatch doctor --json --no-docker --window 3 > "$OUT/doctor.json" 2> "$OUT/doctor.err"
echo "doctor exit: $?"
# Targets: both ranks found with their own environments (LOCAL_RANK 0 and 1, WORLD_SIZE 2),
# and doctor naming the NCCL interface that does not exist.
gate ddp python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/snapshot.json"))
w = [w for w in s["workloads"] if w["name"].endswith("gpuwatch-ddp")]
print("workload:", [x["name"] for x in w])
for r in (w[0].get("ranks", []) if w else []):
    e = r.get("env") or {}
    print(f"rank pid={r['pid']} gpu={r['gpu']} mem={r['memory_bytes']>>20} MiB busy={r['busy_fraction']} "
          f"RANK={e.get('rank')} LOCAL_RANK={e.get('local_rank')} WORLD_SIZE={e.get('world_size')} "
          f"IFNAME={e.get('nccl_socket_ifname')} interfaces={e.get('interfaces')} err={r.get('env_error')}")
d = json.load(open(f"{out}/doctor.json"))
for c in d["checks"]:
    if c["check"] in ("ddp_ranks", "cuda_visible_devices", "nccl_environment"):
        print(f"{c['check']}: {c['status']} | {c['subject']} | {c['value']}")
ranks = w[0].get("ranks", []) if w else []
local = sorted((r.get("env") or {}).get("local_rank") or "" for r in ranks)
world = {(r.get("env") or {}).get("world_size") for r in ranks}
nccl = [c for c in d["checks"] if c["check"] == "nccl_environment" and c["status"] != "ok"]
sys.exit(0 if local == ["0", "1"] and world == {"2"} and nccl else 1)
PY
pkill -f torch_job.py 2>/dev/null; sleep 1; rmdir "$CG" 2>/dev/null
gates_done
