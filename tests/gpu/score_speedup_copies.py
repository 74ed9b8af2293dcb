"""The speed-up estimate for pageable copies against what pinned copies bought.

    python3 score_speedup_copies.py OUT

OUT is what `SCENARIOS="pageable pinned" bash tests/gpu/accuracy.sh` left: record.jsonl and
each job's own timing (truth_pageable.json, truth_pinned.json). The two jobs do different
matmuls per step, so the real gain is in GPU work per second: the pinned job's own kernel
share of its time over the pageable one's. The estimate is the agent's `speedup` over the
pageable job's steady `host-bound: transfers` rows (harmonic mean of each end). Exits 1 when
the likely figure is more than 20 % off the real gain."""
import json
import statistics
import sys

out = sys.argv[1]


def own(name):
    steps = json.load(open(f"{out}/truth_{name}.json"))["steps"]
    return steps, sum(s["gpu_s"] for s in steps[3:-1]) / sum(s["d"] for s in steps[3:-1])


pageable, busy_before = own("pageable")
_, busy_after = own("pinned")
real = busy_after / busy_before
a, b = pageable[0]["t"] + 2, pageable[-1]["t"] - 1
ends = {"low": [], "likely": [], "high": []}
for line in open(f"{out}/record.jsonl"):
    if not line.strip():
        continue
    r = json.loads(line)
    t = r["taken_at_unix_ms"] / 1000
    if t - (r.get("window_seconds") or 1) < a or t > b:
        continue
    for w in r["workloads"]:
        v = w.get("verdict") or {}
        if v.get("kind") == "host-bound: transfers" and v.get("speedup"):
            for k in ends:
                ends[k].append(v["speedup"][k])
if not ends["likely"]:
    print("pageable: no row with a speed-up estimate")
    sys.exit(1)
low, likely, high = (statistics.harmonic_mean(ends[k]) for k in ("low", "likely", "high"))
off = likely / real - 1
print(f"pageable copies: estimate {likely:.2f}x ({low:.2f}-{high:.2f}) in {len(ends['likely'])} rows, "
      f"real {real:.2f}x (own kernel share {busy_before:.3f} -> {busy_after:.3f}); likely {off:+.0%}")
sys.exit(0 if abs(off) <= 0.2 else 1)
