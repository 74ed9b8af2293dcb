"""What an NVML client holds of the driver, and what a fresh init finds, on the GPU in front of it.

Run on the GPU machine (python3 with pynvml) from the repository root:
    python3 tests/gpu/nvml_rediscovery.py OUT_DIR
It prints, and writes to OUT_DIR/nvml_rediscovery.json:
  - the GPUs the kernel lists (/proc/driver/nvidia/gpus/, /dev/nvidiaN) beside NVML's PCI bus
    ids and minor numbers, so an agent can tell from the kernel's list whether NVML's is current;
  - this process's open /dev/nvidia* files and the nvidia modules' use counts before init,
    after init, after a handle query, and after shutdown: whether a client that keeps NVML open
    keeps the driver from being unloaded (or a GPU from being reset);
  - three shutdown/init cycles: how long each takes, whether the count, UUIDs and handles are the
    same, and what a call made between shutdown and init returns;
  - the device count over 200 calls within one init (whether it is re-read)."""
import ctypes
import json
import os
import sys
import time

import pynvml as N

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
report = {}


def nvidia_fds():
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            held.append(target)
    return sorted(held)


def module_uses():
    uses = {}
    with open("/proc/modules") as f:
        for line in f:
            name, _size, count, *_ = line.split()
            if name.startswith("nvidia"):
                # "-" where the kernel cannot unload modules (no use count kept)
                uses[name] = int(count) if count.isdigit() else count
    return uses


def held(tag):
    report.setdefault("held", {})[tag] = {"fds": nvidia_fds(), "module_uses": module_uses()}


def kernel_view():
    gpus_dir = "/proc/driver/nvidia/gpus"
    listing = sorted(os.listdir(gpus_dir)) if os.path.isdir(gpus_dir) else None
    nodes = sorted(
        n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()
    )
    return {"proc_driver_nvidia_gpus": listing, "dev_nodes": nodes}


def nvml_view():
    devices = []
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        pci = N.nvmlDeviceGetPciInfo(h)
        devices.append({
            "index": i,
            "uuid": N.nvmlDeviceGetUUID(h),
            "minor": N.nvmlDeviceGetMinorNumber(h),
            "bus_id": pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
            "bus_id_legacy": pci.busIdLegacy.decode() if isinstance(pci.busIdLegacy, bytes) else pci.busIdLegacy,
            "handle": int(ctypes.cast(h, ctypes.c_void_p).value or 0),
        })
    return devices


held("before init")
report["kernel"] = kernel_view()
t = time.perf_counter()
N.nvmlInit()
report["first_init_ms"] = (time.perf_counter() - t) * 1e3
held("after init")
report["driver"] = N.nvmlSystemGetDriverVersion()
first = nvml_view()
report["nvml"] = first
held("after handles")
counts = {N.nvmlDeviceGetCount() for _ in range(200)}
report["count_over_200_calls"] = sorted(counts)

cycles = []
for n in range(3):
    c = {}
    t = time.perf_counter()
    N.nvmlShutdown()
    c["shutdown_ms"] = (time.perf_counter() - t) * 1e3
    if n == 0:
        held("after shutdown")
    try:
        N.nvmlDeviceGetCount()
        c["count_while_shut"] = "succeeded"
    except N.NVMLError as e:
        c["count_while_shut"] = str(e)
    t = time.perf_counter()
    N.nvmlInit()
    c["init_ms"] = (time.perf_counter() - t) * 1e3
    view = nvml_view()
    c["count"] = len(view)
    c["same_uuids_in_order"] = [d["uuid"] for d in view] == [d["uuid"] for d in first]
    c["same_handles"] = [d["handle"] for d in view] == [d["handle"] for d in first]
    cycles.append(c)
report["cycles"] = cycles
N.nvmlShutdown()

print(json.dumps(report, indent=1))
with open(os.path.join(OUT, "nvml_rediscovery.json"), "w") as f:
    json.dump(report, f, indent=1)
