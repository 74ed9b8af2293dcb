"""Where a running agent's sampling thread spends its CPU, by step of a round, from its own
counter (`gpuwatch_sampling_cpu_seconds_total`), beside all its threads' CPU over the same span.
The counter is as of the last published round, and rounds are published when the GPU series
covers them (in batches, up to a series interval late): its rate is taken over the span between
the two rounds' own times (`gpuwatch_last_collection_timestamp_seconds`).

Usage: sampling_steps.py PID URL SECONDS (the agent's PID, its /metrics URL, the span)."""
import os
import sys
import time
import urllib.request


def steps(url):
    """The counter by step, and the time of the round it is from."""
    out, at = {}, None
    for line in urllib.request.urlopen(url).read().decode().splitlines():
        if line.startswith("gpuwatch_sampling_cpu_seconds_total{"):
            step = line.split('step="')[1].split('"')[0]
            out[step] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gpuwatch_last_collection_timestamp_seconds "):
            at = float(line.rsplit(" ", 1)[1])
    return out, at


def threads(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            ns = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
        except OSError:
            continue
        out[t] = (name, ns)
    return out


pid, url, span = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
(s0, r0), t0, w0 = steps(url), threads(pid), time.time()
time.sleep(span)
(s1, r1), t1, w1 = steps(url), threads(pid), time.time()
secs = w1 - w0
rounds_span = r1 - r0
print(f"threads over {secs:.1f} s; steps over the {rounds_span:.1f} s between the published rounds")
for k in s1:
    print(f"  step {k:14s} {(s1[k] - s0.get(k, 0)) * 1e3 / rounds_span:.3f} ms/s")
together = sum(s1.values()) - sum(s0.values())
print(f"  steps together     {together * 1e3 / rounds_span:.3f} ms/s")
for tid, (name, ns) in sorted(t1.items(), key=lambda x: -(x[1][1] - t0.get(x[0], (0, 0))[1])):
    d = ns - t0.get(tid, (name, 0))[1]
    if d > 0:
        print(f"  thread {name:16s} {d / 1e6 / secs:.3f} ms/s")
