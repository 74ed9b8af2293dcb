"""What the driver's energy counter returns and costs (GPU host, no Docker).

    python3 energy_probe.py

Through libnvidia-ml directly (ctypes): the cost of nvmlDeviceGetTotalEnergyConsumption and
nvmlDeviceGetPowerUsage per call (1,000 calls each), then 10 s idle and 10 s of bf16 matmuls:
the counter's increase each second against the power readings integrated over the same second
(20 readings), and how often the counter moves (its granularity)."""
import ctypes
import json
import threading
import time

nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
mj = ctypes.c_ulonglong()
mw = ctypes.c_uint()


def energy():
    rc = nvml.nvmlDeviceGetTotalEnergyConsumption(dev, ctypes.byref(mj))
    assert rc == 0, rc
    return mj.value


def power():
    assert nvml.nvmlDeviceGetPowerUsage(dev, ctypes.byref(mw)) == 0
    return mw.value


def cost(f, n=1000):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


out = {"energy_call_us": cost(energy), "power_call_us": cost(power)}
# Granularity: how long until the counter moves, and by how much.
steps, last, t_end = [], energy(), time.time() + 1
while time.time() < t_end:
    e = energy()
    if e != last:
        steps.append((time.time(), e - last))
        last = e
    time.sleep(0.001)
out["moves_per_second_idle"] = len(steps)


def phase(seconds):
    rows = []
    for _ in range(seconds):
        e0, t0, watts = energy(), time.time(), []
        while time.time() - t0 < 1.0:
            watts.append(power() / 1000)
            time.sleep(0.05)
        e1, t1 = energy(), time.time()
        rows.append({"counter_j": (e1 - e0) / 1000, "power_j": sum(watts) / len(watts) * (t1 - t0)})
    return rows


out["idle"] = phase(10)
stop = False


def work():
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop:
        a @ a
        torch.cuda.synchronize()


th = threading.Thread(target=work)
th.start()
time.sleep(3)
out["busy"] = phase(10)
stop = True
th.join()
for k in ("idle", "busy"):
    rows = out[k]
    c = sum(r["counter_j"] for r in rows)
    p = sum(r["power_j"] for r in rows)
    print(f"{k}: counter {c:.0f} J over {len(rows)} s, power readings integrated {p:.0f} J, ratio {c / p:.3f}; per second {[round(r['counter_j']) for r in rows]}")
print(f"energy call {out['energy_call_us']:.1f} µs, power call {out['power_call_us']:.1f} µs, counter moves {out['moves_per_second_idle']}/s idle")
json.dump(out, open("/tmp/sc/energy.json", "w"), indent=1)
