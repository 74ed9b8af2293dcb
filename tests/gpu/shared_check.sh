#!/usr/bin/env bash
# Shared and constrained hosts, real Docker on the GPU machine (root, repository root, the
# `cargo xtask gpu-bundle` files in .device/). Stages (STAGES picks some; default all):
#   three - three duty_job.py containers on the one GPU at 50 %, 30 % and 10 % duty: each 1-s
#           row's parts against each job's own GPU time, their sum against the device's busy
#           share, the verdicts (score_shared.py);
#   two   - the same with two containers at 60 % and 25 %;
#   quota - loader_job.py's CPU-bound phase with 6 DataLoader workers under --cpus 1.5: three
#           one-shot `doctor --window 3s` at different moments, and the 1-s rows' verdicts;
#   pressure - loader_job.py's GPU-, I/O- and CPU-bound phases (reads throttled) under two
#           agents at once, one with --no-ebpf: how often the pressure verdict agrees;
#   memory - a container under --memory 2g reading 3 GiB of files with ordinary reads beside
#           a GPU matmul loop: `doctor` over 20 s must find no host-memory growth.
# Evidence goes to $OUT. Each scored check that misses its target is named at the end, and the
# script then exits 1.
set -uo pipefail
. tests/gpu/gate.sh
STAGES=${STAGES:-three two quota pressure memory}
OUT=${OUT:-/tmp/gpuwatch-shared-check}
. tests/gpu/docker_jobs.sh
duty() { docker run -d --name "gw-$1" -v "$OUT:/out" $GPU_RUN python3 tests/gpu/duty_job.py /out/jobs "$1" > /dev/null; }

mix() { # tag seconds name=duty...
  local tag=$1 secs=$2; shift 2
  local args=()
  for nd in "$@"; do cmd "${nd%=*}" "matmul ${nd#*=} $secs $tag"; args+=("gw-${nd%=*}=${nd%=*}"); done
  sleep 2
  $BIN/gpuwatch record --interval 1s --duration $((secs - 4))s --format jsonl -o "$OUT/$tag.jsonl" 2> "$OUT/$tag.err"
  for nd in "$@"; do done_wait "${nd%=*}.$tag.json"; done
  gate "split-$tag" python3 tests/gpu/score_shared.py "$OUT/$tag.jsonl" "$OUT/jobs" "$tag" "${args[@]}"
  python3 - "$OUT/$tag.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for w in rows[len(rows) // 2]["workloads"]:
    v = w.get("verdict") or {}
    if v:
        print(f"  {w['name']}: {v['kind']}: {v['advice'][:200]}")
        for e in v["evidence"]:
            if e.startswith("GPU") and "this job's own" in e:
                print(f"    evidence: {e}")
PY
}

if want three || want two; then
  # One at a time: each job times one matmul alone, its ground truth's unit (started together,
  # three timed theirs at once and their own GPU time summed to 1.57 of a GPU 50 % busy).
  duty hi; ready hi; duty mid; ready mid; duty lo; ready lo
fi
if want three; then
  echo "== three: 50 %, 30 %, 10 % duty on one GPU"
  mix three 22 hi=0.5 mid=0.3 lo=0.1
fi
if want two; then
  echo "== two: 60 %, 25 % duty on one GPU"
  mix two 22 hi=0.6 lo=0.25
fi
docker rm -f gw-hi gw-mid gw-lo > /dev/null 2>&1

if want quota; then
  echo "== quota: 6 DataLoader workers, CPU-bound augmentation, --cpus 1.5"
  . tests/gpu/loader_data.sh
  docker run -d --name gw-quota --cpus 1.5 -e PHASES=cpu_bound -e PHASE_S=45 -e WORKERS=6 \
    -v "$OUT:/out" $GPU_RUN python3 tests/gpu/loader_job.py /out/quota_truth.json /work/.loader-data > /dev/null
  for _ in $(seq 200); do docker logs gw-quota 2>&1 | grep -q "phase cpu_bound start" && break; sleep 1; done
  sleep 6
  $BIN/gpuwatch record --interval 1s --duration 20s --format jsonl -o "$OUT/quota.jsonl" 2> "$OUT/quota.err" &
  REC=$!
  $BIN/gpuwatch record --no-ebpf --interval 1s --duration 20s --format jsonl -o "$OUT/quota_plain.jsonl" 2>> "$OUT/quota.err" &
  PLAIN=$!
  for i in 1 2 3; do
    $BIN/gpuwatch doctor --json --window 3s > "$OUT/quota_doctor_$i.json" 2>> "$OUT/quota.err"
    sleep 2
  done
  wait $REC $PLAIN
  gate "no-ebpf-quota" python3 tests/gpu/compare_basis.py "$OUT/quota.jsonl" "$OUT/quota_plain.jsonl" gw-quota
  gate "quota" python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
named = 0
for i in (1, 2, 3):
    d = json.load(open(f"{out}/quota_doctor_{i}.json"))
    c = [c for c in d["checks"] if c["check"] == "container_cpu_limit" and c["subject"] == "gw-quota"]
    if not c:
        print(f"doctor {i}: NO FINDING")
        continue
    named += "--cpus" in c[0]["action"] and "DataLoader workers" in c[0]["action"]
    print(f"doctor {i}:", c[0]["status"], "|", c[0]["value"], "|", c[0]["action"][:160])
rows = [json.loads(l) for l in open(f"{out}/quota.jsonl") if l.strip()]
kinds, quota_named = {}, 0
for r in rows[2:]:
    w = next((w for w in r["workloads"] if w["name"] == "gw-quota"), None)
    v = (w or {}).get("verdict") or {}
    if not v:
        continue
    kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
    quota_named += "quota" in v["advice"] and "--cpus" in v["advice"]
n = sum(kinds.values())
print(f"quota rows {n}: {kinds}; advice names the quota in {quota_named}")
print("sample advice:", v.get("advice", "")[:400])
sys.exit(0 if named == 3 and n and kinds.get("input-bound: CPU", 0) >= 0.9 * n and quota_named >= 0.9 * n else 1)
PY
  docker rm -f gw-quota > /dev/null
fi

if want pressure; then
  echo "== pressure: the loader phases, with and without eBPF"
  . tests/gpu/loader_data.sh
  docker run -d --name gw-psi -e PHASE_S=24 --device-read-bps "$DISK:20mb" -v "$OUT:/out" $GPU_RUN \
    python3 tests/gpu/loader_job.py /out/psi_truth.json /work/.loader-data > /dev/null
  $BIN/gpuwatch record --interval 1s --format jsonl -o "$OUT/psi_ebpf.jsonl" 2> "$OUT/psi_ebpf.err" & A=$!
  $BIN/gpuwatch record --no-ebpf --interval 1s --format jsonl -o "$OUT/psi_plain.jsonl" 2> "$OUT/psi_plain.err" & B=$!
  docker wait gw-psi > /dev/null
  kill -INT $A $B; wait $A $B
  docker logs gw-psi > "$OUT/psi.log" 2>&1
  gate "no-ebpf-loader" python3 tests/gpu/compare_basis.py "$OUT/psi_ebpf.jsonl" "$OUT/psi_plain.jsonl" gw-psi
  gate "speedup" python3 tests/gpu/score_speedup.py "$OUT/psi_ebpf.jsonl" "$OUT/psi_truth.json" gw-psi
  gate "by-cause" python3 tests/gpu/score_by_cause.py "$OUT/psi_ebpf.jsonl" "$OUT/psi_truth.json" gw-psi
  docker rm -f gw-psi > /dev/null
fi

if want memory; then
  echo "== memory: --memory 2g, 3 GiB of files read with ordinary reads"
  mkdir -p /tmp/gw-memdata
  for i in 0 1 2; do [ -f /tmp/gw-memdata/$i.bin ] || head -c 1073741824 /dev/urandom > /tmp/gw-memdata/$i.bin; done
  # Out of the host's page cache, so the container's reads fill its own (charged to its cgroup).
  sync; echo 3 > /proc/sys/vm/drop_caches
  docker run -d --name gw-mem --memory 2g -v /tmp/gw-memdata:/data:ro -v "$OUT:/out" $GPU_RUN python3 -c "
import torch, time, threading
a = torch.randn(4096, 4096, device='cuda')
def read():
    while True:
        for i in range(3):
            with open(f'/data/{i}.bin', 'rb') as f:
                while f.read(1 << 20):
                    pass
threading.Thread(target=read, daemon=True).start()
while True:
    a @ a; torch.cuda.synchronize(); time.sleep(0.05)
" > /dev/null
  sleep 8
  $BIN/gpuwatch doctor --json --window 20s > "$OUT/mem_doctor.json" 2> "$OUT/mem.err"
  gate "memory" python3 - "$OUT" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/mem_doctor.json"))
growth = False
for c in d["checks"]:
    if c["subject"] == "gw-mem" and c["check"] in ("container_memory", "container_memory_limit", "cpu_memory_leak"):
        print(f"{c['check']}: {c['status']} | {c['value']} | {c['action'][:120]}")
        growth |= c["check"] in ("container_memory", "cpu_memory_leak") and c["status"] != "ok"
sys.exit(1 if growth else 0)
PY
  docker rm -f gw-mem > /dev/null
fi
gates_done
