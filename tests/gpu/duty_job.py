"""A GPU job with a known duty cycle and its own ground truth, driven by command files.

Started as `duty_job.py DIR NAME`, it loads PyTorch, times one 8192x8192 bf16 matmul alone on the
GPU, writes DIR/NAME.ready and then waits for DIR/NAME.cmd: a line `MODE DUTY SECONDS TAG`, where
MODE is `matmul` (bursts of matmuls for DUTY of every 200 ms period, asleep the rest) or `spin`
(one single-thread spinning kernel after another: the GPU "busy" while its SMs idle). It runs the
command, writes DIR/NAME.TAG.json with what it did, removes the command and waits for the next;
`quit` ends it.

The job's own measurements: `wall_fraction` is the share of the run spent inside its bursts (from
the burst's first launch to its synchronize), `gpu_fraction` is the GPU time its kernels took,
counted as matmuls done x the solo time of one matmul: under time-slicing with another job, the
GPU time it actually got."""
import json
import os
import sys
import time

import torch

PERIOD = 0.2
work_dir, name = sys.argv[1], sys.argv[2]
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    c = a @ a
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    c = a @ a
end.record()
torch.cuda.synchronize()
solo_s = start.elapsed_time(end) / 1000 / 20
open(os.path.join(work_dir, f"{name}.ready"), "w").write(f"{os.getpid()} {solo_s}\n")


def matmul(duty, seconds):
    n, inside = 0, 0.0
    marks = []
    t_end = time.time() + seconds
    period_start = time.time()
    while period_start < t_end:
        marks.append((time.time(), n))
        t0 = time.time()
        while time.time() - period_start < duty * PERIOD:
            c = a @ a
            torch.cuda.synchronize()
            n += 1
        inside += time.time() - t0
        period_start += PERIOD
        time.sleep(max(0.0, period_start - time.time()))
    marks.append((time.time(), n))
    return {"matmuls": n, "wall_fraction": inside / seconds, "gpu_fraction": n * solo_s / seconds, "marks": marks}


def spin(seconds):
    t_end = time.time() + seconds
    n = 0
    while time.time() < t_end:
        torch.cuda._sleep(20_000_000)  # ~10 ms on one thread at ~2 GHz
        torch.cuda.synchronize()
        n += 1
    return {"kernels": n, "wall_fraction": 1.0, "gpu_fraction": None, "marks": []}


cmd_path = os.path.join(work_dir, f"{name}.cmd")
while True:
    if not os.path.exists(cmd_path):
        time.sleep(0.005)
        continue
    words = open(cmd_path).read().split()
    if not words or words[0] == "quit":
        break
    mode, duty, seconds, tag = words[0], float(words[1]), float(words[2]), words[3]
    t0 = time.time()
    result = matmul(duty, seconds) if mode == "matmul" else spin(seconds)
    result.update({"pid": os.getpid(), "mode": mode, "duty": duty, "t_start": t0, "t_end": time.time(), "solo_matmul_s": solo_s})
    json.dump(result, open(os.path.join(work_dir, f"{name}.{tag}.json"), "w"))
    os.remove(cmd_path)
