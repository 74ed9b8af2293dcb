"""Which CUDA driver entry points a PyTorch job calls, and how often, measured with tracefs
uprobes on the driver library itself (root, GPU machine; no gpuwatch needed):

    python3 tests/gpu/cuda_calls.py OUT_DIR [SCENARIO_SECONDS]

1. Finds libcuda.so.1 as a CUDA process maps it, lists its exported launch, copy and
   synchronise symbols (file offsets from its program headers), and puts a tracefs uprobe on
   each (copies fetch their third argument, the byte count).
2. Runs micro-jobs in this process (pageable and pinned copies both ways, one-element kernels,
   torch.cuda.synchronize, .item(), an event's synchronize, a CUDA graph's replay) and prints
   each probe's hits per job: what the fake driver library and gpuwatch's probe list copy.
3. A uretprobe on the synchronise call (a return probe on the squashfs-mounted library), and
   the launch loop's rate without probes, with entry probes, and with entry and return probes.
4. Runs each scenario of host_job.py for SCENARIO_SECONDS with the probes counting and NVML
   sampled each second (device utilisation series, GPM SM activity and PCIe receive/transmit),
   and prints per scenario: steps, launches/s, copies/s and bytes, syncs/s, utilisation, PCIe,
   SM activity, and the job's own shares. Everything also goes to OUT_DIR as JSON."""
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

OUT = sys.argv[1]
SCEN_S = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
os.makedirs(OUT, exist_ok=True)
T = "/sys/kernel/tracing"
if not os.path.exists(f"{T}/uprobe_events"):
    subprocess.run(["mount", "-t", "tracefs", "nodev", T], check=True)
report = {}

import torch  # noqa: E402

torch.zeros(1, device="cuda")
lib = next(l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l)
st = os.stat(lib)
report["lib"] = {"path": lib, "realpath": os.path.realpath(lib), "size": st.st_size,
                 "dev": st.st_dev, "ino": st.st_ino,
                 "mount": next((l.strip() for l in open("/proc/self/mountinfo") if " squashfs " in l), None)}
print("library:", report["lib"], flush=True)


def elf_symbols(path):
    """Exported function symbols of an ELF64 little-endian shared object: name -> file offset."""
    data = open(path, "rb").read()
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_memsz, p_offset))
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    out = {}
    for sh in sections:
        if sh[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sh[6]]
        for k in range(sh[5] // 24):
            st_name, st_info, _, st_shndx, st_value, _ = struct.unpack_from("<IBBHQQ", data, sh[4] + k * 24)
            if st_shndx == 0 or (st_info & 0xF) != 2:  # defined functions only
                continue
            end = data.index(b"\0", strtab[4] + st_name)
            name = data[strtab[4] + st_name:end].decode()
            for vaddr, memsz, off in loads:
                if vaddr <= st_value < vaddr + memsz:
                    out[name] = st_value - vaddr + off
    return out


syms = elf_symbols(lib)
want = re.compile(r"^cu(Launch|Memcpy|StreamSynchronize|CtxSynchronize|EventSynchronize|GraphLaunch|"
                  r"StreamWaitEvent|EventRecord|LaunchHostFunc|StreamQuery|EventQuery|GetProcAddress)")
picked = sorted(n for n in syms if want.match(n))
report["symbols"] = {n: hex(syms[n]) for n in picked}
print(f"{len(syms)} exported functions, {len(picked)} picked", flush=True)


def tw(path, text, append=True):
    # os.open: Python's append mode seeks to the end, which tracefs files refuse (EINVAL)
    fd = os.open(f"{T}/{path}", os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC))
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def event_name(sym):
    return re.sub(r"[^A-Za-z0-9_]", "_", sym)[:60]


tw("uprobe_events", "", append=False)
for n in picked:
    arg = " n=%dx:u64" if n.startswith("cuMemcpy") else ""
    tw("uprobe_events", f"p:gw/{event_name(n)} {lib}:{syms[n]:#x}{arg}")
sync_sym = "cuStreamSynchronize" if "cuStreamSynchronize" in syms else picked[0]
tw("uprobe_events", f"r:gwr/{event_name(sync_sym)}_ret {lib}:{syms[sync_sym]:#x}")
tw("events/gw/enable", "1")
tw("events/gwr/enable", "1")
tw("buffer_size_kb", "8192", append=False)


def profile():
    hits = {}
    for line in open(f"{T}/uprobe_profile"):
        parts = line.split()
        if len(parts) >= 3 and parts[-2].startswith(("gw/", "gwr/")):
            hits[parts[-2]] = int(parts[-1])
        elif len(parts) >= 3:
            hits[parts[-2]] = int(parts[-1])
    return hits


def measure(name, fn):
    tw("trace", "", append=False)
    before = profile()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    after = profile()
    diff = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    copies = [l.strip() for l in open(f"{T}/trace") if "cuMemcpy" in l][:6]
    report.setdefault("micro", {})[name] = {"hits": diff, "wall_s": wall, "copy_trace": copies}
    print(f"== {name} ({wall * 1e3:.1f} ms): {diff}", flush=True)
    for c in copies:
        print("   ", c[-160:])


dev = torch.device("cuda")
page = torch.randn(16 << 20)  # 64 MiB
pin = torch.randn(16 << 20).pin_memory()
g = torch.randn(16 << 20, device=dev)
one = torch.zeros(1, device=dev)
measure("h2d pageable 64 MiB x4", lambda: [page.to(dev) for _ in range(4)])
measure("h2d pinned non_blocking 64 MiB x4", lambda: [pin.to(dev, non_blocking=True) for _ in range(4)])
measure("h2d pinned blocking 64 MiB x4", lambda: [pin.to(dev) for _ in range(4)])
measure("d2h pageable 64 MiB x4", lambda: [g.cpu() for _ in range(4)])
measure("d2h into pinned non_blocking x4", lambda: [pin.copy_(g, non_blocking=True) for _ in range(4)])
measure("d2d 64 MiB x4", lambda: [g.clone() for _ in range(4)])
measure("launch one-element x1000", lambda: [one.add_(1) for _ in range(1000)])
measure("torch.cuda.synchronize x100", lambda: [torch.cuda.synchronize() for _ in range(100)])
measure("item x100", lambda: [one.sum().item() for _ in range(100)])


def event_sync():
    for _ in range(100):
        e = torch.cuda.Event()
        e.record()
        e.synchronize()


measure("event synchronize x100", event_sync)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    one.add_(1)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph, stream=s):
    for _ in range(10):
        one.add_(1)
measure("graph replay x100 (10 kernels each)", lambda: [graph.replay() for _ in range(100)])
conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
torch.backends.cudnn.benchmark = True
measure("cudnn.benchmark autotune, one new shape", lambda: conv(torch.randn(8, 64, 57, 61, device=dev)))


def launch_rate(n=200_000):
    one.add_(1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        one.add_(1)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


tw("tracing_on", "0", append=False)
rates = {}
for mode in ("none", "entry", "entry+return", "none again", "entry again", "entry+return again"):
    base = mode.replace(" again", "")
    tw("events/gw/enable", "0" if base == "none" else "1", append=False)
    tw("events/gwr/enable", "1" if base == "entry+return" else "0", append=False)
    if base == "entry+return":
        # a return probe on the launch call too, as timing every launch would need
        tw("events/gwr/enable", "0", append=False)
        tw("uprobe_events", f"-:gwr/{event_name(sync_sym)}_ret")
        tw("uprobe_events", f"r:gwr/launch_ret {lib}:{syms['cuLaunchKernel']:#x}")
        tw("events/gwr/enable", "1", append=False)
    rates[mode] = launch_rate()
    if base == "entry+return":
        tw("events/gwr/enable", "0", append=False)
        tw("uprobe_events", "-:gwr/launch_ret")
        tw("uprobe_events", f"r:gwr/{event_name(sync_sym)}_ret {lib}:{syms[sync_sym]:#x}")
    print(f"launch loop, probes {mode}: {rates[mode]:,.0f} launches/s", flush=True)
report["launch_rate_by_probes"] = rates
tw("events/gw/enable", "1", append=False)
tw("events/gwr/enable", "1", append=False)

# --- scenarios, with NVML sampled
import pynvml as N  # noqa: E402

N.nvmlInit()
H = N.nvmlDeviceGetHandleByIndex(0)
fn = N._nvmlGetFunctionPointer
GPM = {"graphics": 1, "sm": 2, "pcie_tx": 20, "pcie_rx": 21}
gs = []
for _ in range(2):
    smp = N.c_nvmlGpmSample_t()
    fn("nvmlGpmSampleAlloc")(ctypes.byref(smp))
    gs.append(smp)
mg = N.c_nvmlGpmMetricsGet_t()


def gpm(older, newer):
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(GPM)
    mg.sample1, mg.sample2 = gs[older], gs[newer]
    for k, mid in enumerate(GPM.values()):
        mg.metrics[k].metricId = mid
    if fn("nvmlGpmMetricsGet")(ctypes.byref(mg)) != 0:
        return None
    return {name: (mg.metrics[k].value if mg.metrics[k].nvmlReturn == 0 else None) for k, name in enumerate(GPM)}


def sample_nvml(stop, rec):
    last = int(time.time() * 1e6)
    cur = 0
    fn("nvmlGpmSampleGet")(H, gs[cur])
    while not stop.is_set():
        time.sleep(1)
        fn("nvmlGpmSampleGet")(H, gs[1 - cur])
        rec["gpm"].append(gpm(cur, 1 - cur))
        cur = 1 - cur
        try:
            _, samples = N.nvmlDeviceGetSamples(H, N.NVML_GPU_UTILIZATION_SAMPLES, last)
            for x in samples:
                if x.timeStamp > last:
                    rec["util"].append(x.sampleValue.uiVal)
            if samples:
                last = max(x.timeStamp for x in samples)
        except N.NVMLError:
            pass
        t = time.perf_counter()
        rx = N.nvmlDeviceGetPcieThroughput(H, N.NVML_PCIE_UTIL_RX_BYTES)
        rec["pcie_counter_rx_kbps"].append(rx)
        rec["pcie_counter_cost_ms"].append((time.perf_counter() - t) * 1e3)


del page, pin, g
torch.cuda.empty_cache()
for scenario in ("pageable", "pinned", "launch", "trainer_cpu", "sync", "gpu_bound", "low_sm", "idle"):
    truth = f"{OUT}/truth_{scenario}.json"
    job = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "host_job.py"), truth,
                            scenario, str(SCEN_S)], stdout=subprocess.PIPE, text=True)
    for line in job.stdout:
        if line.startswith("ready"):
            break
    time.sleep(1.0)
    rec = {"gpm": [], "util": [], "pcie_counter_rx_kbps": [], "pcie_counter_cost_ms": []}
    before = profile()
    t0 = time.time()
    stop = threading.Event()
    th = threading.Thread(target=sample_nvml, args=(stop, rec))
    th.start()
    time.sleep(max(1.0, SCEN_S - 3))
    after = profile()
    span = time.time() - t0
    stop.set()
    th.join()
    job.wait()
    hits = {k: (after[k] - before.get(k, 0)) / span for k in after if after[k] - before.get(k, 0)}
    tr = json.load(open(truth))
    st = tr["steps"]
    tot = sum(x["d"] for x in st) or 1
    shares = {k: sum(x.get(k, 0) for x in st) / tot for k in ("copy_s", "sync_s", "cpu_s", "gpu_s")}
    g = [x for x in rec["gpm"] if x]
    mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
    row = {
        "steps_per_s": len(st) / tot, "shares": shares, "calibration": tr["calibration"],
        "hits_per_s": hits, "util_mean": mean(rec["util"]),
        "gpm_sm": mean([x["sm"] for x in g if x["sm"] is not None]),
        "gpm_graphics": mean([x["graphics"] for x in g if x["graphics"] is not None]),
        "pcie_rx_mib_s": mean([x["pcie_rx"] for x in g if x["pcie_rx"] is not None]),
        "pcie_tx_mib_s": mean([x["pcie_tx"] for x in g if x["pcie_tx"] is not None]),
        "pcie_counter_rx_kbps": mean(rec["pcie_counter_rx_kbps"]),
        "pcie_counter_cost_ms": mean(rec["pcie_counter_cost_ms"]),
    }
    report.setdefault("scenarios", {})[scenario] = row
    print(f"== scenario {scenario}: " + json.dumps(row), flush=True)

tw("events/gw/enable", "0", append=False)
tw("events/gwr/enable", "0", append=False)
tw("uprobe_events", "", append=False)
json.dump(report, open(f"{OUT}/cuda_calls.json", "w"), indent=1)
print("written", f"{OUT}/cuda_calls.json")
