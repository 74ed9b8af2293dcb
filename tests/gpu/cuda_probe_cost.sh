#!/usr/bin/env bash
# What the CUDA driver probes cost a training job, and what the agent costs with them
# detached, on a GPU host (root, repository root, .device/ from `cargo xtask gpu-bundle`):
#
# 1. A launch-heavy job (host_job.py launch: one-element kernels as fast as one thread can) and a
#    realistic one (host_job.py resnet), each running throughout while `gpuwatch record` runs in
#    alternating arms of ARM_S seconds: CUDA tracing off, then always (attached from its first
#    round), repeated ARMS times. The job's own step rate in each arm (its first 2 s left out),
#    and the ratio of each "always" arm to the "off" arm before it.
# 2. The agent's steady CPU and peak RSS with the default configuration beside a GPU-bound job
#    (nothing attached: the GPU idles under no busy loop), this build against BEFORE (a gpuwatch
#    binary of the build before the probes, if given), alternating, RUNS each: on-CPU time of all
#    its threads from 10 s after start to the end of a RUN_S-second run, per second.
# Evidence in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-cuda-cost}
BIN=${BIN:-.device}
ARM_S=${ARM_S:-10}
ARMS=${ARMS:-3}
RUN_S=${RUN_S:-30}
RUNS=${RUNS:-2}
BEFORE=${BEFORE:-}
mkdir -p "$OUT"
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
for mode in off always; do printf 'sources:\n  cuda_tracing: {mode: %s}\n' $mode > "$OUT/cfg_$mode.yaml"; done

job_ready() { for _ in $(seq 120); do grep -q "phase .* start" "$1" 2>/dev/null && return; sleep 0.5; done; echo "no start in $1"; }

for job in ${JOBS:-launch resnet}; do
  total=$(( ARM_S * 2 * ARMS + 10 ))
  python3 tests/gpu/host_job.py "$OUT/steps_$job.json" $job $total > "$OUT/job_$job.log" 2>&1 & J=$!
  job_ready "$OUT/job_$job.log"
  sleep 2
  : > "$OUT/arms_$job.txt"
  for i in $(seq $ARMS); do
    for mode in off always; do
      echo "$mode start $(date +%s.%N)" >> "$OUT/arms_$job.txt"
      "$BIN/gpuwatch" record --config "$OUT/cfg_$mode.yaml" --no-docker --interval 1s \
        --duration ${ARM_S}s -o "$OUT/rec_${job}_$mode$i.csv" 2>> "$OUT/rec_$job.err"
      echo "$mode end $(date +%s.%N)" >> "$OUT/arms_$job.txt"
    done
  done
  wait $J
done
python3 - "$OUT" ${JOBS:-launch resnet} <<'PY'
import json, math, sys
out = sys.argv[1]
print("| job | arm pair | steps/s off | steps/s attached | ratio |")
print("|---|---|---|---|---|")
for job in sys.argv[2:]:
    steps = json.load(open(f"{out}/steps_{job}.json"))["steps"]
    lines = [l.split() for l in open(f"{out}/arms_{job}.txt")]
    arms = [(lines[i][0], float(lines[i][2]) + 2, float(lines[i + 1][2])) for i in range(0, len(lines), 2)]
    rate = lambda a, b: sum(1 for s in steps if a <= s["t"] and s["t"] + s["d"] <= b) / (b - a)
    ratios = []
    for k in range(0, len(arms) - 1, 2):
        off, on = rate(*arms[k][1:]), rate(*arms[k + 1][1:])
        ratios.append(on / off)
        print(f"| {job} | {k // 2 + 1} | {off:.1f} | {on:.1f} | {on / off:.4f} |")
    g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"| {job} | geometric mean | | | {g:.4f} |")
PY

# 2. the agent's own cost, nothing attached
CG=/sys/fs/cgroup/gw-cost-job
mkdir -p $CG
( echo $BASHPID > $CG/cgroup.procs; exec python3 tests/gpu/host_job.py "$OUT/steps_bound.json" gpu_bound $(( (RUN_S + 5) * RUNS * 2 + 20 )) ) > "$OUT/job_bound.log" 2>&1 & J=$!
job_ready "$OUT/job_bound.log"
steady() { # label file binary: prints label, steady on-CPU ms per s, peak RSS MiB
  "$3" record --no-docker --interval 1s --duration ${RUN_S}s --format jsonl -o "$OUT/$2.jsonl" 2>> "$OUT/agent.err" & P=$!
  sleep 10
  a=$(cat /proc/$P/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {print s}'); ta=$(date +%s.%N)
  hwm=0
  while kill -0 $P 2>/dev/null; do
    b=$(cat /proc/$P/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {print s}'); tb=$(date +%s.%N)
    h=$(awk '/VmHWM/ {print $2}' /proc/$P/status 2>/dev/null); [ -n "$h" ] && hwm=$h
    sleep 0.5
  done
  python3 -c "print(f'| $1 | {($b-$a)/1e6/($tb-$ta):.3f} | {$hwm/1024:.1f} |')"
}
echo; echo "| agent (default config, GPU-bound job beside) | steady ms CPU / s | peak RSS MiB |"; echo "|---|---|---|"
for i in $(seq $RUNS); do
  steady "this build, run $i" steady_new$i "$BIN/gpuwatch"
  [ -n "$BEFORE" ] && steady "before the probes, run $i" steady_old$i "$BEFORE"
done
kill $J 2>/dev/null; wait $J 2>/dev/null; rmdir $CG 2>/dev/null
python3 - "$OUT"/steady_new*.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip()]
on = sum(1 for r in rows if (r.get("cuda_tracing") or {}).get("attached"))
print(f"rows of this build with the CUDA probes attached (a healthy host: none expected): {on} of {len(rows)}")
PY
