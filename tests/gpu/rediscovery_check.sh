#!/usr/bin/env bash
# NVML re-opened on a change of the driver's GPU list, on a real GPU, from the repository root
# with .device/ carried. Runs `gpuwatch record` with the real NVML twice:
#  1. on the driver's own list (/proc/driver/nvidia/gpus): no re-open in 10 s;
#  2. on a copy of that list, to which a GPU address is added after 4 s: the agent completes
#     its rounds, shuts NVML down and opens it again (still this machine's GPUs), and keeps
#     recording. Each run: the agent's open /dev/nvidia* files before and after, every row's
#     GPUs and NVML state. Evidence to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-rediscovery}
mkdir -p "$OUT"
BIN=.device

nvidia_fds() { ls -l /proc/$1/fd 2>/dev/null | grep -c ' -> /dev/nvidia'; }

rows() {  # $1: a jsonl recording
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(r["taken_at"], "nvml up" if r["sources"]["nvml"]["up"] else "nvml DOWN",
          [g["uuid"] for g in r["gpus"]])
print(len(rows), "rows")
PY
}

run() {  # $1: name, $2: config file or "", $3: command to run 4 s in
  local name=$1 config=$2 later=$3
  $BIN/gpuwatch ${config:+-c "$config"} record --interval 500ms --duration 10s --no-docker \
    --no-ebpf --log info --format jsonl -o "$OUT/$name.jsonl" 2> "$OUT/$name.log" &
  local pid=$!
  sleep 3
  echo "== $name: /dev/nvidia* files open at 3 s: $(nvidia_fds $pid)"
  sleep 1
  eval "$later"
  sleep 3
  echo "== $name: /dev/nvidia* files open at 7 s: $(nvidia_fds $pid)"
  wait $pid
  echo "== $name: exit $?; log:"
  grep -E "GPUs changed|GPU source up|nvml_call_failed" "$OUT/$name.log"
  rows "$OUT/$name.jsonl"
}

echo "== the driver's list: $(ls /proc/driver/nvidia/gpus)"
run own "" true

LIST=$OUT/driver-gpus
rm -rf "$LIST" && mkdir -p "$LIST"
for g in /proc/driver/nvidia/gpus/*; do mkdir "$LIST/$(basename "$g")"; done
printf 'sources:\n  nvml_driver_list: %s\n' "$LIST" > "$OUT/config.yaml"
run bound "$OUT/config.yaml" "mkdir '$LIST/0000:ff:00.0'"
