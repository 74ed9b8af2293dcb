"""Scores the three agents' rows of tests/gpu/real_loops.sh against the jobs' own timing.

    python3 score_real_loops.py OUT_DIR SCENARIO...

For each mode (default, cuda_off, no_ebpf: OUT_DIR/MODE.jsonl) and scenario: the rows of its
container (gw-rl-SCENARIO) whose 1-s window lies in one of its phases after the first SKIP
seconds (steady rows; a `warmup` phase is scored from its start), each row's verdict against
the phase's label, and the verdict's share against the job's own over the row's window.
Prints a confusion matrix per mode and a table per scenario; exits 1 when a target is missed:
- default mode: every scenario right in >= 90 % of its steady rows, shares within 5 pp;
- the default never right less often than the CUDA probes off;
- no `idle` row but for the idle job (a warm-up's threads are busy), no `GPU-bound` row for a
  step that spends more than half its time copying.
"""
import json
import re
import sys
from collections import Counter, defaultdict

out = "."  # the run's folder (main() sets it; replay_fixture.py too)
MODES = ["default", "cuda_off", "no_ebpf"]
SKIP = 5.0
# The share each label is judged on: (the verdict's field, the job's own field).
SHARE = {
    "host-bound: transfers": ("host_bound_share", "copy_s"),
    "host-bound: CPU": ("host_bound_share", "host_idle_s"),
    "host-bound: launches": ("host_bound_share", "cpu_s"),
    "host-bound: sync": ("host.sync_share", "sync_s"),
    "input-bound: I/O": ("input_bound_share", "data_wait_s"),
    "input-bound: CPU": ("input_bound_share", "data_wait_s"),
}


def field(v, path):
    for k in path.split("."):
        v = (v or {}).get(k)
    return v


def load_rows(mode):
    try:
        return [json.loads(l) for l in open(f"{out}/{mode}.jsonl") if l.strip()]
    except OSError:
        return []


def phases(s):
    found = {}
    try:
        for line in open(f"{out}/job_{s}.log"):
            m = re.match(r"phase (.+) (start|end) ([\d.]+)$", line.strip())
            if m:
                found.setdefault(m[1], {})[m[2]] = float(m[3])
    except OSError:
        pass
    return [(name, t["start"], t.get("end", float("inf"))) for name, t in found.items() if "start" in t]


def steps(s):
    try:
        return [(st["t"], st["d"], st) for st in json.load(open(f"{out}/truth_{s}.json"))["steps"]]
    except (OSError, ValueError, KeyError):
        return []


def own_share(st, a, b, key):
    num = den = 0.0
    for t, d, parts in st:
        if key not in parts and key == "host_idle_s":
            key = "cpu_s"  # a job without its kernel time: its own section
        o = max(0.0, min(b, t + d) - max(a, t))
        if o > 0 and d > 0:
            num += o * parts.get(key, 0.0) / d
            den += o
    return num / den if den else None


def score(mode, rows, scenarios):
    confusion = defaultdict(Counter)
    table = {}
    for s in scenarios:
        st = steps(s)
        name = f"gw-rl-{s}"
        for label, start, end in phases(s):
            picked = []
            skip = 0.0 if label == "warmup" else SKIP
            for r in rows:
                w = next((w for w in r["workloads"] if w["name"] == name), None)
                if not w or not w.get("verdict"):
                    continue
                b = r["taken_at_unix_ms"] / 1000
                a = b - (r.get("window_seconds") or 0)
                if a < start + skip or b > end:
                    continue
                v = w["verdict"]
                share = own = None
                if label in SHARE:
                    share = field(v, SHARE[label][0])
                    own = own_share(st, a, b, SHARE[label][1])
                copying = own_share(st, a, b, "copy_s") or 0.0
                picked.append({"kind": v["kind"], "share": share, "own": own, "copying": copying,
                               "traced": bool(field(w, "cuda.traced"))})
            kinds = Counter(p["kind"] for p in picked)
            for k, n in kinds.items():
                confusion[label][k] += n
            pairs = [(p["share"], p["own"]) for p in picked if p["share"] is not None and p["own"] is not None]
            mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
            table[(s, label)] = {
                "rows": len(picked),
                "right": kinds[label] / len(picked) if picked else 0.0,
                "kinds": kinds,
                "share": mean([x for x, _ in pairs]),
                "own": mean([y for _, y in pairs]),
                "traced": sum(p["traced"] for p in picked),
                "idle_rows": kinds["idle"] if label != "idle" else 0,
                "gpu_bound_copying": sum(1 for p in picked if p["kind"] == "GPU-bound" and p["copying"] > 0.5),
            }
    return confusion, table


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def main():
    global out
    out, scenarios = sys.argv[1], sys.argv[2:]
    results = {m: score(m, load_rows(m), scenarios) for m in MODES}
    misses = []
    for mode in MODES:
        confusion, table = results[mode]
        labels = sorted(confusion)
        kinds = sorted({k for c in confusion.values() for k in c})
        print(f"\n## {mode}: confusion matrix (steady 1-s rows; rows: the job's label, columns: the verdict)\n")
        print("| label \\ verdict | " + " | ".join(kinds) + " |")
        print("|---" * (len(kinds) + 1) + "|")
        for l in labels:
            print(f"| {l} | " + " | ".join(str(confusion[l][k] or "") for k in kinds) + " |")
        print(f"\n## {mode}: per scenario\n")
        print("| scenario | label | rows | right | verdicts | gpuwatch share | job's share | error pp | CUDA-traced rows |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (s, label), t in table.items():
            err = None if t["share"] is None or t["own"] is None else (t["share"] - t["own"]) * 100
            top = ", ".join(f"{k} {c}" for k, c in t["kinds"].most_common(3))
            e = "-" if err is None else f"{err:+.1f}"
            print(f"| {s} | {label} | {t['rows']} | {t['right']:.0%} | {top} | {fmt(t['share'])} | {fmt(t['own'])} | {e} | {t['traced']}/{t['rows']} |")
            if t["idle_rows"]:
                misses.append(f"{mode}: {s} ({label}) read idle in {t['idle_rows']} rows")
            if t["gpu_bound_copying"]:
                misses.append(f"{mode}: {s} GPU-bound in {t['gpu_bound_copying']} rows copying > 50 %")
            if mode != "default" or label == "warmup":
                continue
            if t["rows"] == 0 or t["right"] < 0.9:
                misses.append(f"default: {s} ({label}) right in {t['right']:.0%} of {t['rows']} rows")
            if err is not None and abs(err) > 5.0:
                misses.append(f"default: {s} ({label}) share {err:+.1f} pp")
            off = results["cuda_off"][1].get((s, label))
            if off and off["rows"] and t["right"] < off["right"]:
                misses.append(f"default worse than cuda_off on {s}: {t['right']:.0%} < {off['right']:.0%}")
    print()
    print("targets missed:\n- " + "\n- ".join(misses) if misses else "targets missed: none")
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
