"""What NVML's utilisation paths return, and what each call costs, on the GPU in front of it.

Run on the GPU machine (python3 with torch and pynvml) from the repository root:
    python3 tests/gpu/nvml_semantics.py OUT_DIR
It drives tests/gpu/duty_job.py jobs through known duty cycles and, meanwhile, reads:
  - nvmlDeviceGetUtilizationRates every 100 ms (the device's latest sample);
  - nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES, last_seen) every second (the device series);
  - GPM (nvmlGpmSampleGet + nvmlGpmMetricsGet) over each second: graphics (engine) activity,
    SM activity, SM occupancy, tensor activity, DRAM bandwidth;
  - nvmlDeviceGetProcessUtilization(last_seen) every second and, with its own cursor, every
    100 ms; nvmlDeviceGetProcessesUtilizationInfo(last_seen) every second;
and prints, per scenario, what each path says against the jobs' own figures. It also times each
call (wall and this thread's CPU time) through ctypes with buffers reused, as an agent calls them.
Everything raw goes to OUT_DIR/nvml_semantics.json."""
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import time

import pynvml as N

OUT = sys.argv[1]
WORK = os.path.join(OUT, "jobs")
os.makedirs(WORK, exist_ok=True)
N.nvmlInit()
H = N.nvmlDeviceGetHandleByIndex(0)
fn = N._nvmlGetFunctionPointer
report = {"driver": N.nvmlSystemGetDriverVersion(), "nvml": N.nvmlSystemGetNVMLVersion(), "name": N.nvmlDeviceGetName(H)}

def tryit(f, *a):
    try:
        return f(*a)
    except N.NVMLError as e:
        return f"error: {e}"

report["accounting_mode"] = tryit(N.nvmlDeviceGetAccountingMode, H)
report["compute_mode"] = tryit(N.nvmlDeviceGetComputeMode, H)
report["gpm_supported"] = tryit(lambda: N.nvmlGpmQueryDeviceSupport(H).isSupportedDevice)

# --- raw ctypes callers with reused buffers -------------------------------------------------
util_t = N.c_nvmlUtilization_t()
def util_rates():
    r = fn("nvmlDeviceGetUtilizationRates")(H, ctypes.byref(util_t))
    return util_t.gpu if r == 0 else None

samples_buf = (N.c_nvmlSample_t * 4096)()
def device_samples(last):
    vt, cnt = N._nvmlValueType_t(), ctypes.c_uint(4096)
    r = fn("nvmlDeviceGetSamples")(H, N._nvmlSamplingType_t(N.NVML_GPU_UTILIZATION_SAMPLES), ctypes.c_ulonglong(last), ctypes.byref(vt), ctypes.byref(cnt), samples_buf)
    if r == N.NVML_ERROR_NOT_FOUND:
        return []
    if r != 0:
        return f"error {r}"
    return [(s.timeStamp, s.sampleValue.uiVal) for s in samples_buf[: cnt.value]]

def sizing(name, *args):
    """The count the driver asks for when called with no buffer."""
    cnt = ctypes.c_uint(0)
    if name == "nvmlDeviceGetProcessUtilization":
        r = fn(name)(H, None, ctypes.byref(cnt), ctypes.c_ulonglong(0))
    else:
        i = N.c_nvmlProcessesUtilizationInfo_v1_t()
        i.version = N.ProcessesUtilizationInfo_v1
        r = fn(name)(H, ctypes.byref(i))
        cnt.value = i.processSamplesCount
    return r, cnt.value

PROC_CAP = 4096
proc_buf = (N.c_nvmlProcessUtilizationSample_t * PROC_CAP)()
def proc_util(last):
    cnt = ctypes.c_uint(PROC_CAP)
    r = fn("nvmlDeviceGetProcessUtilization")(H, proc_buf, ctypes.byref(cnt), ctypes.c_ulonglong(last))
    if r == N.NVML_ERROR_NOT_FOUND:
        return []
    if r != 0:
        return f"error {r}"
    return [(s.pid, s.timeStamp, s.smUtil, s.memUtil) for s in proc_buf[: cnt.value]]

info_buf = (N.c_nvmlProcessUtilizationInfo_v1_t * PROC_CAP)()
info = N.c_nvmlProcessesUtilizationInfo_v1_t()
def procs_info(last):
    info.version = N.ProcessesUtilizationInfo_v1
    info.processSamplesCount = PROC_CAP
    info.lastSeenTimeStamp = last
    info.procUtilArray = info_buf
    r = fn("nvmlDeviceGetProcessesUtilizationInfo")(H, ctypes.byref(info))
    if r == N.NVML_ERROR_NOT_FOUND:
        return []
    if r != 0:
        return f"error {r}"
    return [(s.pid, s.timeStamp, s.smUtil, s.memUtil) for s in info_buf[: info.processSamplesCount]]

running_buf = (N.c_nvmlProcessInfo_t * 64)()
def running():
    cnt = ctypes.c_uint(64)
    return fn("nvmlDeviceGetComputeRunningProcesses_v3")(H, ctypes.byref(cnt), running_buf)

GPM_IDS = {"graphics": 1, "sm": 2, "occupancy": 3, "tensor": 5, "dram": 10}
gpm_ok = report["gpm_supported"] == 1
gpm_samples = []
if gpm_ok:
    for _ in range(2):
        s = N.c_nvmlGpmSample_t()
        fn("nvmlGpmSampleAlloc")(ctypes.byref(s))
        gpm_samples.append(s)
mg = N.c_nvmlGpmMetricsGet_t()
def gpm_sample(i):
    return fn("nvmlGpmSampleGet")(H, gpm_samples[i])
def gpm_metrics(older, newer, ids=GPM_IDS):
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = gpm_samples[older], gpm_samples[newer]
    for k, mid in enumerate(ids.values()):
        mg.metrics[k].metricId = mid
    r = fn("nvmlGpmMetricsGet")(ctypes.byref(mg))
    if r != 0:
        return f"error {r}"
    return {name: (mg.metrics[k].value if mg.metrics[k].nvmlReturn == 0 else None) for k, name in enumerate(ids)}

def timed(label, call, n):
    walls, cpus = [], []
    for _ in range(n):
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        call()
        cpus.append((time.thread_time_ns() - c) / 1e3)
        walls.append((time.perf_counter_ns() - w) / 1e3)
    return {"call": label, "n": n, "wall_us_median": statistics.median(walls), "cpu_us_median": statistics.median(cpus), "cpu_us_mean": statistics.mean(cpus)}

def recent():
    return int((time.time() - 1.0) * 1e6)

def costs(tag):
    out = [
        timed("GetUtilizationRates", util_rates, 200),
        timed("GetComputeRunningProcesses_v3", running, 100),
        timed("GetSamples(GPU_UTILIZATION, 0)", lambda: device_samples(0), 10),
        timed("GetSamples(GPU_UTILIZATION, now-1s)", lambda: device_samples(recent()), 10),
        timed("GetProcessUtilization(0)", lambda: proc_util(0), 10),
        timed("GetProcessUtilization(now-1s)", lambda: proc_util(recent()), 10),
        timed("GetProcessesUtilizationInfo(now-1s)", lambda: procs_info(recent()), 10),
    ]
    if gpm_ok:
        gpm_sample(0); time.sleep(0.15)
        out.append(timed("GpmSampleGet", lambda: gpm_sample(1), 20))
        time.sleep(0.15); gpm_sample(1)
        for n in (1, 2, 5):
            ids = dict(list(GPM_IDS.items())[:n])
            out.append(timed(f"GpmMetricsGet({n} metrics)", lambda: gpm_metrics(0, 1, ids), 10))
    for o in out:
        o["load"] = tag
    return out

# --- jobs ----------------------------------------------------------------------------------
def start_job(name):
    return subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "duty_job.py"), WORK, name])

def wait_ready(names):
    deadline = time.time() + 120
    while time.time() < deadline and not all(os.path.exists(f"{WORK}/{n}.ready") for n in names):
        time.sleep(0.1)
    return {n: open(f"{WORK}/{n}.ready").read().split() for n in names}

def command(name, line):
    tmp = f"{WORK}/{name}.cmd.tmp"
    open(tmp, "w").write(line)
    os.rename(tmp, f"{WORK}/{name}.cmd")

def scenario(tag, cmds, seconds):
    """cmds: {job: (mode, duty)}. Reads every path while the jobs run."""
    last_dev = last_p1 = last_p100 = last_info = int(time.time() * 1e6)
    for job, (mode, duty) in cmds.items():
        command(job, f"{mode} {duty} {seconds} {tag}")
    rec = {"tag": tag, "rates_jittered": [], "rates_100ms": [], "device_samples": [], "gpm_1s": [], "proc_1s": [], "proc_100ms": [], "info_1s": []}
    if gpm_ok:
        gpm_sample(0)
    cur = 0
    t0 = time.time()
    tick = 0
    while time.time() - t0 < seconds - 0.05:
        tick += 1
        rec["rates_100ms"].append((time.time(), util_rates()))
        p = proc_util(last_p100)
        if isinstance(p, list) and p:
            last_p100 = max(s[1] for s in p)
        rec["proc_100ms"].append((time.time(), p))
        if tick % 10 == 0:
            d = device_samples(last_dev)
            if isinstance(d, list) and d:
                last_dev = max(s[0] for s in d)
            rec["device_samples"].append((time.time(), d))
            p = proc_util(last_p1)
            if isinstance(p, list) and p:
                last_p1 = max(s[1] for s in p)
            rec["proc_1s"].append((time.time(), p))
            i = procs_info(last_info)
            if isinstance(i, list) and i:
                last_info = max(s[1] for s in i)
            rec["info_1s"].append((time.time(), i))
            if gpm_ok:
                gpm_sample(1 - cur)
                rec["gpm_1s"].append((time.time(), gpm_metrics(cur, 1 - cur)))
                cur = 1 - cur
        # a second, random-phase reading of GetUtilizationRates within this tick
        time.sleep(max(0.0, t0 + (tick - 1 + random.random()) * 0.1 - time.time()))
        rec["rates_jittered"].append((time.time(), util_rates()))
        time.sleep(max(0.0, t0 + tick * 0.1 - time.time()))
    deadline = time.time() + 30
    while time.time() < deadline and not all(os.path.exists(f"{WORK}/{j}.{tag}.json") for j in cmds):
        time.sleep(0.05)
    rec["jobs"] = {j: json.load(open(f"{WORK}/{j}.{tag}.json")) for j in cmds}
    return rec

def summarise(rec):
    rates = [u for _, u in rec["rates_100ms"][10:] if u is not None]
    dev = [v for _, d in rec["device_samples"][1:] if isinstance(d, list) for _, v in d]
    print(f"\n== {rec['tag']}")
    for j, r in rec["jobs"].items():
        gf = r["gpu_fraction"]
        print(f"  job {j} pid {r['pid']} {r['mode']} duty {r['duty']}: wall {r['wall_fraction']:.3f}, gpu time {'-' if gf is None else f'{gf:.3f}'}")
    jit = [u for _, u in rec["rates_jittered"][10:] if u is not None]
    print(f"  GetUtilizationRates @100ms mean {statistics.mean(rates):.1f} (n {len(rates)}); at random phase {statistics.mean(jit):.1f}")
    print(f"  GetSamples per 1 s call: counts {[len(d) if isinstance(d, list) else d for _, d in rec['device_samples']]}, mean value {statistics.mean(dev) if dev else '-'}")
    if rec["gpm_1s"]:
        g = [m for _, m in rec["gpm_1s"][1:] if isinstance(m, dict)]
        for k in GPM_IDS:
            vals = [m[k] for m in g if m[k] is not None]
            print(f"  GPM {k:<9} per 1 s: {' '.join(f'{v:.1f}' for v in vals)}")
    for key in ("proc_1s", "info_1s", "proc_100ms"):
        pids = {}
        for _, p in rec[key]:
            if isinstance(p, list):
                for s in p:
                    pids.setdefault(s[0], []).append(s[2])
        counts = [len(p) if isinstance(p, list) else p for _, p in rec[key]]
        print(f"  {key}: samples per call {counts[:12]}{'...' if len(counts) > 12 else ''}; per pid: " + ", ".join(f"{pid}: n {len(v)} mean sm {statistics.mean(v):.1f}" for pid, v in pids.items()))

report["sizing_idle"] = {n: sizing(n) for n in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo")}
jobs = {n: start_job(n) for n in ("A", "B")}
report["idle_costs"] = costs("idle")
ready = wait_ready(jobs)
report["ready"] = ready
print("jobs ready:", ready)
SCEN = [
    ("one_full", {"A": ("matmul", 1.0)}),
    ("one_40pct", {"A": ("matmul", 0.4)}),
    ("two_70_30", {"A": ("matmul", 0.7), "B": ("matmul", 0.3)}),
    ("two_full", {"A": ("matmul", 1.0), "B": ("matmul", 1.0)}),
    ("one_spin", {"A": ("spin", 1.0)}),
]
report["scenarios"] = []
for tag, cmds in SCEN:
    rec = scenario(tag, cmds, 7)
    report["scenarios"].append(rec)
    summarise(rec)
    if tag in ("one_full", "two_70_30"):
        report.setdefault("sizing_busy", {})[tag] = {n: sizing(n) for n in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo")}
        print("  sizing answer (rc, count):", report["sizing_busy"][tag])
    if tag == "one_full":
        command("A", f"matmul 1.0 6 costs")
        time.sleep(0.5)
        report["busy_costs"] = costs("one process at 100%")
        while not os.path.exists(f"{WORK}/A.costs.json"):
            time.sleep(0.05)
for j in jobs:
    command(j, "quit")
for j in jobs.values():
    j.wait(timeout=30)
print("\n== call costs (median wall / median CPU / mean CPU, us)")
for c in report["idle_costs"] + report.get("busy_costs", []):
    print(f"  {c['load']:<22} {c['call']:<32} {c['wall_us_median']:>9.1f} {c['cpu_us_median']:>9.1f} {c['cpu_us_mean']:>9.1f}")
print({k: report[k] for k in ("driver", "nvml", "name", "accounting_mode", "compute_mode", "gpm_supported", "sizing_idle")})
history = device_samples(0)
print("device samples kept by the driver:", len(history) if isinstance(history, list) else history,
      "spanning", (history[-1][0] - history[0][0]) / 1e6 if isinstance(history, list) and history else "-", "s")
full = next(r for r in report["scenarios"] if r["tag"] == "one_full")
n_full = full["jobs"]["A"]["matmuls"]
g_full = statistics.mean(m["graphics"] for _, m in full["gpm_1s"][1:]) / 100 if full["gpm_1s"] else 1.0
per_mm = g_full * 7 / n_full
print(f"calibration: one matmul = {per_mm * 1e3:.3f} ms of GPU time (one_full: {n_full} matmuls, GPM graphics {g_full:.3f})")
for r in report["scenarios"]:
    for j, res in r["jobs"].items():
        if res.get("matmuls") is not None:
            print(f"  {r['tag']:<10} job {j} pid {res['pid']}: GPU time share {res['matmuls'] * per_mm / 7:.3f} (wall in bursts {res['wall_fraction']:.3f})")
json.dump(report, open(os.path.join(OUT, "nvml_semantics.json"), "w"))
