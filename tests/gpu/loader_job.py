"""A PyTorch DataLoader job in phases with its own ground truth, for tests/gpu/loader_check.sh and
tests/gpu/docker_check.sh.

gpu_bound: in-memory samples, 2 workers. io_bound: each sample is a 1 MiB O_DIRECT read of a real
file (the check throttles the job's reads), 2 workers. cpu_bound: each sample's augmentation
burns a CPU for ~40 ms in pure Python, 2 workers (WORKERS sets how many in every phase), so the
loader saturates its CPUs. PHASES picks
and orders them (default all three), PHASE_S their length. Per step it records t_start,
data_wait_s (blocked in next(loader)) and compute_s, and writes them to argv[1] at the end."""
import json
import mmap
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

PHASE_S = float(os.environ.get("PHASE_S", "40"))
PHASES = os.environ.get("PHASES", "gpu_bound,io_bound,cpu_bound").split(",")
out, root = sys.argv[1], sys.argv[2]


class Samples(Dataset):
    def __init__(self, kind):
        self.kind, self.n = kind, len(os.listdir(root))

    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        if self.kind == "io_bound":
            fd = os.open(os.path.join(root, f"{i % self.n}.bin"), os.O_RDONLY | os.O_DIRECT)
            try:
                buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs
                os.readv(fd, [buf])
            finally:
                os.close(fd)
        elif self.kind == "cpu_bound":
            # An augmentation in pure Python: ~40 ms of one CPU per sample.
            t = time.thread_time()
            x = 0
            while time.thread_time() - t < 0.04:
                x += sum(range(1000))
        return torch.randn(3, 64, 64)


m = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 8192), torch.nn.ReLU(),
    torch.nn.Linear(8192, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 10),
).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = []


def run(phase):
    dl = DataLoader(Samples(phase), batch_size=16, num_workers=int(os.environ.get("WORKERS", "2")))
    it = iter(dl)
    print(f"phase {phase} start {time.time():.3f}", flush=True)
    t_end = time.time() + PHASE_S
    while time.time() < t_end:
        t0 = time.time()
        x = next(it)
        t1 = time.time()
        x = x.cuda()
        for _ in range(10):
            loss = m(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        t2 = time.time()
        steps.append({"phase": phase, "t_start": t0, "data_wait_s": t1 - t0, "compute_s": t2 - t1})
    print(f"phase {phase} end {time.time():.3f}", flush=True)
    del it, dl


print("pid", os.getpid(), flush=True)
for phase in PHASES:
    run(phase)
json.dump({"pid": os.getpid(), "steps": steps}, open(out, "w"))
