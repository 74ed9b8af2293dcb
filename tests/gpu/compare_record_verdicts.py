"""A DataLoader job's phases against `gpuwatch record --format jsonl` rows, with read tracing
adaptive (the default): per phase, the rows whose window lies inside it after its first
SKIP seconds, their verdicts and input-bound shares against the job's own data-wait fraction
over each row's window, and how many of them had the read evidence; and when the read
evidence was first live in the phase, counted from its start.

    python3 compare_record_verdicts.py RECORD.jsonl TRUTH.json LOADER.log WORKLOAD_NAME [SKIP]

Exits 1 if a phase's majority verdict is wrong or its mean share is off by more than 5 points."""
import json
import re
import sys

rec, truth_path, log, name = sys.argv[1:5]
skip = float(sys.argv[5]) if len(sys.argv) > 5 else 6.0
EXPECTED = {"gpu_bound": "GPU-bound", "io_bound": "input-bound: I/O", "cpu_bound": "input-bound: CPU"}
steps = json.load(open(truth_path))["steps"]
phases = {}
for line in open(log):
    m = re.match(r"phase (\w+) (start|end) ([\d.]+)", line)
    if m:
        phases.setdefault(m[1], {})[m[2]] = float(m[3])
rows = [json.loads(l) for l in open(rec) if l.strip()]
bad = 0
print(f"{'phase':<10} {'rows':>4} {'verdicts':<40} {'share':>6} {'job wait':>8} {'diff pp':>7} {'traced rows':>11} {'reads on after':>14}")
for phase, t in phases.items():
    start, end = t["start"], t.get("end", float("inf"))
    picked, on_at = [], None
    for r in rows:
        w = next((w for w in r["workloads"] if w["name"] == name), None)
        if w is None:
            continue
        b = r["taken_at_unix_ms"] / 1000
        a = b - (r.get("window_seconds") or 0)
        io = (r.get("probes") or {}).get("io_tracing") or {}
        if on_at is None and start <= b <= end and io.get("state") == "on" and (w.get("stalls") or {}).get("io_traced"):
            on_at = b - start
        if a < start + skip or b > end or not w.get("verdict"):
            continue
        # The job's own time in the window: each step's wait and compute intervals cut to it
        # (a 1-s window holds few whole steps, and whole steps alone favour the short ones).
        wait = comp = 0.0
        for s in steps:
            w0, w1 = s["t_start"], s["t_start"] + s["data_wait_s"]
            c1 = w1 + s["compute_s"]
            wait += max(0.0, min(b, w1) - max(a, w0))
            comp += max(0.0, min(b, c1) - max(a, w1))
        if wait + comp == 0:
            continue
        picked.append((w["verdict"]["kind"], w["verdict"]["input_bound_share"], wait / (wait + comp),
                       bool((w.get("stalls") or {}).get("io_traced"))))
    if not picked:
        print(f"{phase:<10} no rows"); bad += 1; continue
    kinds = {}
    for k, *_ in picked:
        kinds[k] = kinds.get(k, 0) + 1
    top = max(kinds, key=kinds.get)
    share = sum(p[1] for p in picked) / len(picked)
    frac = sum(p[2] for p in picked) / len(picked)
    diff = abs(share - frac) * 100
    ok = top == EXPECTED.get(phase) and diff <= 5
    bad += not ok
    traced = sum(p[3] for p in picked)
    print(f"{phase:<10} {len(picked):>4} {json.dumps(kinds):<40} {share:>6.3f} {frac:>8.3f} {diff:>7.1f} {traced:>5}/{len(picked):<5} {'-' if on_at is None else f'{on_at:.1f} s':>14} {'ok' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
