"""GPU-seconds by cause against those held, and the input-bound part against the job's own wait.

    python3 score_by_cause.py RECORD.jsonl TRUTH.json CONTAINER

TRUTH.json is loader_job.py's step log (phases GPU-bound, I/O-bound, CPU-bound). Over the job's
span from its second step (the first holds PyTorch's warm-up, seconds of CPU the job times as
"compute" while its GPU idles): the container's held GPU-seconds (window × GPUs), its busy GPU-seconds and its idle ones
by verdict, as `report` and the accounting counters add them; their sum against the held ones
(target within 2 %), and the input-bound verdicts' idle share of the held time against the
job's own data-wait share (target within 5 points). Exits 1 on a miss."""
import json
import sys

rec, truth_path, name = sys.argv[1:4]
steps = json.load(open(truth_path))["steps"]
steps = steps[1:]
t0, t1 = steps[0]["t_start"], steps[-1]["t_start"]
held = busy = 0.0
idle = {}
for line in open(rec):
    if not line.strip():
        continue
    r = json.loads(line)
    t, w = r["taken_at_unix_ms"] / 1000, r.get("window_seconds") or 0
    if t - w < t0 or t > t1:
        continue
    wl = next((x for x in r["workloads"] if x["name"] == name), None)
    if not wl or not wl["gpu"]["per_gpu"]:
        continue
    n = len(wl["gpu"]["per_gpu"])
    held += n * w
    b = wl["gpu"].get("busy_fraction")
    kind = (wl.get("verdict") or {}).get("kind", "none") if b is not None else "(busy unknown)"
    if b is not None:
        busy += b * n * w
    idle[kind] = idle.get(kind, 0) + (1 - (b or 0)) * n * w
by_cause = busy + sum(v for k, v in idle.items() if k != "(busy unknown)")
wait = sum(s["data_wait_s"] for s in steps[:-1]) / (t1 - t0)
input_bound = sum(v for k, v in idle.items() if k.startswith("input-bound")) / held
sum_off = by_cause / held - 1
print(f"{name}: held {held:.1f} GPU-s; busy {busy:.1f}; idle " +
      ", ".join(f"{k} {v:.1f}" for k, v in sorted(idle.items())) +
      f"; by cause {by_cause:.1f} ({sum_off:+.2%} of held)")
print(f"{name}: input-bound idle {input_bound:.3f} of held, the job's own data wait {wait:.3f} "
      f"({(input_bound - wait) * 100:+.1f} pp)")
sys.exit(0 if abs(sum_off) <= 0.02 and abs(input_bound - wait) <= 0.05 else 1)
