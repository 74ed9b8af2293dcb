#!/usr/bin/env bash
# What stall tracing costs on the GPU machine (root, repository root, `cargo xtask gpu-bundle`
# carried in .device/): `probe_cost`, as `cargo xtask bench-probes` runs it, twice:
#   - every arm (without, empty programs, all programs, adaptive with none needed), with the
#     per-event statistics pass: ROUNDS rounds of SECONDS s;
#   - the healthy host's cost alone (without, adaptive with none needed, and the agent itself,
#     `gpuwatch serve`, running beside the load): IDLE_ROUNDS rounds of SECONDS s.
# With PER_EVENT_PASSES=N, only the per-event statistics pass, N times in a row (ROUNDS rounds
# each): how the programs' cost against the floor moves within one machine's lease.
# Evidence goes to $OUT.
set -euo pipefail
OUT=${OUT:-/tmp/gpuwatch-probe-check}
ROUNDS=${ROUNDS:-4}
IDLE_ROUNDS=${IDLE_ROUNDS:-12}
SECONDS_EACH=${SECONDS_EACH:-1}
mkdir -p "$OUT"
BIN=$PWD/.device
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
uname -r > "$OUT/kernel.txt"
nproc >> "$OUT/kernel.txt"
if [ -n "${PER_EVENT_PASSES:-}" ]; then
  for i in $(seq "$PER_EVENT_PASSES"); do
    echo "== per-event pass $i of $PER_EVENT_PASSES ($(date +%T)): $ROUNDS rounds of $SECONDS_EACH s"
    "$BIN/probe_cost" --per-event-only --rounds "$ROUNDS" --seconds "$SECONDS_EACH" 2>&1 \
      | tee "$OUT/per_event_$i.txt"
  done
  exit 0
fi
if [ -z "${SKIP_ALL_ARMS:-}" ]; then
  echo "== every arm: $ROUNDS rounds of $SECONDS_EACH s"
  "$BIN/probe_cost" --rounds "$ROUNDS" --seconds "$SECONDS_EACH" 2>&1 | tee "$OUT/all_arms.txt"
fi
echo "== the healthy host: $IDLE_ROUNDS rounds of $SECONDS_EACH s, with the agent"
"$BIN/probe_cost" --idle-only --rounds "$IDLE_ROUNDS" --seconds "$SECONDS_EACH" \
  --agent "$BIN/gpuwatch serve --no-docker --web.listen-address 127.0.0.1:19879" \
  --agent-warmup 3 2>&1 | tee "$OUT/idle.txt"
