"""A PyTorch DataLoader job in two phases with its own ground truth, for tests/gpu/loader_check.sh.

gpu_bound: in-memory samples, 2 workers. io_bound: each sample is a 1 MiB O_DIRECT read of a real
file (the check throttles the job's cgroup with io.max), 2 workers. Per step it records t_start,
data_wait_s (blocked in next(loader)) and compute_s, and writes them to argv[1] at the end."""
import json
import mmap
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

PHASE_S = float(os.environ.get("PHASE_S", "40"))
out, root = sys.argv[1], sys.argv[2]


class Files(Dataset):
    def __init__(self, slow):
        self.slow, self.n = slow, len(os.listdir(root))

    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        if self.slow:
            fd = os.open(os.path.join(root, f"{i % self.n}.bin"), os.O_RDONLY | os.O_DIRECT)
            try:
                buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs
                os.readv(fd, [buf])
            finally:
                os.close(fd)
        return torch.randn(3, 64, 64)


m = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 8192), torch.nn.ReLU(),
    torch.nn.Linear(8192, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 10),
).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = []


def run(phase, slow):
    dl = DataLoader(Files(slow), batch_size=16, num_workers=2)
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
run("gpu_bound", False)
run("io_bound", True)
json.dump({"pid": os.getpid(), "steps": steps}, open(out, "w"))
