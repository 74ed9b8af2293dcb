"""The agent's speed-up estimate against the job's own: what removing the bottleneck bought.

    python3 score_speedup.py RECORD.jsonl TRUTH.json CONTAINER

TRUTH.json is loader_job.py's step log; its gpu_bound phase (the same model and batch with the
samples in memory) is the job with the bottleneck removed. Per other phase: the steady rows'
verdicts, the agent's `speedup` ends over the rows that have both (the harmonic mean of each:
a phase's gain is its total time over the fixed job's, so the rows' times add, not their
ratios), and the real gain (the gpu_bound phase's step rate over this phase's). Exits 1 when a
phase's real gain falls outside that range."""
import json
import statistics
import sys

rec, truth_path, name = sys.argv[1:4]
steps = json.load(open(truth_path))["steps"]
phases = {}
for s in steps:
    phases.setdefault(s["phase"], []).append(s)


def rate(ss):
    ss = ss[5:-2]
    return (len(ss) - 1) / (ss[-1]["t_start"] - ss[0]["t_start"])


rows = [json.loads(line) for line in open(rec) if line.strip()]
fixed = rate(phases["gpu_bound"])
missed = False
for phase, ss in phases.items():
    if phase == "gpu_bound":
        continue
    a, b = ss[0]["t_start"] + 2, ss[-1]["t_start"] - 1
    kinds, lows, highs = {}, [], []
    for r in rows:
        t = r["taken_at_unix_ms"] / 1000
        if t - (r.get("window_seconds") or 1) < a or t > b:
            continue
        w = next((w for w in r["workloads"] if w["name"] == name), None)
        v = (w or {}).get("verdict") or {}
        if not v:
            continue
        kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
        s = v.get("speedup")
        if s and s.get("high"):
            lows.append(s["low"])
            highs.append(s["high"])
    real = fixed / rate(ss)
    low = statistics.harmonic_mean(lows) if lows else float("nan")
    high = statistics.harmonic_mean(highs) if highs else float("nan")
    inside = low <= real <= high
    missed |= not inside
    print(f"{phase}: {kinds}; estimate {low:.1f}-{high:.1f}x in {len(lows)} rows, real {real:.1f}x ({'inside' if inside else 'outside'} the range)")
sys.exit(1 if missed else 0)
