"""Training loops written the way people write them, each timing itself, for
tests/gpu/real_loops.sh (one job per container; the script sets the container's quota, cpuset
and neighbours).

    python3 real_loops.py OUT.json SCENARIO [SECONDS]

Every job runs a real step (a model with a backward pass and an optimizer unless said) and
records, per step, its start `t`, length `d` and how the step's wall time was spent, measured
by the job itself around the code that does it:
  cpu_s        the trainer's own CPU work (tokenising, a thread pool preparing the batch,
               Python, issuing kernels),
  copy_s       copies between host and GPU (the call and the wait for it),
  sync_s       waiting in a synchronisation (`.item()`, `torch.cuda.synchronize()`) for work
               that is not its own kernels,
  data_wait_s  waiting for the DataLoader's next batch,
  gpu_s        the rest: the GPU working while the host waits for it;
  kernel_s     the GPU's kernel time of a step, measured once after the warm-up steps with
               torch.profiler (device time of every kernel, copies left out);
  host_idle_s  the step's time its kernels did not run and that no copy, synchronisation or
               wait for the loader explains: d - kernel_s - copy_s - sync_s - data_wait_s, the
               time the GPU waited on the host's own work.
Lines on stdout: "ready" once set up, then "phase LABEL start|end <unix time>" around each phase
(LABEL is the verdict a user should get; `warmup` for a first step the job cannot time apart).

Scenarios:
  tokenize        num_workers=0: the trainer tokenises its own text in Python (regex, a vocab
                  dict), then a small transformer step with loss.item().
  item_mlp        24 small Linear layers, forward, backward, Adam, loss.item() every step: the
                  host issues kernels as fast as it can (the backward on autograd's thread).
  pool            each batch prepared by a ThreadPoolExecutor of 4 threads (numpy, GIL
                  released) while the main thread waits on the futures.
  native_tok      the `tokenizers` library (Rust, its own threads) batch-encodes each step's
                  text; skipped where it is not installed.
  pinned_sync     1 GiB from pinned memory each step with non_blocking=False, then matmuls.
  small_copies    256 pageable tensors of 256 KiB copied to the GPU each step.
  pageable        one 256 MiB pageable copy each step, then matmuls.
  d2h_logging     a GPU-bound step that copies its metrics and a 4 MiB activation to the host.
  graphs_tiny     a CUDA graph of 200 tiny kernels replayed back to back.
  transformer     a bf16 transformer encoder (6 layers, d=1024), AdamW, loss.item().
  resnet          torchvision's ResNet-50, batch 256, bf16 autocast, SGD (at batch 64 the H100
                  idled 30 % of each step: launch overhead, not a GPU-bound job).
  mlp_item        a wide bf16 MLP step with loss.item(): healthy, GPU-bound.
  jpeg            a torchvision JPEG pipeline (decode, RandomResizedCrop, flip) in a
                  DataLoader with WORKERS workers (6) feeding a ResNet-18; its first step
                  (workers starting, the first batches decoding) is `warmup`.
  loader_cpu      a DataLoader whose augmentation is CPU-bound (WORKERS workers, 4).
  loader_io       a DataLoader reading 1 MiB files with O_DIRECT (DATA: their folder).
  sync            a host function holds the stream 8 ms a step (cuLaunchHostFunc with usleep).
  launch          one-element kernels as fast as the host launches them.
  idle            holds 2 GiB of GPU memory and sleeps.
"""
import json
import os
import re
import sys
import time

import torch

out, scenario = sys.argv[1], sys.argv[2]
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
dev = torch.device("cuda")
steps = []
LABELS = {
    "tokenize": "host-bound: CPU",
    "item_mlp": "host-bound: launches",
    "pool": "host-bound: CPU",
    "native_tok": "host-bound: CPU",
    "pinned_sync": "host-bound: transfers",
    "small_copies": "host-bound: transfers",
    "pageable": "host-bound: transfers",
    "d2h_logging": "GPU-bound",
    "graphs_tiny": "low SM activity",
    "transformer": "GPU-bound",
    "resnet": "GPU-bound",
    "mlp_item": "GPU-bound",
    "jpeg": "input-bound: CPU",
    "loader_cpu": "input-bound: CPU",
    "loader_io": "input-bound: I/O",
    "sync": "host-bound: sync",
    "launch": "host-bound: launches",
    "idle": "idle",
}


def record(t0, **parts):
    d = time.time() - t0
    parts["gpu_s"] = max(0.0, d - sum(parts.values())) + parts.get("gpu_s", 0.0)
    steps.append({"t": t0, "d": d, **parts})


def kernel_seconds(body, n=5):
    """The GPU's kernel time of one step of `body` (torch.profiler, copies and memsets left
    out), over `n` steps."""
    from torch.profiler import ProfilerActivity, profile

    first = len(steps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            body()
        torch.cuda.synchronize()
    del steps[first:]
    total = 0.0
    for e in prof.key_averages():
        if "memcpy" in e.key.lower() or "memset" in e.key.lower():
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        total += us
    return total / 1e6 / n


def run(body, label, length, kernel_s=None):
    first = len(steps)
    start = time.time()
    print(f"phase {label} start {start:.3f}", flush=True)
    while time.time() < start + length:
        body()
    for st in steps[first:]:
        st.setdefault("label", label)
        if kernel_s is not None:
            st["kernel_s"] = kernel_s
            st["host_idle_s"] = max(0.0, st["d"] - kernel_s - st.get("copy_s", 0.0)
                                    - st.get("sync_s", 0.0) - st.get("data_wait_s", 0.0))
    print(f"phase {label} end {time.time():.3f}", flush=True)


# --- text ------------------------------------------------------------------------------------

WORDS = ("the model trains on text that a person wrote with words of many lengths and some "
         "numbers like 2026 or 3.14 and punctuation, quotes \"here\" and (there)").split()


def corpus(n, seed=0):
    import random
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(80, 160))) for _ in range(n)]


class Tokenizer:
    """A word-piece-ish tokenizer in plain Python, as a quick research script writes one."""
    split = re.compile(r"\w+|[^\w\s]")

    def __init__(self):
        self.vocab = {}

    def encode(self, text, length):
        ids = []
        for tok in self.split.findall(text.lower()):
            for i in range(0, len(tok), 4):
                piece = tok[i:i + 4]
                ids.append(self.vocab.setdefault(piece, len(self.vocab) % 30000 + 2))
        ids = ids[:length]
        return ids + [0] * (length - len(ids))


def small_transformer(vocab=32000, d=512, layers=2):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, layers)
            self.head = torch.nn.Linear(d, vocab)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

    return Model().to(dev)


def tokenize():
    tok, texts = Tokenizer(), corpus(4096)
    model = small_transformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {"i": 0}

    def step():
        t0 = time.time()
        batch = texts[state["i"] % 4096:][:32] or texts[:32]
        state["i"] += 32
        ids = torch.tensor([tok.encode(t, 128) for t in batch])
        t1 = time.time()
        x = ids.to(dev)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        record(t0, cpu_s=t1 - t0)

    return step


def native_tok():
    try:
        from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers
    except ImportError:
        print("tokenizers not installed", flush=True)
        return None
    texts = corpus(20000)
    hf = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train_from_iterator(texts[:2000], trainers.WordPieceTrainer(vocab_size=8000, special_tokens=["[UNK]", "[PAD]"]))
    hf.enable_padding(length=256)
    hf.enable_truncation(256)
    model = small_transformer(vocab=8000)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {"i": 0}

    def step():
        t0 = time.time()
        i = state["i"] % 19000
        state["i"] += 1000
        enc = hf.encode_batch(texts[i:i + 1000])  # Rust, on its own threads
        ids = torch.tensor([e.ids for e in enc[:32]])
        t1 = time.time()
        x = ids.to(dev)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        record(t0, cpu_s=t1 - t0)

    return step


# --- the host side ---------------------------------------------------------------------------

def item_mlp():
    layers = []
    for _ in range(24):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=dev)

    def step():
        t0 = time.time()
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t1 = time.time()
        loss.item()
        t2 = time.time()
        steps.append({"t": t0, "d": t2 - t0, "cpu_s": t1 - t0, "gpu_s": t2 - t1})

    return step


def pool():
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor

    ex = ThreadPoolExecutor(4)
    rng = np.random.default_rng(0)
    raw = [rng.standard_normal((256, 1024)).astype(np.float32) for _ in range(4)]
    model = torch.nn.Sequential(torch.nn.Linear(768, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def prepare(a):
        # numpy releases the GIL in these: sorting, FFTs, a matrix product
        b = np.sort(a, axis=1)
        f = np.abs(np.fft.rfft(b, axis=1))[:, :512]
        g = f @ f.T
        return np.concatenate([b[:, :512], g[:, :512] / (1 + g.max())], axis=1)

    def step():
        t0 = time.time()
        parts = list(ex.map(prepare, raw))
        x = torch.from_numpy(np.concatenate(parts))
        t1 = time.time()
        loss = model(x.to(dev)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        record(t0, cpu_s=t1 - t0)

    return step


def matmuls(k, a, b):
    for _ in range(k):
        a @ b


def pinned_sync():
    x = torch.randn(256 << 20, dtype=torch.float32).pin_memory()  # 1 GiB
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    w = torch.nn.Linear(4096, 4096).to(dev)
    opt = torch.optim.SGD(w.parameters(), lr=0.01)

    def step():
        t0 = time.time()
        y = x.to(dev, non_blocking=False)
        t1 = time.time()
        matmuls(6, a, a)
        loss = w(y[:4096 * 64].view(-1, 4096)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        record(t0, copy_s=t1 - t0)

    return step


def small_copies():
    xs = [torch.randn(64 << 10, dtype=torch.float32) for _ in range(256)]  # 256 KiB each, pageable
    w = torch.nn.Linear(1024, 1024).to(dev)
    opt = torch.optim.SGD(w.parameters(), lr=0.01)

    def step():
        t0 = time.time()
        ys = [x.to(dev) for x in xs]
        t1 = time.time()
        loss = w(torch.stack(ys).view(-1, 1024)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        record(t0, copy_s=t1 - t0)

    return step


def pageable():
    x = torch.randn(64 << 20, dtype=torch.float32)  # 256 MiB, pageable
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

    def step():
        t0 = time.time()
        y = x.to(dev)
        torch.cuda.synchronize()
        t1 = time.time()
        matmuls(12, a, a)
        y.sum().item()
        record(t0, copy_s=t1 - t0)

    return step


def d2h_logging():
    model = torch.nn.Sequential(torch.nn.Linear(8192, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 8192, device=dev)
    log = []

    def step():
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model(x)
            loss = h.float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t1 = time.time()
        # what a training script logs each step
        metrics = torch.stack([loss.detach(), h.float().abs().mean(), h.float().std()]).cpu()
        snap = h[:128].float().cpu()  # 4 MiB of activations
        t2 = time.time()
        log.append((metrics.tolist(), float(snap[0, 0])))
        steps.append({"t": t0, "d": t2 - t0, "gpu_s": t2 - t0, "copy_s": 0.0})
        del t1

    return step


def graphs_tiny():
    x = torch.zeros(64, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for _ in range(200):
                x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(200):
            x.add_(1)

    def step():
        t0 = time.time()
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        record(t0)

    return step


def transformer():
    layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, 6).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, 512, 1024, device=dev)

    def step():
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        record(t0)

    return step


def resnet():
    import torchvision

    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(256, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device=dev)

    def step():
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        record(t0)

    return step


def mlp_item():
    model = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8192, 4096, device=dev)

    def step():
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        record(t0)

    return step


def sync():
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    libc = ctypes.CDLL("libc.so.6")
    host_fn = ctypes.cast(libc.usleep, ctypes.c_void_p)
    cuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def step():
        t0 = time.time()
        matmuls(4, a, a)
        stream = torch.cuda.current_stream().cuda_stream
        assert cuda.cuLaunchHostFunc(ctypes.c_void_p(stream), host_fn, ctypes.c_void_p(8000)) == 0
        t1 = time.time()
        torch.cuda.synchronize()
        record(t0, cpu_s=t1 - t0, sync_s=time.time() - t1)

    return step


def launch():
    x = torch.zeros(1, device=dev)

    def step():
        t0 = time.time()
        for _ in range(1000):
            x.add_(1)
        t1 = time.time()
        torch.cuda.synchronize()
        record(t0, cpu_s=t1 - t0)

    return step


def idle():
    held = torch.empty(2 << 30, dtype=torch.uint8, device=dev)  # noqa: F841

    def step():
        t0 = time.time()
        time.sleep(0.5)
        steps.append({"t": t0, "d": time.time() - t0})

    return step


# --- data loaders ----------------------------------------------------------------------------

def loader(dataset, model, opt, workers, batch, label, length, warmup_label=None):
    from torch.utils.data import DataLoader

    dl = DataLoader(dataset, batch_size=batch, num_workers=workers, pin_memory=True,
                    persistent_workers=True, prefetch_factor=2)
    it = iter(dl)
    start = time.time()
    first = True
    print(f"phase {warmup_label or label} start {start:.3f}", flush=True)
    while time.time() < start + length:
        t0 = time.time()
        x, y = next(it)
        t1 = time.time()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        t2 = time.time()
        steps.append({"t": t0, "d": t2 - t0, "data_wait_s": t1 - t0, "gpu_s": t2 - t1,
                      "label": warmup_label if first and warmup_label else label})
        if first and warmup_label:
            print(f"phase {warmup_label} end {t2:.3f}", flush=True)
            print(f"phase {label} start {t2:.3f}", flush=True)
        first = False
    print(f"phase {label} end {time.time():.3f}", flush=True)


def jpeg_files(folder, n=256):
    from PIL import Image
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(n):
        p = os.path.join(folder, f"{i}.jpg")
        if not os.path.exists(p):
            a = (rng.random((480, 640, 3)) * 255).astype("uint8")
            Image.fromarray(a).save(p, quality=90)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


class Jpegs(torch.utils.data.Dataset):
    def __init__(self, files):
        import torchvision.transforms as T
        self.files = files
        self.tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor()])

    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        from PIL import Image
        img = Image.open(self.files[i % len(self.files)]).convert("RGB")
        return self.tf(img), i % 10


def jpeg():
    import torchvision
    files = jpeg_files(os.environ.get("JPEGS", "/tmp/jpegs"))
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    workers = int(os.environ.get("WORKERS", "6"))
    print("ready", flush=True)
    loader(Jpegs(files), model, opt, workers, 64, LABELS["jpeg"], seconds, warmup_label="warmup")


class Augmented(torch.utils.data.Dataset):
    """Samples whose augmentation burns ~20 ms of CPU in Python, as a heavy transform does."""

    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        t = time.thread_time()
        x = 0
        while time.thread_time() - t < 0.02:
            x += sum(range(1000))
        return torch.randn(3, 64, 64), i % 10


class Files(torch.utils.data.Dataset):
    """1 MiB reads with O_DIRECT: the page cache does not hide the storage."""

    def __init__(self, root):
        self.root, self.n = root, len(os.listdir(root))

    def __len__(self):
        return 10**7

    def __getitem__(self, i):
        import mmap
        fd = os.open(os.path.join(self.root, f"{i % self.n}.bin"), os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 1 << 20)
            os.readv(fd, [buf])
        finally:
            os.close(fd)
        return torch.randn(3, 64, 64), i % 10


def small_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(8),
        torch.nn.Flatten(), torch.nn.Linear(64 * 64, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(dev)


def loader_cpu():
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print("ready", flush=True)
    loader(Augmented(), model, opt, int(os.environ.get("WORKERS", "4")), 32, LABELS["loader_cpu"], seconds)


def loader_io():
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print("ready", flush=True)
    loader(Files(os.environ["DATA"]), model, opt, int(os.environ.get("WORKERS", "2")), 16,
           LABELS["loader_io"], seconds)


LOADERS = {"jpeg": jpeg, "loader_cpu": loader_cpu, "loader_io": loader_io}

if scenario not in LABELS:
    sys.exit(f"unknown scenario {scenario!r}: one of {', '.join(LABELS)}")
print("pid", os.getpid(), flush=True)
if scenario in LOADERS:
    LOADERS[scenario]()
else:
    body = globals()[scenario]()
    if body is None:
        sys.exit(0)
    for _ in range(3):  # warm-up steps: allocator, cuBLAS handles, autotuning
        body()
    steps.clear()
    try:
        kernel = kernel_seconds(body)
    except Exception as e:  # noqa: BLE001 - the truth is then the job's own sections only
        print(f"no kernel time: {e}", flush=True)
        kernel = None
    print("ready", flush=True)
    run(body, LABELS[scenario], seconds, kernel)
json.dump({"pid": os.getpid(), "scenario": scenario, "steps": steps}, open(out, "w"))
print("done", flush=True)
os._exit(0)
