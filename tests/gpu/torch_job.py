"""A real PyTorch job for the GPU checks: N CUDA processes, each holding a known amount of GPU
memory and running matmuls, for a given time. Used by tests/gpu/h200_check.sh."""
import argparse
import subprocess
import sys
import time


def worker(gib: float, seconds: float, busy: float) -> None:
    import torch

    hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    print(f"worker ready: {gib} GiB held", flush=True)
    while time.time() < end:
        t0 = time.time()
        while time.time() - t0 < busy:
            a = (a @ b).tanh_()
        torch.cuda.synchronize()
        time.sleep(max(0.0, 0.1 - busy))
    del hold


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--worker", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--busy", type=float, default=0.05)
    p.add_argument("--hold-gib", type=float, default=None,
                   help="GiB each worker holds (default: worker i holds i GiB)")
    a = p.parse_args()
    if a.worker is not None:
        worker(a.worker, a.seconds, a.busy)
        return
    children = [
        subprocess.Popen([sys.executable, __file__, "--worker", str(a.hold_gib or i + 1), "--seconds", str(a.seconds), "--busy", str(a.busy)])
        for i in range(a.procs)
    ]
    for c in children:
        c.wait()


if __name__ == "__main__":
    main()
