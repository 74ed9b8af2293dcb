#!/usr/bin/env python3
"""What NVML itself keeps resident in a process, step by step, in the order the agent calls it:
resident anonymous and file-backed memory after each step, whether libcuda is mapped, and what
glibc gives back on `malloc_trim(0)`. The figures are deltas from the interpreter's own.

Usage: nvml_memory.py [--flags N] (on a GPU machine; pynvml only, no torch: torch would map
libcuda). `--flags` starts NVML with `nvmlInitWithFlags(N)` (2: don't attach GPUs) instead of
`nvmlInit`. At the end it prints the largest resident mappings and the file mapped just before
each anonymous one (an anonymous mapping right after a library's data is that library's .bss)."""
import ctypes
import os
import sys

import pynvml as n


def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "VmHWM", "Threads"):
                out[k] = int(v.split()[0])
    with open("/proc/self/maps") as f:
        out["libcuda"] = any("libcuda" in l for l in f)
    return out


base = status()


def show(step):
    s = status()
    print(
        f"{step:<40} anon {(s['RssAnon'] - base['RssAnon']) / 1024:6.1f} MiB"
        f"  file {(s['RssFile'] - base['RssFile']) / 1024:6.1f} MiB"
        f"  peak {(s['VmHWM'] - base['VmHWM']) / 1024:6.1f} MiB"
        f"  threads {s['Threads']}  libcuda mapped: {s['libcuda']}"
    )


def largest_mappings(count=6):
    rows, cur, prev_file = [], None, ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                path = head[5] if len(head) > 5 else ""
                cur = [0, head[1], path or f"[anon after {prev_file}]"]
                rows.append(cur)
                if path and not path.startswith("["):
                    prev_file = os.path.basename(path)
            elif head[0] == "Rss:" and cur is not None:
                cur[0] = int(head[1])
    for rss, perm, name in sorted(rows, reverse=True)[:count]:
        print(f"  {rss / 1024:6.1f} MiB {perm} {name}")


libc = ctypes.CDLL("libc.so.6")
flags = int(sys.argv[sys.argv.index("--flags") + 1]) if "--flags" in sys.argv else None
show("start")
if flags is None:
    n.nvmlInit()
    show("nvmlInit")
else:
    n.nvmlInitWithFlags(flags)
    show(f"nvmlInitWithFlags({flags})")
largest_mappings(3)
h = n.nvmlDeviceGetHandleByIndex(0)
n.nvmlDeviceGetUUID(h)
n.nvmlDeviceGetName(h)
show("handle, UUID, name")
for _ in range(3):
    n.nvmlDeviceGetUtilizationRates(h)
    n.nvmlDeviceGetMemoryInfo(h)
    n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
    n.nvmlDeviceGetPowerUsage(h)
    n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
    n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    n.nvmlDeviceGetComputeRunningProcesses(h)
show("a round's readings and process list")
try:
    n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, 0)
except n.NVMLError as e:
    print("GetSamples:", e)
show("utilisation series (GetSamples)")
try:
    n.nvmlDeviceGetProcessUtilization(h, 0)
except n.NVMLError as e:
    print("GetProcessUtilization:", e)
show("per-process split (GetProcessUtilization)")
try:
    samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
    show("two GPM samples allocated")
    n.nvmlGpmSampleGet(h, samples[0])
    import time

    time.sleep(0.2)
    n.nvmlGpmSampleGet(h, samples[1])
    show("two GPM samples taken")
except (n.NVMLError, AttributeError) as e:
    print("GPM:", e)
libc.malloc_trim(0)
show("after malloc_trim(0)")


largest_mappings()
