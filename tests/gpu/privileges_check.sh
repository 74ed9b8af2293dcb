#!/usr/bin/env bash
# Least privilege on a real GPU, from the repository root with .device/ carried: `gpuwatch serve`
# with the real NVML and eBPF beside a PyTorch job in a cgroup, started as root and then with
# exactly the four documented capabilities (setpriv), then as root with `--user nobody`
# (CHECKS picks some of root, four, user). Each time: every thread's capability sets
# and no-new-privileges once started, the sources still up, and the job's GPU busy still read
# through NVML 20 s after the drop. Evidence to $OUT.
set -uo pipefail
. tests/gpu/gate.sh
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
  # Targets: every thread with no-new-privileges, the HTTP threads with no capability, the
  # others with the four at most (000000c000080004: BPF, PERFMON, SYS_PTRACE,
  # DAC_READ_SEARCH), nobody's ids with --user; NVML and eBPF still up 20 s later.
  gate "privileges-$name" python3 - "$OUT/$name.txt" "$name" <<'PY'
import sys
text, name = open(sys.argv[1]).read(), sys.argv[2]
four = 0x000000c000080004
threads, bad = text.split("== ")[1].splitlines()[1:], []
for t in threads:
    f = t.split()
    if len(f) < 7:
        continue
    tname, uid, gid, eff, prm, _bnd, nnp = f[:7]
    limit = 0 if tname == "gpuwatch-http" else four
    if int(eff, 16) & ~limit or int(prm, 16) & ~limit or nnp != "1":
        bad.append(t)
    if name == "user" and (uid != "65534/65534/65534/65534" or gid != "65534/65534/65534/65534"):
        bad.append(t)
later = text.split("20 s later")[-1]
up = all(f'gpuwatch_up{{source="{s}"}} 1' in later for s in ("nvml", "ebpf"))
print(f"{name}: {len(threads)} threads, {len(bad)} over their set {bad}; nvml and ebpf up 20 s later: {up}")
sys.exit(0 if threads and not bad and up else 1)
PY
  kill $pid; wait $pid 2>/dev/null
}
want() { case " ${CHECKS:-root four user} " in *" $1 "*) return 0;; esac; return 1; }
want root && check root env
want four && check four setpriv --bounding-set -all,+bpf,+perfmon,+sys_ptrace,+dac_read_search --
want user && EXTRA="--user nobody" check user env
kill $JOB 2>/dev/null; wait $JOB 2>/dev/null; pkill -f torch_job 2>/dev/null
rmdir "$CG" 2>/dev/null || true  # still emptying: the job is gone either way
gates_done
