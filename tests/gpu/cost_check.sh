#!/usr/bin/env bash
# The agent's cost on a GPU machine, from the repository root with .device/ carried:
# `xtask bench-vs-nvitop` (gpuwatch as users run it beside nvitop, with Docker started from the
# bundle; BENCH_ARGS=--no-ebpf-too adds gpuwatch without eBPF, "--also-interval 5s" serve at
# 5-s rounds), then under a 4-process CUDA load
# in one cgroup: where `serve` spends its CPU under a 1-s scrape (perf, where the machine has
# it; GPUWATCH: a binary that keeps its symbol table) and, from its own counter, by step of a
# round (tests/gpu/sampling_steps.py), each NVML call's wall and CPU time, a full
# round's CPU and a snapshot's peak RSS (where sample_cost was carried). Evidence to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-cost}
mkdir -p "$OUT"
BIN=.device
GPUWATCH=${GPUWATCH:-$BIN/gpuwatch}
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
# The user's default configuration has Docker on: start the carried engine.
source tests/gpu/docker_up.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"

echo "== bench-vs-nvitop"
$BIN/xtask bench-vs-nvitop --gpuwatch "$GPUWATCH" --seconds "${SECONDS_EACH:-28}" --warmup "${WARMUP:-8}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"

CG=/sys/fs/cgroup/gpuwatch-cost
mkdir -p "$CG"
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/torch_job.py --procs 4 --seconds 90 ) > "$OUT/job.log" 2>&1 &
JOB=$!
for _ in $(seq 90); do
  [ "$(grep -c "worker ready" "$OUT/job.log" 2>/dev/null)" -ge 4 ] && break
  sleep 1
done
sleep 3
echo "== steps: where serve's sampling thread spends its CPU (Docker on, scraped every 15 s)"
"$GPUWATCH" serve --interval 1s --web.listen-address 127.0.0.1:19877 2> "$OUT/serve_steps.log" &
SERVE=$!
sleep 12
python3 tests/gpu/sampling_steps.py $SERVE http://127.0.0.1:19877/metrics 30 2>&1 | tee "$OUT/steps.txt"
echo "== memory: serve's resident memory by mapping, in the steady state"
python3 tests/gpu/memory_map.py $SERVE 2>&1 | tee "$OUT/memory_map.txt"
kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
if command -v perf >/dev/null; then
  echo "== profile: serve, Docker on, scraped every second"
  "$GPUWATCH" serve --interval 1s --web.listen-address 127.0.0.1:19878 2> "$OUT/serve.log" &
  SERVE=$!
  ( for _ in $(seq 40); do sleep 1; python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:19878/metrics").read()' 2>/dev/null; done ) &
  SCRAPE=$!
  sleep 10
  perf record -F 2999 -g --call-graph dwarf,16384 -p $SERVE -o "$OUT/perf.data" -- sleep 25 > "$OUT/perf_record.txt" 2>&1
  kill $SERVE $SCRAPE 2>/dev/null; wait $SERVE $SCRAPE 2>/dev/null
  perf report -i "$OUT/perf.data" --sort comm --stdio 2>/dev/null | grep '%' | head -20 > "$OUT/profile_threads.txt"
  perf report -i "$OUT/perf.data" --children --sort sym --stdio -g none 2>/dev/null | grep '%' | cut -c1-220 | head -150 > "$OUT/profile_children.txt"
  perf report -i "$OUT/perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep '%' | cut -c1-220 | head -80 > "$OUT/profile_self.txt"
  rm -f "$OUT/perf.data"
  head -20 "$OUT/profile_threads.txt"; head -40 "$OUT/profile_self.txt"
else
  echo "== no perf on this machine: no profile"
fi
if [ -x $BIN/sample_cost ]; then
  echo "== per call, under load"; $BIN/sample_cost --per-call --rounds 20 --interval-ms 250 2>&1 | tee "$OUT/per_call.txt"
  echo "== rounds, under load"; $BIN/sample_cost --rounds 20 2>&1 | tee "$OUT/rounds.txt"
fi
echo "== peak RSS, snapshot"
"$GPUWATCH" snapshot --no-docker --json > "$OUT/snapshot.json" 2> "$OUT/snapshot.err" &
SNAP=$!
hwm=0
while kill -0 $SNAP 2>/dev/null; do
  h=$(awk '/VmHWM/ {print $2}' /proc/$SNAP/status 2>/dev/null); [ -n "$h" ] && hwm=$h
  sleep 0.05
done
echo "snapshot VmHWM ${hwm} kB" | tee "$OUT/snapshot_hwm.txt"
kill $JOB 2>/dev/null; wait $JOB 2>/dev/null
pkill -f torch_job 2>/dev/null; sleep 2
