"""The speed-up estimate for pageable copies against what pinned copies bought.

    python3 score_speedup_copies.py OUT

OUT is what `SCENARIOS="pageable pinned" bash tests/gpu/accuracy.sh` left: record.jsonl and
each job's own timing (truth_pageable.json, truth_pinned.json). The two jobs do different
matmuls per step, so the real gain is in GPU work per second: the pinned job's own kernel
share of its time over the pageable one's. The estimate: the pageable job's steady rows cut
from the recording and given to `gpuwatch report --json` (GPUWATCH names the binary, default
.device/gpuwatch), its workload's `speedup`; beside it, the harmonic mean of the rows' own.
Exits 1 when the report's likely figure is more than 20 % off the real gain."""
import json
import os
import statistics
import subprocess
import sys
import tempfile

out = sys.argv[1]


def own(name):
    steps = json.load(open(f"{out}/truth_{name}.json"))["steps"]
    return steps, sum(s["gpu_s"] for s in steps[3:-1]) / sum(s["d"] for s in steps[3:-1])


pageable, busy_before = own("pageable")
_, busy_after = own("pinned")
real = busy_after / busy_before
a, b = pageable[0]["t"] + 2, pageable[-1]["t"] - 1
ends = {"low": [], "likely": [], "high": []}
cut, name = [], None
for line in open(f"{out}/record.jsonl"):
    if not line.strip():
        continue
    r = json.loads(line)
    t = r["taken_at_unix_ms"] / 1000
    if t - (r.get("window_seconds") or 1) < a or t > b:
        continue
    cut.append(line)
    for w in r["workloads"]:
        if (w.get("verdict") or {}).get("kind") == "host-bound: transfers":
            name = w["name"]
        v = w.get("verdict") or {}
        if v.get("kind") == "host-bound: transfers" and v.get("speedup"):
            for k in ends:
                ends[k].append(v["speedup"][k])
if not ends["likely"]:
    print("pageable: no row with a speed-up estimate")
    sys.exit(1)
rows_likely = statistics.harmonic_mean(ends["likely"])
with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
    f.writelines(cut)
    f.flush()
    report = json.loads(subprocess.run([os.environ.get("GPUWATCH", ".device/gpuwatch"), "report",
                                        "--json", f.name], check=True, capture_output=True,
                                       text=True).stdout)
g = next(c for c in report["containers"] if c["name"] == name).get("speedup") or {}
if not g:
    print("pageable: the report gives no speed-up")
    sys.exit(1)
off = g["likely"] / real - 1
print(f"pageable copies: report {g['likely']:.2f}x ({g['low']:.2f}-{g['high']:.2f}) over {len(cut)} rows "
      f"(the rows' own: {rows_likely:.2f}x), real {real:.2f}x (own kernel share {busy_before:.3f} -> "
      f"{busy_after:.3f}); likely {off:+.0%}")
sys.exit(0 if abs(off) <= 0.2 else 1)
