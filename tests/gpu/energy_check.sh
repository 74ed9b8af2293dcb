#!/usr/bin/env bash
# Energy per workload against the GPU's energy counter (GPU host, root, repository root, the
# release binary in .device/ or BIN=). A duty_job.py in a child cgroup of its own holds the GPU
# 10 s idle, 15 s at 50 % duty, 10 s full, 5 s idle again, while `gpuwatch record --no-docker`
# writes a row a second and energy_counter.py reads the driver's counter every 100 ms; then
# score_energy.py. Exits 1 when the GPU's or the job's joules are more than 1 % off.
set -uo pipefail
. tests/gpu/gate.sh
OUT=${OUT:-/tmp/gpuwatch-energy}
BIN=${BIN:-.device}
mkdir -p "$OUT/jobs"
echo "+cpu +memory +io" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
CG=/sys/fs/cgroup/gw-energy
mkdir -p "$CG"
python3 tests/gpu/energy_counter.py "$OUT/counter.txt" & CTR=$!
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/duty_job.py "$OUT/jobs" e ) > "$OUT/job.log" 2>&1 &
for _ in $(seq 600); do [ -f "$OUT/jobs/e.ready" ] && break; sleep 0.1; done
"$BIN/gpuwatch" record --no-docker --format jsonl --interval 1s -o "$OUT/energy.jsonl" 2> "$OUT/record.err" & REC=$!
run() { # mode duty seconds tag
  echo "$1 $2 $3 $4" > "$OUT/jobs/e.cmd"
  for _ in $(seq 1200); do [ -f "$OUT/jobs/e.$4.json" ] && break; sleep 0.1; done
}
sleep 10
run matmul 0.5 15 half
run matmul 1.0 10 full
sleep 5
kill -INT $REC; wait $REC
echo quit > "$OUT/jobs/e.cmd"
sleep 1
kill $CTR
rmdir "$CG" 2>/dev/null
gate energy python3 tests/gpu/score_energy.py "$OUT" gw-energy
gates_done
