"""The host's CPU as SageMaker Debugger's profiler records it, once a second until killed:
per-core utilisation (CPUUtilization) and the share of CPU time waiting on I/O
(I/OWaitPercentage), from /proc/stat, written to argv[1] as [[unix_time, [core %...], iowait %],
...] (rewritten each second). tests/gpu/score_accuracy.py scores the SageMaker rules on it."""
import json
import os
import sys
import time


def read():
    cores, total = [], None
    for line in open("/proc/stat"):
        if not line.startswith("cpu"):
            break
        f = [int(x) for x in line.split()[1:]]
        idle, iowait = f[3], f[4]
        row = (sum(f[:8]), idle + iowait, iowait)
        if line.startswith("cpu "):
            total = row
        else:
            cores.append(row)
    return cores, total


out, series = sys.argv[1], []
prev = read()
while True:
    time.sleep(1)
    now = read()
    cores = []
    for (t1, i1, _), (t0, i0, _) in zip(now[0], prev[0]):
        dt = max(t1 - t0, 1)
        cores.append(100.0 * (1 - (i1 - i0) / dt))
    dt = max(now[1][0] - prev[1][0], 1)
    iowait = 100.0 * (now[1][2] - prev[1][2]) / dt
    series.append([time.time(), cores, iowait])
    prev = now
    json.dump(series, open(out + ".tmp", "w"))
    os.replace(out + ".tmp", out)
