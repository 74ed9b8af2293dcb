#!/usr/bin/env bash
# The verdict's accuracy on a GPU host, in one command (root, repository root, the release
# binary in .device/ from `cargo xtask gpu-bundle`, or BIN=the folder holding gpuwatch):
#
#   bash tests/gpu/accuracy.sh
#
# Runs labelled jobs one after another, each in a child cgroup of its own and timing itself
# (tests/gpu/host_job.py, tests/gpu/loader_job.py), while `gpuwatch record` writes a row a
# second with the default configuration (CUDA call and read tracing adaptive). Then
# tests/gpu/score_accuracy.py scores every steady row's verdict against its job's own label and
# shares, beside the SageMaker Debugger rules on the same seconds (tests/gpu/host_stats.py
# records the host CPU they read). SCENARIOS picks some, SECONDS_EACH their length (24).
# Exits 1 when a target is missed. Evidence in $OUT.
set -uo pipefail
. tests/gpu/gate.sh
OUT=${OUT:-/tmp/gpuwatch-accuracy}
BIN=${BIN:-.device}
SECONDS_EACH=${SECONDS_EACH:-24}
SCENARIOS=${SCENARIOS:-pageable pinned launch trainer_cpu sync gpu_bound low_sm idle loader_io loader_cpu quota mixed}
mkdir -p "$OUT"
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
echo "+cpu +memory +io" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
. tests/gpu/loader_data.sh  # DATA, MAJMIN
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 tests/gpu/host_stats.py "$OUT/host_stats.json" & STATS=$!
"$BIN/gpuwatch" record --no-docker --format jsonl --interval 1s --duration 1h \
  -o "$OUT/record.jsonl" ${RECORD_ARGS:-} 2> "$OUT/record.err" & REC=$!
sleep 3
for s in $SCENARIOS; do
  CG=/sys/fs/cgroup/gw-acc-$s
  mkdir -p "$CG"
  job="python3 tests/gpu/host_job.py $OUT/truth_$s.json $s $SECONDS_EACH"
  # mixed: three phases, each half a scenario's length
  [ "$s" = mixed ] && job="python3 tests/gpu/host_job.py $OUT/truth_$s.json $s $(( SECONDS_EACH * 3 / 2 ))"
  case $s in
    loader_io) echo "$MAJMIN rbps=20971520" > "$CG/io.max"
      job="env PHASES=io_bound PHASE_S=$SECONDS_EACH python3 tests/gpu/loader_job.py $OUT/truth_$s.json $DATA" ;;
    loader_cpu) job="env PHASES=cpu_bound PHASE_S=$SECONDS_EACH python3 tests/gpu/loader_job.py $OUT/truth_$s.json $DATA" ;;
    quota) echo "150000 100000" > "$CG/cpu.max"
      job="env PHASES=cpu_bound PHASE_S=$SECONDS_EACH python3 tests/gpu/loader_job.py $OUT/truth_$s.json $DATA" ;;
  esac
  echo "== $s: $job"
  ( echo $BASHPID > "$CG/cgroup.procs"; exec $job ) > "$OUT/job_$s.log" 2>&1
  echo "   exit $?"
  sleep 2
done
kill -INT $REC; wait $REC
kill $STATS 2>/dev/null
for s in $SCENARIOS; do rmdir "/sys/fs/cgroup/gw-acc-$s" 2>/dev/null; done
gate accuracy python3 tests/gpu/score_accuracy.py "$OUT" $SCENARIOS
gates_done
