"""The agent's energy against the driver's energy counter.

    python3 score_energy.py OUT NAME

OUT holds energy.jsonl (`gpuwatch record --format jsonl`) and counter.txt (energy_counter.py).
Over the rows' span (the first window's start to the last row), the GPU's joules (the rows'
`gpus[0].energy_joules`) and the workload NAME's part (its `per_gpu[].energy`, busy and idle)
against the counter's increase, interpolated at the span's ends. The workload holds the GPU
alone, so both should match it. Exits 1 when either is more than 1 % off."""
import bisect
import json
import sys

out, name = sys.argv[1], sys.argv[2]
counter = [tuple(map(float, line.split())) for line in open(f"{out}/counter.txt") if line.strip()]
times = [c[0] for c in counter]


def at(t):
    i = bisect.bisect_left(times, t)
    if i == 0 or i >= len(times):
        raise SystemExit(f"the counter does not cover {t}")
    (t0, e0), (t1, e1) = counter[i - 1], counter[i]
    return (e0 + (e1 - e0) * (t - t0) / (t1 - t0)) / 1000


rows = [json.loads(line) for line in open(f"{out}/energy.jsonl") if line.strip()]
rows = [r for r in rows if r["gpus"] and r["gpus"][0].get("energy_joules") is not None]
start = rows[0]["taken_at_unix_ms"] / 1000 - rows[0]["window_seconds"]
end = rows[-1]["taken_at_unix_ms"] / 1000
truth = at(end) - at(start)
gpu = sum(r["gpus"][0]["energy_joules"] for r in rows)
job, missing = 0.0, 0
for r in rows:
    w = next((w for w in r["workloads"] if name in w["name"] and w["gpu"]["per_gpu"]), None)
    e = [g.get("energy") for g in (w or {"gpu": {"per_gpu": []}})["gpu"]["per_gpu"]]
    if not e or None in e:
        missing += 1
        continue
    job += sum(x["busy_joules"] + x["idle_joules"] for x in e)
print(f"span {end - start:.1f} s over {len(rows)} rows: counter {truth:.0f} J; GPU {gpu:.0f} J "
      f"({gpu / truth - 1:+.2%}); {name} {job:.0f} J ({job / truth - 1:+.2%}), "
      f"{missing} rows without its part")
sys.exit(0 if abs(gpu / truth - 1) <= 0.01 and abs(job / truth - 1) <= 0.01 else 1)
