"""Host-side training steps with their own ground truth, for tests/gpu/accuracy.sh and
tests/gpu/cuda_calls.sh: jobs whose GPU waits on the host (copies, kernel launches, the
trainer's own CPU, synchronisation) rather than on a data loader, and a few references.

    python3 host_job.py OUT.json SCENARIO [SECONDS]

Scenarios (each labelled with the verdict a user should get):
  pageable    copies 256 MiB of ordinary (pageable) host memory to the GPU each step, then runs
              matmuls for about half the copy's time: most of the step is the copy.
  pinned      the same data and matmuls, the copy from pinned memory with non_blocking=True on a
              side stream, one batch ahead: the copies hide under the compute.
  launch      one-element kernels as fast as the host can launch them (a sync per 1,000).
  trainer_cpu ~25 ms of pure-Python work on the main thread per step (parsing, building a
              batch), then ~2 ms of GPU work and loss.item().
  sync        each step queues ~2 ms of matmuls and a host function that holds the stream for
              8 ms (cuLaunchHostFunc with usleep), then torch.cuda.synchronize(): the trainer
              waits in a synchronise while the GPU has nothing to run.
  gpu_bound   back-to-back bf16 matmuls.
  low_sm      a single-thread spinning kernel (torch.cuda._sleep): the GPU "busy" on one SM.
  idle        holds 2 GiB of GPU memory and sleeps.
  mixed       pageable, then gpu_bound, then trainer_cpu, a third of SECONDS each.
  resnet      a realistic step: torchvision's ResNet-50, batch 64 of synthetic images already on
              the GPU, SGD with bf16 autocast (~1,000 kernel launches a step).

Every step records its start, its length, how it was spent (copy_s, sync_s, cpu_s, gpu_s,
launches) and its label; the file also holds the scenario and the calibration. Lines on stdout:
"ready" once set up, then "phase LABEL start|end <unix time>" around each phase."""
import ctypes
import json
import os
import sys
import time

import torch

out, scenario = sys.argv[1], sys.argv[2]
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
LABELS = {
    "pageable": "host-bound: transfers",
    "pinned": "GPU-bound",
    "launch": "host-bound: launches",
    "trainer_cpu": "host-bound: CPU",
    "sync": "host-bound: sync",
    "gpu_bound": "GPU-bound",
    "low_sm": "low SM activity",
    "idle": "idle",
    "mixed": None,
    "resnet": "GPU-bound",
}
dev = torch.device("cuda")
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
steps = []
calibration = {}


def timed_matmuls(k):
    for _ in range(k):
        a @ b


def matmul_seconds():
    timed_matmuls(3)
    torch.cuda.synchronize()
    t = time.perf_counter()
    timed_matmuls(20)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / 20


def python_work(seconds_wanted):
    """Pure-Python work on this thread for about `seconds_wanted` of CPU time."""
    t = time.thread_time()
    x = 0
    while time.thread_time() - t < seconds_wanted:
        x += sum(i * i for i in range(2000))
    return x


def run(body, label, length):
    """Runs `body` for `length` seconds, each step labelled."""
    first = len(steps)
    start = time.time()
    print(f"phase {label} start {start:.3f}", flush=True)
    end = start + length
    while time.time() < end:
        body()
    for st in steps[first:]:
        st["label"] = label
    print(f"phase {label} end {time.time():.3f}", flush=True)


def pageable():
    x = torch.randn(64 << 20, dtype=torch.float32)  # 256 MiB, pageable
    x.to(dev)
    torch.cuda.synchronize()
    t = time.perf_counter()
    x.to(dev)
    torch.cuda.synchronize()
    copy = time.perf_counter() - t
    k = max(1, round(0.55 * copy / matmul_seconds()))
    calibration.update(copy_s=copy, matmuls=k)

    def step():
        t0 = time.time()
        y = x.to(dev)
        torch.cuda.synchronize()
        t1 = time.time()
        timed_matmuls(k)
        y.sum()
        torch.cuda.synchronize()
        t2 = time.time()
        steps.append({"t": t0, "d": t2 - t0, "copy_s": t1 - t0, "gpu_s": t2 - t1})

    return step


def pinned():
    x = [torch.randn(64 << 20, dtype=torch.float32).pin_memory() for _ in range(2)]
    copy_stream = torch.cuda.Stream()
    t = time.perf_counter()
    x[0].to(dev)
    torch.cuda.synchronize()
    copy = time.perf_counter() - t
    # The same number of matmuls as the pageable job's step (its copy time at ~7 GB/s).
    k = max(1, round(0.55 * (256 / 6882 * 1.0) / matmul_seconds()))
    calibration.update(copy_s=copy, matmuls=k)
    state = {"i": 0, "next": None, "ready": None}

    def prefetch():
        with torch.cuda.stream(copy_stream):
            state["next"] = x[state["i"] % 2].to(dev, non_blocking=True)
            state["ready"] = torch.cuda.Event()
            state["ready"].record(copy_stream)
        state["i"] += 1

    prefetch()

    def step():
        t0 = time.time()
        torch.cuda.current_stream().wait_event(state["ready"])
        y = state["next"]
        prefetch()
        timed_matmuls(k)
        y.sum()
        torch.cuda.synchronize()
        t1 = time.time()
        steps.append({"t": t0, "d": t1 - t0, "copy_s": 0.0, "gpu_s": t1 - t0})

    return step


def launch():
    x = torch.zeros(1, device=dev)

    def step():
        t0 = time.time()
        for _ in range(1000):
            x.add_(1)
        torch.cuda.synchronize()
        t1 = time.time()
        steps.append({"t": t0, "d": t1 - t0, "launches": 1000, "cpu_s": t1 - t0})

    return step


def trainer_cpu():
    small = torch.randn(2048, 2048, device=dev)

    def step():
        t0 = time.time()
        python_work(0.025)
        t1 = time.time()
        y = small @ small
        for _ in range(4):
            y = torch.relu(y @ small)
        loss = y.mean().item()
        t2 = time.time()
        steps.append({"t": t0, "d": t2 - t0, "cpu_s": t1 - t0, "gpu_s": t2 - t1, "loss": loss})

    return step


def sync():
    cuda = ctypes.CDLL("libcuda.so.1")
    libc = ctypes.CDLL("libc.so.6")
    host_fn = ctypes.cast(libc.usleep, ctypes.c_void_p)
    cuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    k = max(1, round(0.002 / matmul_seconds()))
    calibration.update(matmuls=k, host_fn_us=8000)

    def step():
        t0 = time.time()
        timed_matmuls(k)
        stream = torch.cuda.current_stream().cuda_stream
        # usleep(8000) on the driver's callback thread; the stream holds until it returns.
        r = cuda.cuLaunchHostFunc(ctypes.c_void_p(stream), host_fn, ctypes.c_void_p(8000))
        assert r == 0, f"cuLaunchHostFunc: {r}"
        t1 = time.time()
        torch.cuda.synchronize()
        t2 = time.time()
        steps.append({"t": t0, "d": t2 - t0, "sync_s": t2 - t1, "cpu_s": t1 - t0})

    return step


def gpu_bound():
    def step():
        t0 = time.time()
        timed_matmuls(20)
        torch.cuda.synchronize()
        t1 = time.time()
        steps.append({"t": t0, "d": t1 - t0, "gpu_s": t1 - t0})

    return step


def low_sm():
    cycles = 50_000_000

    def step():
        t0 = time.time()
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        t1 = time.time()
        steps.append({"t": t0, "d": t1 - t0, "gpu_s": t1 - t0})

    return step


def idle():
    held = torch.empty(2 << 30, dtype=torch.uint8, device=dev)  # noqa: F841

    def step():
        t0 = time.time()
        time.sleep(0.5)
        steps.append({"t": t0, "d": time.time() - t0})

    return step


def resnet():
    import torchvision

    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device=dev)

    def one():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):
        one()
    torch.cuda.synchronize()

    def step():
        t0 = time.time()
        loss = one().item()
        t1 = time.time()
        steps.append({"t": t0, "d": t1 - t0, "gpu_s": t1 - t0, "loss": loss})

    return step


if scenario not in LABELS:
    sys.exit(f"unknown scenario {scenario!r}: one of {', '.join(LABELS)}")
print("pid", os.getpid(), flush=True)
if scenario == "mixed":
    phases = [(name, globals()[name]()) for name in ("pageable", "gpu_bound", "trainer_cpu")]
    print("ready", flush=True)
    for name, body in phases:
        run(body, LABELS[name], seconds / 3)
else:
    body = globals()[scenario]()
    print("ready", flush=True)
    run(body, LABELS[scenario], seconds)
json.dump({"pid": os.getpid(), "scenario": scenario, "calibration": calibration, "steps": steps},
          open(out, "w"))
print("done", flush=True)
