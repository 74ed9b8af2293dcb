#!/usr/bin/env bash
# Least privilege on a real GPU, from the repository root with .device/ carried: `gpuwatch serve`
# with the real NVML and eBPF beside a PyTorch job in a cgroup, started as root and then with
# exactly the four documented capabilities (setpriv), then as root with `--user nobody`
# (CHECKS picks some of root, four, user). Each time: every thread's capability sets
# and no-new-privileges once started, the sources still up, and the job's GPU busy still read
# through NVML 20 s after the drop. Evidence to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-privileges}
mkdir -p "$OUT"
BIN=.device
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
CG=/sys/fs/cgroup/gpuwatch-privileges
mkdir -p "$CG"
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 tests/gpu/torch_job.py --procs 1 --seconds 100 ) > "$OUT/job.log" 2>&1 &
JOB=$!
for _ in $(seq 60); do grep -q "worker ready" "$OUT/job.log" 2>/dev/null && break; sleep 1; done

metrics() {  # no curl on every GPU image: python's urllib
  python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9879/metrics", timeout=5).read().decode())'
}

check() {  # $1: name, rest: command prefix
  local name=$1; shift
  "$@" $BIN/gpuwatch serve --web.listen-address 127.0.0.1:9879 --interval 1s --no-docker --log info \
    ${EXTRA:-} > "$OUT/$name.stdout" 2> "$OUT/$name.log" &
  local pid=$!
  sleep 8
  {
    echo "== $name: threads (Name Uid Gid CapEff CapPrm CapBnd NoNewPrivs; Uid and Gid: real, effective, saved, fs)"
    for t in /proc/$pid/task/*; do
      awk '/^(Uid|Gid):/ {printf "%s/%s/%s/%s ", $2, $3, $4, $5; next}
           /^(Name|CapEff|CapPrm|CapBnd|NoNewPrivs):/ {printf "%s ", $2} END {print ""}' "$t/status"
    done
    echo "== $name: sources after 8 s"
    metrics | grep -E '^gpuwatch_up|^gpuwatch_container_gpu_busy_ratio'
    sleep 20
    echo "== $name: 20 s later"
    metrics | grep -E '^gpuwatch_up|^gpuwatch_container_gpu_busy_ratio|^gpuwatch_internal_events_total\{event="nvml_call_failed"'
    grep -i "capabilit" "$OUT/$name.log"
  } 2>&1 | tee "$OUT/$name.txt"
  kill $pid; wait $pid 2>/dev/null
}
want() { case " ${CHECKS:-root four user} " in *" $1 "*) return 0;; esac; return 1; }
want root && check root env
want four && check four setpriv --bounding-set -all,+bpf,+perfmon,+sys_ptrace,+dac_read_search --
want user && EXTRA="--user nobody" check user env
kill $JOB 2>/dev/null; wait $JOB 2>/dev/null; pkill -f torch_job 2>/dev/null
rmdir "$CG" 2>/dev/null || true  # still emptying: the job is gone either way
