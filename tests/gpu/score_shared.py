"""Shared-GPU rows of `gpuwatch record --format jsonl` against the duty jobs' own GPU time.

    python3 score_shared.py RECORD.jsonl JOBS_DIR TAG NAME=JOB [NAME=JOB ...]

NAME is a container's name, JOB the duty_job.py name whose JOBS_DIR/JOB.TAG.json holds its
marks (matmuls done at each 200-ms period's start) and the solo time of one matmul. Per steady
1-s row (2 s after the jobs start, 1 s before they end): each container's part against its own
GPU time in the row's window (matmuls done x solo time), the parts' sum against the device's
busy share, and the verdict. Prints one line per container and the sum check; exits 1 when a
part is off by more than 10 points on average or a row's parts miss the device by more than 2."""
import bisect
import json
import sys

rec, jobs_dir, tag = sys.argv[1:4]
pairs = [a.split("=", 1) for a in sys.argv[4:]]
jobs = {name: json.load(open(f"{jobs_dir}/{job}.{tag}.json")) for name, job in pairs}
rows = [json.loads(l) for l in open(rec) if l.strip()]
t0 = max(j["t_start"] for j in jobs.values()) + 2
t1 = min(j["t_end"] for j in jobs.values()) - 1


def done_at(job, t):
    """Matmuls done by time t, linear between marks."""
    ts = [m[0] for m in job["marks"]]
    i = bisect.bisect_right(ts, t)
    if i == 0:
        return job["marks"][0][1]
    if i == len(ts):
        return job["marks"][-1][1]
    (ta, na), (tb, nb) = job["marks"][i - 1], job["marks"][i]
    return na + (nb - na) * (t - ta) / (tb - ta)


stats = {name: {"rows": 0, "part": 0.0, "own": 0.0, "abs": 0.0, "max": 0.0, "kinds": {}, "driver_abs": 0.0, "driver_rows": 0} for name in jobs}


def driver_parts(r, by_name, device):
    """The other split, for comparison: the driver's per-process SM figures, normalised to the
    device's busy share; None when it credited nobody."""
    procs = r["gpus"][0].get("processes") or []
    pct = {}
    for name in jobs:
        wid = by_name[name].get("id")
        pct[name] = sum(p.get("driver_sm_percent") or 0 for p in procs if p.get("workload") == wid)
    total = sum(pct.values())
    if not total or device is None:
        return None
    return {n: device * v / total for n, v in pct.items()}
sum_max, steady = 0.0, 0
for r in rows:
    b = r["taken_at_unix_ms"] / 1000
    a = b - (r.get("window_seconds") or 0)
    if a < t0 or b > t1:
        continue
    by_name = {w["name"]: w for w in r["workloads"]}
    if not all(n in by_name for n in jobs):
        continue
    parts, device = [], None
    for name, job in jobs.items():
        share = by_name[name]["gpu"]["per_gpu"][0]
        part = share.get("busy_fraction")
        device = share.get("device_busy_fraction")
        if part is None:
            continue
        own = (done_at(job, b) - done_at(job, a)) * job["solo_matmul_s"] / (b - a)
        s = stats[name]
        s["rows"] += 1
        s["part"] += part
        s["own"] += own
        s["abs"] += abs(part - own)
        s["max"] = max(s["max"], abs(part - own))
        kind = (by_name[name].get("verdict") or {}).get("kind", "-")
        s["kinds"][kind] = s["kinds"].get(kind, 0) + 1
        parts.append(part)
    drv = driver_parts(r, by_name, device)
    if drv is not None:
        for name, job in jobs.items():
            own = (done_at(job, b) - done_at(job, a)) * job["solo_matmul_s"] / (b - a)
            stats[name]["driver_abs"] += abs(drv[name] - own)
            stats[name]["driver_rows"] += 1
    if device is not None and len(parts) == len(jobs):
        steady += 1
        sum_max = max(sum_max, abs(sum(parts) - device))
bad = False
print(f"{'container':<22} {'rows':>4} {'part':>6} {'own':>6} {'mean |err| pp':>13} {'max pp':>6} {'driver split pp':>15}  verdicts")
for name, s in stats.items():
    n = max(s["rows"], 1)
    mean_err = s["abs"] / n * 100
    bad |= s["rows"] == 0 or mean_err > 10
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["kinds"].items(), key=lambda kv: -kv[1]))
    drv = f"{s['driver_abs'] / s['driver_rows'] * 100:.1f} ({s['driver_rows']})" if s["driver_rows"] else "-"
    print(f"{name:<22} {s['rows']:>4} {s['part'] / n:>6.3f} {s['own'] / n:>6.3f} {mean_err:>13.1f} {s['max'] * 100:>6.1f} {drv:>15}  {kinds}")
print(f"steady rows {steady}: parts vs device busy, worst row {sum_max * 100:.2f} pp")
bad |= steady == 0 or sum_max > 0.02
sys.exit(1 if bad else 0)
