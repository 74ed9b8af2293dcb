#!/usr/bin/env bash
# Real Docker on the GPU machine (root, repository root, `cargo xtask gpu-bundle` carried in
# .device/): PyTorch containers with compose labels, gpuwatch on the host, its figures against
# the device's own series (util_recorder.py) and the jobs' own timing. Stages:
#   lone   - one container at full duty: every 1-s row of `record`, and `snapshot`;
#   share  - two containers at 70 % and 30 % duty on the one GPU: each one's part;
#   spin   - a single-thread spinning kernel: the low-SM-activity verdict;
#   loader - a DataLoader container, GPU-, I/O- then CPU-bound: verdicts and input-bound shares;
#   shm    - two DataLoader containers, Docker's default /dev/shm and --shm-size 8m: `doctor`;
#   adaptive - the DataLoader container under `record` with read tracing adaptive (the default):
#            verdicts and shares per phase, and when the read evidence came on;
#   agent  - gpuwatch itself in a container, with the README's run line (Docker 20.10 takes
#            SYS_ADMIN for BPF and PERFMON) and the host's NVML library and device nodes, beside
#            a GPU container it must name; then the same in a cgroup namespace of its own.
# STAGES picks some (default all); PER_MM gives the GPU time of one matmul when the lone stage,
# which measures it, is left out. Evidence goes to $OUT. Each scored check is gated
# (tests/gpu/gate.sh): busy within 5 pp of the device, a job's part within 10 pp of its own
# GPU time, each verdict the one its job is; the script exits 1 on any miss.
set -uo pipefail
STAGES=${STAGES:-lone share spin loader shm}
OUT=${OUT:-/tmp/gpuwatch-docker-check}
. tests/gpu/gate.sh
. tests/gpu/docker_jobs.sh
python3 tests/gpu/util_recorder.py "$OUT/util.json" & REC=$!
trap 'kill $REC 2>/dev/null' EXIT
# verdict SNAPSHOT NAME KIND: the workload NAME's verdict in SNAPSHOT is KIND.
verdict() {
  python3 - "$@" <<'PY'
import json, sys
path, name, kind = sys.argv[1:4]
s = json.load(open(path))
w = next((w for w in s["workloads"] if w["name"] in (name, "/" + name)), None)
got = (w or {}).get("verdict") or {}
print(f"{name}: verdict {got.get('kind')} (want {kind}), busy {got.get('gpu_busy_fraction')}")
sys.exit(0 if got.get("kind") == kind else 1)
PY
}
loader_container() { # name truth-file: loader_job.py in a container, its disk reads throttled
  docker run -d --name "$1" --label com.docker.compose.service=loader -e PHASE_S="$PHASE_S" \
    --device-read-bps "$DISK:20mb" -v "$OUT:/out" $GPU_RUN \
    python3 tests/gpu/loader_job.py "/out/$2" /work/.loader-data
}
duty() { # name labels...
  local n=$1; shift
  docker run -d --name "gw-$n" "$@" -v "$OUT:/out" $GPU_RUN python3 tests/gpu/duty_job.py /out/jobs "$n" > "$OUT/$n.id"
}

if want lone || want share || want spin; then
duty trainer --label com.docker.compose.project=vision --label com.docker.compose.service=trainer
ready trainer
fi
if want lone; then
echo "== lone: one container alone at full duty"
cmd trainer "matmul 1.0 24 lone"
sleep 2
$BIN/gpuwatch record --interval 1s --duration 14s -o "$OUT/lone.csv" 2> "$OUT/lone.err"
$BIN/gpuwatch snapshot --json --window 3s > "$OUT/lone_snap.json" 2>> "$OUT/lone.err"
$BIN/gpuwatch snapshot --window 3s 2>&1 | tee "$OUT/lone_snap.txt"
done_wait trainer.lone.json
sleep 2
gate lone-busy python3 tests/gpu/compare_busy.py "$OUT/util.json" "$OUT/lone.csv"
gate lone-verdict verdict "$OUT/lone_snap.json" gw-trainer GPU-bound
fi

if want share; then
echo "== share: two containers on the one GPU, 70 % and 30 % duty"
duty eval --label com.docker.compose.project=vision --label com.docker.compose.service=eval
ready eval
cmd trainer "matmul 0.7 26 share"; cmd eval "matmul 0.3 26 share"
sleep 3
$BIN/gpuwatch snapshot --json --window 5s > "$OUT/share_snap.json" 2> "$OUT/share.err"
$BIN/gpuwatch record --interval 1s --duration 14s -o "$OUT/share.csv" 2>> "$OUT/share.err"
done_wait trainer.share.json; done_wait eval.share.json
sleep 2
[ -n "${PER_MM:-}" ] || PER_MM=$(python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
lone = json.load(open(f"{out}/jobs/trainer.lone.json"))
series = json.load(open(f"{out}/util.json"))
v = [p for ts, p in series if lone["t_start"] + 2 < ts / 1e6 <= lone["t_end"] - 1]
busy = sum(v) / len(v) / 100
marks = [(t, n) for t, n in lone["marks"] if lone["t_start"] + 2 < t <= lone["t_end"] - 1]
print((marks[-1][0] - marks[0][0]) * busy / (marks[-1][1] - marks[0][1]))
PY
)
echo "one 8192² bf16 matmul = $PER_MM s of GPU time (from the lone stage: device busy over matmuls done)"
gate share-split python3 tests/gpu/compare_busy.py "$OUT/util.json" "$OUT/share.csv" --per-matmul "$PER_MM" \
  --job "gw-trainer=$OUT/jobs/trainer.share.json" --job "gw-eval=$OUT/jobs/eval.share.json"
python3 - "$OUT" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/share_snap.json"))
g = s["gpus"][0]
print("share snapshot: GPU busy", g["busy"])
for w in s["workloads"]:
    if w["gpu"]["processes"]:
        c = w.get("container") or {}
        print(f"  {w['name']} image {c.get('image')} service {c.get('compose_service')}: busy {w['gpu']['busy_fraction']} split {w['gpu']['per_gpu'][0]['split']}")
for p in g["processes"]:
    print(f"  pid {p['pid']} driver {p['driver_sm_percent']} host cpu {p['host_cpu_seconds']} busy {p['busy_fraction']}")
PY
docker rm -f gw-eval > /dev/null
fi

if want spin; then
echo "== spin: a single-thread kernel keeps the GPU busy and its SMs idle"
cmd trainer "spin 1.0 14 spin"
sleep 3
$BIN/gpuwatch snapshot --json --window 6s > "$OUT/spin_snap.json" 2> "$OUT/spin.err"
gate spin-verdict verdict "$OUT/spin_snap.json" gw-trainer "low SM activity"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for stage in ("lone", "spin"):
    s = json.load(open(f"{out}/{stage}_snap.json"))
    w = next(w for w in s["workloads"] if w["name"] == "gw-trainer")
    v = w["verdict"]
    print(f"{stage}: verdict {v['kind']}, busy {v['gpu_busy_fraction']:.3f}, SMs busy while running {v['sm_activity_fraction']}, GPU sm_activity {s['gpus'][0]['sm_activity']}")
PY
done_wait trainer.spin.json
fi
docker rm -f gw-trainer > /dev/null 2>&1

if want loader; then
echo "== loader: a DataLoader container, GPU-, I/O- then CPU-bound"
. tests/gpu/loader_data.sh
export PHASE_S=${PHASE_S:-24}
loader_container gw-loader truth.json > "$OUT/loader.id"
LID=$(cat "$OUT/loader.id")
snap() {
  for _ in $(seq 200); do docker logs gw-loader 2>&1 | grep -q "phase $1 start" && break; sleep 1; done
  sleep 6
  $BIN/gpuwatch snapshot --json --window 12s > "$OUT/snap_$1.json" 2> "$OUT/snap_$1.err"
}
snap gpu_bound; snap io_bound; snap cpu_bound
docker wait gw-loader > /dev/null
docker logs gw-loader > "$OUT/loader.log" 2>&1
gate loader-verdicts python3 tests/gpu/compare_verdicts.py "$OUT" "docker:$LID" gpu_bound io_bound cpu_bound
docker rm -f gw-loader > /dev/null
fi
if want adaptive; then
echo "== adaptive: the DataLoader container under record, read tracing adaptive"
. tests/gpu/loader_data.sh
export PHASE_S=${PHASE_S:-30}
loader_container gw-adaptive adaptive_truth.json > "$OUT/adaptive.id"
# A short linger, so the healthy GPU-bound phase lets the read programs go before the I/O one.
printf 'sources:\n  read_tracing:\n    mode: adaptive\n    linger: %s\n' "${LINGER:-5s}" > "$OUT/adaptive.yaml"
$BIN/gpuwatch record -c "$OUT/adaptive.yaml" --interval 1s --format jsonl -o "$OUT/adaptive.jsonl" 2> "$OUT/adaptive.err" &
RECPID=$!
docker wait gw-adaptive > /dev/null
sleep 2; kill -INT $RECPID; wait $RECPID
docker logs gw-adaptive > "$OUT/adaptive.log" 2>&1
gate adaptive-verdicts python3 tests/gpu/compare_record_verdicts.py "$OUT/adaptive.jsonl" "$OUT/adaptive_truth.json" "$OUT/adaptive.log" gw-adaptive
docker rm -f gw-adaptive > /dev/null
fi

if want shm; then
echo "== shm: DataLoader containers with Docker's default /dev/shm and with --shm-size 8m"
. tests/gpu/loader_data.sh
for v in default small; do
  opt=""; [ $v = small ] && opt="--shm-size 8m"
  docker run -d --name "gw-shm-$v" $opt -e PHASES=gpu_bound -e PHASE_S=40 -v "$OUT:/out" $GPU_RUN \
    python3 tests/gpu/loader_job.py "/out/shm_$v.json" /work/.loader-data > "$OUT/shm_$v.id"
done
for v in default small; do
  for _ in $(seq 200); do docker logs "gw-shm-$v" 2>&1 | grep -q "phase gpu_bound start" && break; sleep 1; done
done
sleep 5
for v in default small; do
  echo "gw-shm-$v: $(docker exec "gw-shm-$v" df -k /dev/shm | tail -1)"
done
$BIN/gpuwatch doctor --window 5s > "$OUT/doctor_shm.txt" 2> "$OUT/doctor_shm.err"; echo "doctor exit $?"
cat "$OUT/doctor_shm.txt"
$BIN/gpuwatch doctor --json --window 5s > "$OUT/doctor_shm.json" 2>> "$OUT/doctor_shm.err"
# The 8 MiB /dev/shm is a risk for its DataLoader workers; Docker's default 64 MiB with the
# job's one worker batch is not flagged as one.
gate shm python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/doctor_shm.json"))
shm = {c["subject"]: c for c in d["checks"] if c["check"] == "container_shm"}
for k, c in shm.items():
    print(f"container_shm {k}: {c['status']} | {c['value']}")
small = next((c for k, c in shm.items() if k.endswith("gw-shm-small")), None)
sys.exit(0 if small and small["status"] != "ok" else 1)
PY
docker rm -f gw-shm-default gw-shm-small > /dev/null
fi
if want agent; then
echo "== agent: gpuwatch in a container, beside a GPU container"
duty job --label com.docker.compose.project=vision --label com.docker.compose.service=trainer
ready job
cmd job "matmul 1.0 20 agent"
# The image: the same binary on an empty tree, glibc and NVML from the host read-only (no
# registry here for deploy/Dockerfile's Debian base).
A=/tmp/gpuwatch-agent-root; mkdir -p "$A/usr/bin" "$A/proc" "$A/sys" "$A/dev" "$A/tmp" "$A/etc"
cp .device/gpuwatch "$A/usr/bin/gpuwatch"
tar -C "$A" -c . | docker import -c 'ENTRYPOINT ["/usr/bin/gpuwatch"]' - gpuwatch-agent:test >/dev/null
NV=""; for n in /dev/nvidia0 /dev/nvidiactl; do [ -e "$n" ] && NV="$NV --device $n"; done
sleep 3
# agent_snapshot CGROUPNS: the README's Docker 20.10 line with --cgroupns=CGROUPNS. `private` is
# what Docker 20.10 gives on this cgroup v2 host when nothing asks (deploy/compose.docker20.yaml
# under Compose v1): the agent must find its namespace's root through /sys and see the same.
agent_snapshot() {
  docker run --rm --name gw-agent --pid=host --cgroupns="$1" --network none \
    --cap-drop ALL --cap-add SYS_ADMIN --read-only \
    -v /sys:/sys:ro -v /var/run/docker.sock:/var/run/docker.sock:ro \
    -v /lib:/lib:ro -v /lib64:/lib64:ro -v /usr/lib:/usr/lib:ro -v /usr/local/nvidia:/usr/local/nvidia:ro \
    -e LD_LIBRARY_PATH=/usr/local/nvidia/lib64 $NV \
    gpuwatch-agent:test snapshot --json --window 3s > "$OUT/agent_$1.json" 2> "$OUT/agent_$1.err"
  echo "agent container (--cgroupns=$1) exit $?"; tail -5 "$OUT/agent_$1.err"
}
for ns in host private; do
agent_snapshot $ns
gate agent-cgroupns-$ns python3 - "$OUT/agent_$ns.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
job = next((w for w in s["workloads"] if w["name"] in ("gw-job", "/gw-job")), None)
ok = s["sources"]["nvml"]["up"] and s["sources"]["docker"]["up"] and job is not None \
    and (job.get("container") or {}).get("compose_service") == "trainer" \
    and (job["gpu"].get("busy_fraction") or 0) > 0.8 \
    and not s["host"].get("blind_spots") \
    and (job.get("memory") or {}).get("usage_bytes", 0) > 0
print("sources:", {k: v.get("up") for k, v in s["sources"].items()}, "blind spots:", s["host"].get("blind_spots"))
for g in s["gpus"]:
    print(f"GPU {g['index']}: busy {g.get('busy')}, processes {[(p.get('pid'), p.get('workload')) for p in g['processes']]}")
for w in s["workloads"]:
    c = w.get("container") or {}
    v = w.get("verdict") or {}
    print(f"{w['kind']} {w['name']}: image {c.get('image')}, service {c.get('compose_service')}, "
          f"busy {w['gpu'].get('busy_fraction')}, memory {(w.get('memory') or {}).get('usage_bytes')}, "
          f"cgroup {w.get('cgroup_path')}, verdict {v.get('kind')}")
sys.exit(0 if ok else 1)
PY
done
done_wait job.agent.json
docker rm -f gw-job > /dev/null 2>&1
fi
gates_done
