#!/usr/bin/env bash
# Whether the driver's per-process split is asked on a shared GPU (root, repository root,
# .device/gpuwatch carried): two cgroups of tests/gpu/torch_job.py workers share the GPU, every
# worker busy on a CPU while its matmuls run; one `snapshot` then shows, per GPU process, its
# threads, its host CPU over the window and the driver's figure (null when the driver was not
# asked), and the split's method. Evidence to $OUT. CGROUPS (2) cgroups of PROCS (2) workers
# each: CGROUPS=8 PROCS=4 is the growth benchmark's larger load.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-split-skip}
CGROUPS=${CGROUPS:-2}
PROCS=${PROCS:-2}
mkdir -p "$OUT"
for g in $(seq "$CGROUPS"); do
  mkdir -p /sys/fs/cgroup/gpuwatch-split-$g
  ( echo $BASHPID > /sys/fs/cgroup/gpuwatch-split-$g/cgroup.procs
    exec python3 tests/gpu/torch_job.py --procs "$PROCS" --seconds 60 --hold-gib 0.5 ) > "$OUT/job-$g.log" 2>&1 &
done
for _ in $(seq 90); do
  [ "$(cat "$OUT"/job-*.log 2>/dev/null | grep -c "worker ready")" -ge $((CGROUPS * PROCS)) ] && break
  sleep 1
done
sleep 3
.device/gpuwatch snapshot --json --no-docker --window 3s > "$OUT/snapshot.json" 2> "$OUT/snapshot.err"
python3 - "$OUT/snapshot.json" <<'EOF'
import json, os, sys
snap = json.load(open(sys.argv[1]))
for g in snap["gpus"]:
    print("GPU", g["index"], "split:", (g.get("busy") or {}).get("split"))
    for p in g["processes"]:
        try:
            threads = len(os.listdir(f"/proc/{p['pid']}/task"))
        except OSError:
            threads = None
        print("  pid", p["pid"], "workload", p.get("workload"), "threads", threads,
              "host_cpu_seconds", p.get("host_cpu_seconds"), "driver_sm_percent", p.get("driver_sm_percent"))
EOF
pkill -f torch_job.py
wait
