#!/usr/bin/env bash
# Stall-verdict check on the GPU machine (run from the repository root as root, with the release
# binary in .device/): a DataLoader job in a child cgroup, GPU-bound then I/O-bound; one
# gpuwatch snapshot in the middle of each phase; the verdict and input-bound share compared with
# the job's own data-wait fraction over the same window. Evidence goes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-loader}
mkdir -p "$OUT"
BIN=.device
WINDOW=${WINDOW:-15}
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
echo "+cpu +memory +io" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
CG=/sys/fs/cgroup/gpuwatch-loader
mkdir -p "$CG"

DATA=$PWD/.loader-data
mkdir -p "$DATA"
for i in $(seq 0 255); do [ -f "$DATA/$i.bin" ] || head -c 1048576 /dev/urandom > "$DATA/$i.bin"; done
sync
# Throttle the job's reads on the data's disk (the whole disk, not the partition).
src=$(df --output=source "$DATA" | tail -1)
disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1); [ -n "$disk" ] || disk=$(basename "$src")
majmin=$(cat /sys/block/$disk/dev 2>/dev/null)
echo "data on $src (disk $disk, $majmin), fs $(stat -f -c %T "$DATA")" | tee "$OUT/setup.txt"
echo "$majmin rbps=${RBPS:-20971520}" > "$CG/io.max" && echo "io.max: $(cat $CG/io.max)" | tee -a "$OUT/setup.txt"

( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/loader_job.py "$OUT/truth.json" "$DATA" ) > "$OUT/job.log" 2>&1 &
JOB=$!
snap() { # phase
  for _ in $(seq 120); do grep -q "phase $1 start" "$OUT/job.log" && break; sleep 1; done
  sleep 8
  $BIN/gpuwatch snapshot --json --no-docker --window ${WINDOW}s > "$OUT/snap_$1.json" 2> "$OUT/snap_$1.err"
  $BIN/gpuwatch snapshot --no-docker --window 3s > "$OUT/snap_$1.txt" 2>&1
}
snap gpu_bound
snap io_bound
wait $JOB
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
truth = json.load(open(f"{out}/truth.json"))
print(f"{'phase':<10} {'verdict':<18} {'gpu busy':>8} {'input-bound':>11} {'job data-wait':>13} {'diff pp':>8}")
for phase in ("gpu_bound", "io_bound"):
    s = json.load(open(f"{out}/snap_{phase}.json"))
    end = s["taken_at_unix_ms"] / 1000
    start = end - s["window_seconds"]
    wait = comp = 0.0
    for st in truth["steps"]:  # steps inside the snapshot's window
        if st["t_start"] >= start and st["t_start"] + st["data_wait_s"] + st["compute_s"] <= end:
            wait += st["data_wait_s"]; comp += st["compute_s"]
    w = next(w for w in s["workloads"] if w["id"] == "cgroup:/gpuwatch-loader")
    v = w["verdict"]
    frac = wait / (wait + comp)
    print(f"{phase:<10} {v['kind']:<18} {v['gpu_busy_fraction']:>8.3f} {v['input_bound_share']:>11.3f} {frac:>13.3f} {abs(v['input_bound_share'] - frac) * 100:>8.1f}")
    print("   loader", v["loader"], "| reads", w["stalls"]["reads"], "| disk", w["stalls"]["disk"])
    print("  ", v["advice"])
PY
