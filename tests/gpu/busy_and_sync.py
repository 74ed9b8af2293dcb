"""What the GPU's busy figures count, and what a synchronising thread does, measured (GPU
machine, pynvml with GPM; one process, nothing else on the GPU):

    python3 busy_and_sync.py OUT.json

1. For 4 s each: synchronous copies from pinned memory, from pageable memory, bf16 matmuls,
   and nothing: NVML's utilisation (nvmlDeviceGetUtilizationRates, sampled every 100 ms), and
   GPM's graphics-engine activity, SM activity and PCIe receive rate over the span. Does the
   engine activity count copies as utilisation does?
2. The CPU time of the calling thread while it waits 2 s for a kernel in
   torch.cuda.synchronize(), in loss.item() (a stream synchronise) and in an event's
   synchronize(): does it spin (CPU ~ wall) or sleep?
"""
import ctypes
import json
import sys
import threading
import time

import pynvml as n
import torch

out = sys.argv[1]
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
dev = torch.device("cuda")
result = {"gpu": n.nvmlDeviceGetName(h)}


fn = n._nvmlGetFunctionPointer
GPM = {"graphics_util": 1, "sm_util": 2, "pcie_rx_mib_s": 21}
gs = []
for _ in range(2):
    smp = n.c_nvmlGpmSample_t()
    fn("nvmlGpmSampleAlloc")(ctypes.byref(smp))
    gs.append(smp)
mg = n.c_nvmlGpmMetricsGet_t()


def gpm_span(body, seconds=4.0):
    utils = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            utils.append(n.nvmlDeviceGetUtilizationRates(h).gpu)
            time.sleep(0.1)

    t = threading.Thread(target=poll)
    t.start()
    fn("nvmlGpmSampleGet")(h, gs[0])
    end = time.time() + seconds
    while time.time() < end:
        body()
    torch.cuda.synchronize()
    fn("nvmlGpmSampleGet")(h, gs[1])
    stop.set()
    t.join()
    mg.version = n.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(GPM)
    mg.sample1, mg.sample2 = gs[0], gs[1]
    for k, mid in enumerate(GPM.values()):
        mg.metrics[k].metricId = mid
    got = {"nvml_util_mean": round(sum(utils) / max(1, len(utils)), 1)}
    if fn("nvmlGpmMetricsGet")(ctypes.byref(mg)) == 0:
        for k, name in enumerate(GPM):
            got[name] = round(mg.metrics[k].value, 2) if mg.metrics[k].nvmlReturn == 0 else None
    return got


pinned = torch.empty(256 << 20, dtype=torch.float32).pin_memory()
pageable = torch.empty(64 << 20, dtype=torch.float32)
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
result["pinned_sync_copies"] = gpm_span(lambda: pinned.to(dev, non_blocking=False))
result["pageable_copies"] = gpm_span(lambda: pageable.to(dev))
result["matmuls"] = gpm_span(lambda: [a @ a for _ in range(10)])
result["nothing"] = gpm_span(lambda: time.sleep(0.1))


def waited(how):
    x = torch.zeros(1, device=dev)
    torch.cuda._sleep(10)
    torch.cuda.synchronize()
    cycles = int(2.0 * 1.98e9)  # ~2 s at the SM clock
    torch.cuda._sleep(cycles)
    x.add_(1)
    w0, c0 = time.time(), time.thread_time()
    if how == "synchronize":
        torch.cuda.synchronize()
    elif how == "item":
        x.item()
    else:
        e = torch.cuda.Event()
        e.record()
        e.synchronize()
    return {"wall_s": round(time.time() - w0, 3), "thread_cpu_s": round(time.thread_time() - c0, 3)}


result["sync_wait"] = {how: waited(how) for how in ("synchronize", "item", "event")}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
