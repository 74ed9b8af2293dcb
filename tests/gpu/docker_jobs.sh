# Sourced by the GPU-machine checks that run jobs in Docker (root, repository root, STAGES and
# OUT set): `want STAGE` says whether a stage was asked for; $OUT/jobs holds the duty jobs'
# command files, BIN the carried gpuwatch; tracefs is mounted and dockerd started
# (docker_up.sh, which sets GPU_RUN). For duty_job.py containers: cmd NAME LINE hands a job its
# next command; ready NAME waits for it to start; done_wait FILE waits for a result it writes.
want() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p "$OUT/jobs"
BIN=$PWD/.device
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
. tests/gpu/docker_up.sh
cmd() { echo "$2" > "$OUT/jobs/$1.cmd.tmp" && mv "$OUT/jobs/$1.cmd.tmp" "$OUT/jobs/$1.cmd"; }
done_wait() { for _ in $(seq 120); do [ -f "$OUT/jobs/$1" ] && return; sleep 0.5; done; echo "no $1"; }
ready() { for _ in $(seq 240); do [ -f "$OUT/jobs/$1.ready" ] && return; sleep 0.5; done; echo "$1 never ready"; }
