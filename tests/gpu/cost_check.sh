#!/usr/bin/env bash
# The agent's cost on a GPU machine, from the repository root with .device/ carried:
# `xtask bench-vs-nvitop` (gpuwatch beside nvitop; BENCH_ARGS=--no-ebpf-too adds gpuwatch without
# eBPF), then under a 4-process CUDA load in one cgroup each NVML call's wall and CPU time, a
# full round's CPU and a snapshot's peak RSS. Evidence to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-cost}
mkdir -p "$OUT"
BIN=.device
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"

echo "== bench-vs-nvitop"
$BIN/xtask bench-vs-nvitop --seconds "${SECONDS_EACH:-28}" --warmup "${WARMUP:-8}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"

CG=/sys/fs/cgroup/gpuwatch-cost
mkdir -p "$CG"
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/torch_job.py --procs 4 --seconds 90 ) > "$OUT/job.log" 2>&1 &
JOB=$!
for _ in $(seq 90); do
  [ "$(grep -c "worker ready" "$OUT/job.log" 2>/dev/null)" -ge 4 ] && break
  sleep 1
done
sleep 3
echo "== per call, under load"; $BIN/sample_cost --per-call --rounds 20 --interval-ms 250 2>&1 | tee "$OUT/per_call.txt"
echo "== rounds, under load"; $BIN/sample_cost --rounds 20 2>&1 | tee "$OUT/rounds.txt"
echo "== peak RSS, snapshot"
$BIN/gpuwatch snapshot --no-docker --json > "$OUT/snapshot.json" 2> "$OUT/snapshot.err" &
SNAP=$!
hwm=0
while kill -0 $SNAP 2>/dev/null; do
  h=$(awk '/VmHWM/ {print $2}' /proc/$SNAP/status 2>/dev/null); [ -n "$h" ] && hwm=$h
  sleep 0.05
done
echo "snapshot VmHWM ${hwm} kB" | tee "$OUT/snapshot_hwm.txt"
kill $JOB 2>/dev/null; wait $JOB 2>/dev/null
pkill -f torch_job 2>/dev/null; sleep 2
