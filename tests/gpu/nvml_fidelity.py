"""The driver behaviours the fake NVML copies and had not measured, on the GPU in front of it.

    python3 tests/gpu/nvml_fidelity.py OUT_DIR

- `nvmlDeviceGetSamples` with a null buffer: its return code and the count it asks for (the
  agent sizes its buffer this way);
- the device's used memory against the sum of its processes' (what the driver keeps for
  itself), idle and with one PyTorch process holding 1 GiB, then two;
- the volatile and aggregate uncorrected ECC counters as they read (a counter the driver resets
  only with the GPU).
Prints each and writes OUT_DIR/nvml_fidelity.json."""
import ctypes
import json
import os
import subprocess
import sys
import time

import pynvml as N

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
N.nvmlInit()
H = N.nvmlDeviceGetHandleByIndex(0)
fn = N._nvmlGetFunctionPointer
report = {"driver": N.nvmlSystemGetDriverVersion(), "name": N.nvmlDeviceGetName(H)}


def samples_sizing():
    vt, cnt = N._nvmlValueType_t(), ctypes.c_uint(0)
    r = fn("nvmlDeviceGetSamples")(H, N._nvmlSamplingType_t(N.NVML_GPU_UTILIZATION_SAMPLES),
                                   ctypes.c_ulonglong(0), ctypes.byref(vt), ctypes.byref(cnt), None)
    return {"rc": r, "count": cnt.value}


def memory():
    used = N.nvmlDeviceGetMemoryInfo(H).used
    procs = N.nvmlDeviceGetComputeRunningProcesses(H)
    held = sum(p.usedGpuMemory or 0 for p in procs)
    return {"used": used, "processes": len(procs), "processes_sum": held,
            "driver_mib": (used - held) / 2**20}


def ecc():
    out = {}
    for name, counter in (("volatile", N.NVML_VOLATILE_ECC), ("aggregate", N.NVML_AGGREGATE_ECC)):
        try:
            out[name] = N.nvmlDeviceGetTotalEccErrors(H, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)
        except N.NVMLError as e:
            out[name] = f"error: {e}"
    return out


HOLD = ("import torch, sys, time; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('held', flush=True); time.sleep(60)")
report["samples_null_buffer"] = samples_sizing()
report["memory_idle"] = memory()
jobs = []
for n in (1, 2):
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    jobs.append(p)
    time.sleep(1)
    report[f"memory_{n}_holding_1gib"] = memory()
report["ecc_uncorrected"] = ecc()
for p in jobs:
    p.kill()
    p.wait()
for k, v in report.items():
    print(f"{k}: {v}")
json.dump(report, open(os.path.join(OUT, "nvml_fidelity.json"), "w"), indent=1)
