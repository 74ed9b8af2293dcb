#!/usr/bin/env bash
# Real-GPU check of doctor, watch, serve, record/plot/report and top (issues 4 and 5), run on the
# GPU machine from the repository root, as root, with the release binaries in .device/ (see the
# README, "Checking on a real GPU"). A PyTorch job of 4 CUDA processes runs in a hand-made child
# cgroup meanwhile. Writes at most 8 files to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-health}
mkdir -p "$OUT"
BIN=$PWD/.device
W=$(mktemp -d)
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
exec > >(tee "$OUT/summary.txt") 2>&1

CG=/sys/fs/cgroup/gpuwatch-job
mkdir -p "$CG"
echo "+cpu +memory" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/torch_job.py --procs 4 --seconds 200 ) > "$W/job.log" 2>&1 &
JOB=$!
for _ in $(seq 90); do
  n=$(grep -c "worker ready" "$W/job.log" 2>/dev/null || true)
  [ "${n:-0}" -ge 4 ] && break
  sleep 1
done
sleep 3
nvidia-smi --query-gpu=temperature.gpu,memory.used,memory.total,persistence_mode,ecc.errors.uncorrected.volatile.total --format=csv

echo "== gpuwatch doctor (table)"
"$BIN/gpuwatch" doctor --no-docker --window 5s
echo "doctor exit status: $?"
"$BIN/gpuwatch" doctor --no-docker --window 3s --json > "$OUT/doctor.json"

echo "== gpuwatch watch: rules set to fire on this healthy job (temperature above 20 °C, busy below 100 %)"
cat > "$W/cfg.yaml" <<'EOF'
interval: 1s
alerts:
  rules:
    gpu_temperature_high: {above_celsius: 20, for: 2s}
    gpu_underutilized: {below_percent: 100, for: 2s}
EOF
"$BIN/gpuwatch" -c "$W/cfg.yaml" check-config "$W/cfg.yaml"
"$BIN/gpuwatch" -c "$W/cfg.yaml" watch --no-docker --duration 6s --log error

echo "== gpuwatch serve: /metrics scraped 20 times"
"$BIN/gpuwatch" -c "$W/cfg.yaml" serve --no-docker --web.listen-address 127.0.0.1:9879 --log error &
SERVE=$!
sleep 5
python3 - "$OUT" <<'PY'
import sys, time, urllib.request, json
out = sys.argv[1]
base = "http://127.0.0.1:9879"
times = []
for _ in range(20):
    t = time.perf_counter()
    body = urllib.request.urlopen(base + "/metrics").read().decode()
    times.append((time.perf_counter() - t) * 1e3)
times.sort()
open(f"{out}/metrics.txt", "w").write(body)
print(f"scrape: {len(body)} bytes, median {times[10]:.2f} ms, max {times[-1]:.2f} ms")
for line in body.splitlines():
    if line.startswith(("gpuwatch_gpu_", "gpuwatch_container_gpu", "gpuwatch_up", "gpuwatch_alert", "gpuwatch_nvml")) and "_info" not in line:
        print("  " + line)
alerts = json.load(urllib.request.urlopen(base + "/api/v1/alerts"))["alerts"]
print("alerts:", [(a["rule"], a["state"], a["summary"]) for a in alerts])
PY
kill $SERVE; wait $SERVE 2>/dev/null

echo "== record 20 s, then plot and report"
"$BIN/gpuwatch" -c "$W/cfg.yaml" record --no-docker --interval 1s --duration 20s -o "$W/gpu_log.csv" --log error
wc -l "$W/gpu_log.csv"
"$BIN/gpuwatch" plot "$W/gpu_log.csv" -o "$W/plots"
cp "$W/plots/gpu0-temperature-memory.png" "$OUT/" 2>/dev/null
cp "$W"/plots/container-*.png "$OUT/container.png" 2>/dev/null
"$BIN/gpuwatch" report "$W/gpu_log.csv" -o "$OUT/report.md"
"$BIN/gpuwatch" report "$W/gpu_log.csv" --format json > "$OUT/report.json"
sed -n 1,40p "$OUT/report.md"

if command -v tmux > /dev/null; then
  echo "== gpuwatch top under tmux"
  TERM=xterm-256color tmux new-session -d -s top -x 150 -y 20 "$BIN/gpuwatch top --no-docker" || echo "tmux new-session failed"
  sleep 4
  tmux capture-pane -p -t top
  tmux send-keys -t top q
  sleep 2
else
  echo "== (no tmux on this machine: top not captured)"
fi

echo "== sample cost (1 Hz), with Xid events, ECC and persistence reads"
"$BIN/sample_cost" --rounds 30

kill $JOB 2>/dev/null; pkill -f torch_job.py; wait $JOB 2>/dev/null
