"""The agent's speed-up estimate against the job's own: what removing the bottleneck bought.

    python3 score_speedup.py RECORD.jsonl TRUTH.json CONTAINER

TRUTH.json is loader_job.py's step log; its gpu_bound phase (the same model and batch with the
samples in memory) is the job with the bottleneck removed. Per other phase: the steady rows'
verdicts, the agent's `speedup` (the harmonic mean of each figure over the rows: a phase's gain
is its total time over the fixed job's, so the rows' times add, not their ratios), and the real
gain (the gpu_bound phase's step rate over this phase's). Exits 1 when a phase's likely figure
is more than 20 % off its real gain."""
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
    kinds, lows, likelies, highs = {}, [], [], []
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
        if s:
            lows.append(s["low"])
            likelies.append(s["likely"])
            highs.append(s["high"])
    real = fixed / rate(ss)
    if not likelies:
        print(f"{phase}: {kinds}; no row with a speed-up estimate")
        missed = True
        continue
    low, likely, high = (statistics.harmonic_mean(x) for x in (lows, likelies, highs))
    off = likely / real - 1
    missed |= abs(off) > 0.2
    print(f"{phase}: {kinds}; estimate {likely:.1f}x ({low:.1f}-{high:.1f}) in {len(lows)} rows, real {real:.1f}x; likely {off:+.0%}"
          f" ({'inside' if low <= real <= high else 'outside'} the range)")
sys.exit(1 if missed else 0)
