#!/usr/bin/env bash
# Real-GPU check, run on the GPU machine from the repository root with the release binaries in
# .device/ (see README "Checking on a real GPU"). Writes its evidence to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-check}
mkdir -p "$OUT"
BIN=.device
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing

# A hand-made child cgroup, as batch schedulers make: the job's workload identity.
CG=/sys/fs/cgroup/gpuwatch-job
mkdir -p "$CG"
echo "+cpu +memory" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/torch_job.py --procs 4 --seconds 240 ) > "$OUT/job.log" 2>&1 &
JOB=$!
for _ in $(seq 90); do
  n=$(grep -c "worker ready" "$OUT/job.log" 2>/dev/null || echo 0)
  [ "$n" -ge 4 ] && break
  sleep 1
done
sleep 3
echo "== job processes"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$OUT/smi.csv"
$BIN/gpuwatch snapshot --json --no-docker > "$OUT/snapshot.json" 2> "$OUT/snapshot.err"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/smi_after.csv"
echo "== gpuwatch snapshot (table)"; $BIN/gpuwatch snapshot --no-docker 2>&1 | tee "$OUT/snapshot.txt"
python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
snap = json.load(open(f"{out}/snapshot.json"))
smi = {}
for row in csv.DictReader(open(f"{out}/smi.csv"), skipinitialspace=True):
    smi[int(row["pid"])] = float(row["used_gpu_memory [MiB]"].split()[0])
print("== per-process memory: gpuwatch vs nvidia-smi")
worst = 0.0
for p in snap["gpus"][0]["processes"]:
    g = p["used_memory_bytes"] / 2**20
    s = smi.get(p["pid"])
    d = abs(g - s) / s * 100 if s else float("nan")
    worst = max(worst, d)
    print(f"pid {p['pid']:>8} {p['command'] or '?':<10} workload {p['workload']}: gpuwatch {g:.0f} MiB, nvidia-smi {s} MiB, diff {d:.3f}% state {p['state']}")
print(f"worst diff {worst:.3f}%")
for w in snap["workloads"]:
    print("workload", w["id"], "gpu MiB", w["gpu"]["memory_bytes"] / 2**20, "cpu", w["cpu"], "errors", w["errors"])
    print("  verdict", (w.get("verdict") or {}).get("kind"), "| stall processes", len((w.get("stalls") or {}).get("processes", [])))
print("sources", snap["sources"])
PY
echo "== sample cost (1 Hz)"; $BIN/sample_cost --rounds 30 2>&1 | tee "$OUT/cost.txt"
echo "== nvidia-smi per-call wall time, for comparison"
python3 - <<'PY'
import subprocess, time
for cmd in (["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"], ["nvidia-smi"]):
    ts = []
    for _ in range(5):
        t = time.perf_counter(); subprocess.run(cmd, capture_output=True); ts.append((time.perf_counter() - t) * 1e3)
    print(" ".join(cmd), f"median {sorted(ts)[2]:.1f} ms")
PY
kill $JOB 2>/dev/null; pkill -f torch_job.py; wait
