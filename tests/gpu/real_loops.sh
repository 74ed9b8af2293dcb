#!/usr/bin/env bash
# The verdicts on training loops written the way people write them (tests/gpu/real_loops.py),
# each in a Docker container of its own and timing itself, under three agents recording side by
# side: the default configuration, the CUDA probes off (what a kernel without them gets) and
# --no-ebpf. On the GPU machine (root, repository root, `cargo xtask gpu-bundle` in .device/):
#
#   OUT=/tmp/rl SCENARIOS="tokenize pool" SECONDS_EACH=16 bash tests/gpu/real_loops.sh
#
# Scenario names are real_loops.py's, and these, which set the container up as users do:
#   tokenize_quota   tokenize under --cpus 0.5
#   jpeg_quota       the JPEG pipeline (6 workers) under --cpus 1.5
#   loader_cpuset    the CPU-bound loader (4 workers) on --cpuset-cpus 0,1
#   loader_neighbour the CPU-bound loader (2 workers) beside a container keeping every CPU busy
#   loader_io        reads through --device-read-bps 20 MB/s
# Then tests/gpu/score_real_loops.py scores each mode's rows against the jobs' own timing (exit 1
# on a missed target). Evidence in $OUT: each agent's JSON Lines, each job's log and timing.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-real-loops}
STAGES=""
SECONDS_EACH=${SECONDS_EACH:-16}
SCENARIOS=${SCENARIOS:-tokenize tokenize_quota item_mlp pool native_tok pinned_sync small_copies pageable d2h_logging graphs_tiny transformer resnet mlp_item jpeg_quota loader_cpuset loader_neighbour loader_io sync launch idle}
mkdir -p "$OUT"
. tests/gpu/docker_jobs.sh  # tracefs, dockerd, GPU_RUN, BIN
. tests/gpu/loader_data.sh  # DATA, DISK
# The native tokenizer's wheel, carried (no registry here).
PYLIB=/tmp/gpuwatch-pylib
whl=$(ls .device/wheels/tokenizers-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] && [ ! -d "$PYLIB/tokenizers" ] && python3 -m zipfile -e "$whl" "$PYLIB"
echo "+cpu +cpuset +memory +io" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | tee "$OUT/nproc.txt"

printf 'sources:\n  cuda_tracing: {mode: off}\n' > "$OUT/cuda_off.yaml"
# CUDA_MODE=always records the first agent with the probes attached throughout (data for the
# verdict's design); the default, adaptive, is what users get.
printf 'sources:\n  cuda_tracing: {mode: %s}\n' "${CUDA_MODE:-adaptive}" > "$OUT/default.yaml"
rec() { # mode args...: an agent recording a row a second
  local mode=$1; shift
  "$BIN/gpuwatch" record --format jsonl --interval 1s --duration 1h -o "$OUT/$mode.jsonl" "$@" \
    2> "$OUT/$mode.err" &
  echo $! > "$OUT/$mode.pid"
}
rec default --config "$OUT/default.yaml"
rec cuda_off --config "$OUT/cuda_off.yaml"
rec no_ebpf --no-ebpf
sleep 3

for s in $SCENARIOS; do
  job=$s; opts=(); envs=()
  case $s in
    tokenize_quota) job=tokenize; opts=(--cpus 0.5) ;;
    jpeg_quota) job=jpeg; opts=(--cpus 1.5 --shm-size 2g); envs=(-e WORKERS=6 -e JPEGS=/out/jpegs) ;;
    loader_cpuset) job=loader_cpu; opts=(--cpuset-cpus 0,1 --shm-size 1g); envs=(-e WORKERS=4) ;;
    loader_neighbour) job=loader_cpu; opts=(--shm-size 1g); envs=(-e WORKERS=2)
      docker run -d --name gw-rl-neighbour $GPU_RUN python3 -c "
import multiprocessing as m, os
def burn(_):
    while True: pass
m.Pool(os.cpu_count()).map(burn, range(os.cpu_count()))" > /dev/null ;;
    loader_io) opts=(--device-read-bps "$DISK:20mb" --shm-size 1g); envs=(-e DATA=/work/.loader-data) ;;
    loader_cpu|jpeg) opts=(--shm-size 1g) ;;
    native_tok) opts=(-v "$PYLIB:$PYLIB:ro"); envs=(-e "PYTHONPATH=$PYLIB") ;;
  esac
  seconds=$SECONDS_EACH
  # The JPEG pipeline's batches come in bursts (its workers finish together): twice as long.
  [ "$s" = jpeg_quota ] && seconds=$(( SECONDS_EACH * 2 ))
  echo "== $s ($job ${opts[*]:-})"
  docker run --name "gw-rl-$s" --label com.docker.compose.service="$s" "${opts[@]}" "${envs[@]}" \
    -v "$OUT:/out" $GPU_RUN python3 tests/gpu/real_loops.py "/out/truth_$s.json" "$job" "$seconds" \
    > "$OUT/job_$s.log" 2>&1
  echo "   exit $?: $(grep -c '^phase' "$OUT/job_$s.log") phase lines"
  docker rm -f "gw-rl-$s" > /dev/null 2>&1
  [ "$s" = loader_neighbour ] && docker rm -f gw-rl-neighbour > /dev/null 2>&1
  sleep 2
done

for mode in default cuda_off no_ebpf; do kill -INT "$(cat "$OUT/$mode.pid")"; done
wait
python3 tests/gpu/score_real_loops.py "$OUT" $SCENARIOS
