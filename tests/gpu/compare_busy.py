"""Checks gpuwatch's busy shares against the device's own series and the jobs' own GPU time.

    python3 compare_busy.py util.json record.csv [--job NAME=jobs/X.tag.json --per-matmul S ...]

Per 1-s row of a `gpuwatch record` CSV: the GPU row's busy against the mean of the device series
(util_recorder.py) over the same second, and each named workload's busy against its job's own
GPU time in that second (matmuls done × the GPU time of one). Prints the rows and the worst
differences; exits 1 when a GPU row is off by more than 5 points or a job's part by more than 10."""
import argparse
import csv
import json

ap = argparse.ArgumentParser()
ap.add_argument("util")
ap.add_argument("record")
ap.add_argument("--job", action="append", default=[], help="workload name=job result json")
ap.add_argument("--per-matmul", type=float, default=None, help="GPU seconds per matmul")
a = ap.parse_args()
series = json.load(open(a.util))


def device(t0, t1):
    v = [p for ts, p in series if t0 < ts / 1e6 <= t1]
    return sum(v) / len(v) / 100 if v else None


jobs = {}
for spec in a.job:
    name, path = spec.split("=", 1)
    jobs[name] = json.load(open(path))


def job_share(job, t0, t1):
    marks = job.get("marks") or []
    inside = [n for t, n in marks if t0 <= t <= t1]
    if len(inside) < 2 or a.per_matmul is None:
        return None
    return (inside[-1] - inside[0]) * a.per_matmul / (t1 - t0)


rows = list(csv.DictReader(open(a.record)))
worst, worst_job, n = 0.0, {}, 0
print(f"{'t':>6} {'gpu busy':>8} {'device':>7} " + " ".join(f"{k:>10} {'own':>6}" for k in jobs))
t_first = None
for r in rows:
    if r["record"] != "gpu" or not r["gpu_busy_fraction"]:
        continue
    t1 = int(r["unix_ms"]) / 1000
    t0 = t1 - 1.0
    t_first = t_first or t1
    d = device(t0, t1)
    b = float(r["gpu_busy_fraction"])
    line = f"{t1 - t_first:>6.1f} {b:>8.3f} {'-' if d is None else f'{d:.3f}':>7} "
    if d is not None:
        worst = max(worst, abs(b - d))
        n += 1
    for name, job in jobs.items():
        w = next((x for x in rows if x["record"] == "workload" and x["unix_ms"] == r["unix_ms"] and x["workload_name"] == name), None)
        wb = float(w["gpu_busy_fraction"]) if w and w["gpu_busy_fraction"] else None
        own = job_share(job, t0, t1)
        if wb is not None and own is not None:
            worst_job[name] = max(worst_job.get(name, 0.0), abs(wb - own))
        line += f"{'-' if wb is None else f'{wb:.3f}':>10} {'-' if own is None else f'{own:.3f}':>6} "
    print(line)
print(f"{n} rows; worst |gpu busy - device| {worst * 100:.1f} pp; " + ", ".join(f"worst |{k} - own| {v * 100:.1f} pp" for k, v in worst_job.items()))
# Targets: the GPU's busy share within 5 pp of the device's own series in every row, each
# job's part within 10 pp of its own GPU time.
missed = n == 0 or worst > 0.05 or any(v > 0.10 for v in worst_job.values())
raise SystemExit(1 if missed else 0)
