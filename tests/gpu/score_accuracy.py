"""Scores `gpuwatch record` rows against jobs that time themselves (tests/gpu/accuracy.sh).

    python3 score_accuracy.py OUT_DIR SCENARIO...

For each scenario: the rows of its workload (cgroup /gw-acc-SCENARIO) whose 1-s window lies in
one of its phases after the first SKIP seconds (steady rows), each row's verdict against the
phase's label, and the verdict's share against the job's own share over the row's window
(each step's time split in the proportions the job measured). Prints the confusion matrix
(label x verdict, rows), a table per scenario, and the SageMaker Debugger rules
(awslabs/sagemaker-debugger, smdebug/profiler/analysis/rules: CPUBottleneck, IOBottleneck,
LowGPUUtilization, their default thresholds) scored on the same seconds from the device's
utilisation and the host's CPU (tests/gpu/host_stats.py). Exits 1 when a target is missed."""
import json
import re
import sys
from collections import Counter, defaultdict

out, scenarios = sys.argv[1], sys.argv[2:]
SKIP = 5.0
LOADER = {"loader_io": "input-bound: I/O", "loader_cpu": "input-bound: CPU", "quota": "input-bound: CPU"}
# The share each label is judged on: (the verdict's field, the job's own field).
SHARE = {
    "host-bound: transfers": ("host_bound_share", "copy_s"),
    "host-bound: CPU": ("host_bound_share", "cpu_s"),
    "host-bound: launches": ("host_bound_share", "cpu_s"),
    "host-bound: sync": ("host.sync_share", "sync_s"),
    "input-bound: I/O": ("input_bound_share", "data_wait_s"),
    "input-bound: CPU": ("input_bound_share", "data_wait_s"),
}
rows = [json.loads(l) for l in open(f"{out}/record.jsonl") if l.strip()]
try:
    host = json.load(open(f"{out}/host_stats.json"))
except (OSError, ValueError):
    host = []


def field(v, path):
    for k in path.split("."):
        v = (v or {}).get(k)
    return v


def phases(scenario):
    found = {}
    for line in open(f"{out}/job_{scenario}.log"):
        m = re.match(r"phase (.+) (start|end) ([\d.]+)$", line.strip())
        if m:
            found.setdefault(m[1], {})[m[2]] = float(m[3])
    return [(LOADER.get(scenario, name), t["start"], t.get("end", float("inf"))) for name, t in found.items()]


def steps(scenario):
    """(start, length, {component: seconds}) of each step."""
    out_steps = []
    for s in json.load(open(f"{out}/truth_{scenario}.json"))["steps"]:
        if "t_start" in s:  # loader_job.py
            d = s["data_wait_s"] + s["compute_s"]
            out_steps.append((s["t_start"], d, {"data_wait_s": s["data_wait_s"]}))
        else:
            out_steps.append((s["t"], s["d"], s))
    return out_steps


def own_share(st, a, b, key):
    """The job's own share of [a, b] spent on `key`."""
    num = den = 0.0
    for t, d, parts in st:
        o = max(0.0, min(b, t + d) - max(a, t))
        if o > 0 and d > 0:
            num += o * parts.get(key, 0.0) / d
            den += o
    return num / den if den else None


def cpu_at(t):
    best = None
    for h in host:
        if h[0] <= t + 0.5:
            best = h
    return best


confusion = defaultdict(Counter)
table, misses, sagemaker = [], [], []
for s in scenarios:
    st = steps(s)
    name = f"/gw-acc-{s}"
    for label, start, end in phases(s):
        picked = []
        for r in rows:
            w = next((w for w in r["workloads"] if w["name"] == name), None)
            if not w or not w.get("verdict"):
                continue
            b = r["taken_at_unix_ms"] / 1000
            a = b - (r.get("window_seconds") or 0)
            if a < start + SKIP or b > end:
                continue
            v = w["verdict"]
            share = own = None
            if label in SHARE:
                share = field(v, SHARE[label][0])
                own = own_share(st, a, b, SHARE[label][1])
            gpu = field(r["gpus"][0], "busy.fraction") if r.get("gpus") else None
            picked.append({"kind": v["kind"], "share": share, "own": own,
                           "traced": bool(field(w, "cuda.traced")), "gpu": gpu, "a": a, "b": b})
        kinds = Counter(p["kind"] for p in picked)
        for k, n in kinds.items():
            confusion[label][k] += n
        right = kinds[label] / len(picked) if picked else 0.0
        pairs = [(p["share"], p["own"]) for p in picked if p["share"] is not None and p["own"] is not None]
        err = (sum(x for x, _ in pairs) / len(pairs) - sum(y for _, y in pairs) / len(pairs)) * 100 if pairs else None
        mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
        table.append((s, label, len(picked), right, kinds.most_common(2), mean([x for x, _ in pairs]),
                      mean([y for _, y in pairs]), err, sum(p["traced"] for p in picked)))
        # targets
        need = 0.9 if label.startswith("host-bound") else 0.5
        if s == "pinned":
            ok = picked and kinds.most_common(1)[0][0] != "host-bound: transfers"
        else:
            ok = bool(picked) and right >= need
        tol = 10.0 if label.startswith("host-bound") else 5.0
        judged = {"host-bound: transfers", "input-bound: I/O", "input-bound: CPU"}
        if err is not None and label in judged and abs(err) > tol:
            ok = False
        if label.startswith("host-bound") and (kinds["GPU-bound"] or kinds["idle"]):
            ok = False
        if not ok:
            misses.append(f"{s} ({label})")
        # SageMaker Debugger rules over the same seconds
        cpu_pts = io_pts = 0
        utils = []
        for p in picked:
            if p["gpu"] is None:
                continue
            u = p["gpu"] * 100
            utils.append(u)
            h = cpu_at(p["b"])
            if h and u < 10 and max(h[1]) > 90:
                cpu_pts += 1
            if h and u < 10 and h[2] > 50:
                io_pts += 1
        fired = []
        if utils:
            n = len(utils)
            if cpu_pts / n * 100 > 50:
                fired.append("CPUBottleneck")
            if io_pts / n * 100 > 50:
                fired.append("IOBottleneck")
            q = sorted(utils)
            p95, p5 = q[min(n - 1, int(0.95 * (n - 1) + 0.5))], q[int(0.05 * (n - 1) + 0.5)]
            if p95 < 70 or (p95 > 70 and p5 < 10):
                fired.append("LowGPUUtilization")
        sagemaker.append((s, label, len(utils), cpu_pts, io_pts, fired))

labels = sorted(confusion)
kinds = sorted({k for c in confusion.values() for k in c})
print("\n## Confusion matrix (steady 1-s rows; rows: the job's label, columns: gpuwatch's verdict)\n")
print("| label \\ verdict | " + " | ".join(kinds) + " |")
print("|---" * (len(kinds) + 1) + "|")
for l in labels:
    print(f"| {l} | " + " | ".join(str(confusion[l][k] or "") for k in kinds) + " |")
print("\n## Per scenario\n")
print("| scenario | label | rows | right | verdicts | gpuwatch share | job's share | error pp | CUDA-traced rows |")
print("|---|---|---|---|---|---|---|---|---|")
for s, label, n, right, top, share, own, err, traced in table:
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    e = "-" if err is None else f"{err:+.1f}"
    print(f"| {s} | {label} | {n} | {right:.0%} | {', '.join(f'{k} {c}' for k, c in top)} | {f(share)} | {f(own)} | {e} | {traced}/{n} |")
print("\n## SageMaker Debugger rules on the same seconds (defaults: GPU < 10 % with a core > 90 %, or with I/O wait > 50 %, in more than 50 % of points; p95 < 70 % or p95 > 70 % with p5 < 10 %)\n")
print("| scenario | label | points | CPUBottleneck points | IOBottleneck points | rules fired |")
print("|---|---|---|---|---|---|")
for s, label, n, c, i, fired in sagemaker:
    print(f"| {s} | {label} | {n} | {c} | {i} | {', '.join(fired) or 'none'} |")
print()
print("targets missed: " + (", ".join(misses) if misses else "none"))
sys.exit(1 if misses else 0)
