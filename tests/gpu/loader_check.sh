#!/usr/bin/env bash
# Stall-verdict check on the GPU machine (run from the repository root as root, with the release
# binary in .device/): a DataLoader job in a child cgroup, GPU-bound, I/O-bound, then CPU-bound;
# one gpuwatch snapshot in the middle of each phase; the verdict and input-bound share compared
# with the job's own data-wait fraction over the same window. Evidence goes to $OUT.
set -uo pipefail
. tests/gpu/gate.sh
OUT=${OUT:-/tmp/gpuwatch-loader}
mkdir -p "$OUT"
BIN=.device
WINDOW=${WINDOW:-12}
export PHASE_S=${PHASE_S:-24}
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
echo "+cpu +memory +io" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
CG=/sys/fs/cgroup/gpuwatch-loader
mkdir -p "$CG"

. tests/gpu/loader_data.sh  # DATA, MAJMIN
echo "$MAJMIN rbps=${RBPS:-20971520}" > "$CG/io.max" && echo "io.max: $(cat $CG/io.max)" | tee -a "$OUT/setup.txt"

( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/loader_job.py "$OUT/truth.json" "$DATA" ) > "$OUT/job.log" 2>&1 &
JOB=$!
snap() { # phase
  for _ in $(seq 150); do grep -q "phase $1 start" "$OUT/job.log" && break; sleep 1; done
  sleep 6
  $BIN/gpuwatch snapshot --json --no-docker --window ${WINDOW}s > "$OUT/snap_$1.json" 2> "$OUT/snap_$1.err"
}
snap gpu_bound
snap io_bound
snap cpu_bound
wait $JOB
gate loader-verdicts python3 tests/gpu/compare_verdicts.py "$OUT" cgroup:/gpuwatch-loader gpu_bound io_bound cpu_bound
gates_done
