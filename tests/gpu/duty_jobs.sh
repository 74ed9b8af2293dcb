# Sourced by the GPU-machine checks that drive duty_job.py containers through command files
# in $OUT/jobs: cmd NAME LINE hands a job its next command; ready NAME waits for it to start;
# done_wait FILE waits for a result it writes.
cmd() { echo "$2" > "$OUT/jobs/$1.cmd.tmp" && mv "$OUT/jobs/$1.cmd.tmp" "$OUT/jobs/$1.cmd"; }
done_wait() { for _ in $(seq 120); do [ -f "$OUT/jobs/$1" ] && return; sleep 0.5; done; echo "no $1"; }
ready() { for _ in $(seq 240); do [ -f "$OUT/jobs/$1.ready" ] && return; sleep 0.5; done; echo "$1 never ready"; }
