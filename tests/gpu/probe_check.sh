#!/usr/bin/env bash
# What stall tracing costs on the GPU machine (root, repository root, `cargo xtask gpu-bundle`
# carried in .device/): `probe_cost`, as `cargo xtask bench-probes` runs it, twice:
#   - every arm (without, empty programs, all programs, adaptive with none needed), with the
#     per-event statistics pass: ROUNDS rounds of SECONDS s;
#   - the healthy host's cost alone (without, adaptive with none needed, and the agent itself,
#     `gpuwatch serve`, running beside the load): IDLE_ROUNDS rounds of SECONDS s.
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
if [ -z "${SKIP_ALL_ARMS:-}" ]; then
  echo "== every arm: $ROUNDS rounds of $SECONDS_EACH s"
  "$BIN/probe_cost" --rounds "$ROUNDS" --seconds "$SECONDS_EACH" 2>&1 | tee "$OUT/all_arms.txt"
fi
echo "== the healthy host: $IDLE_ROUNDS rounds of $SECONDS_EACH s, with the agent"
"$BIN/probe_cost" --idle-only --rounds "$IDLE_ROUNDS" --seconds "$SECONDS_EACH" \
  --agent "$BIN/gpuwatch serve --no-docker --web.listen-address 127.0.0.1:19879" \
  --agent-warmup 3 2>&1 | tee "$OUT/idle.txt"
